package llm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/ggufwrite"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

func TestCheckKVCacheDType(t *testing.T) {
	gqa := func(dt kernels.DType) models.KVCacheSpec {
		return models.KVCacheSpec{Layout: models.KVLayoutGQA, NumLayers: 2, Width: 64, DType: dt}
	}
	mla := models.KVCacheSpec{Layout: models.KVLayoutMLA, NumLayers: 2, Width: 96, DType: kernels.BF16}
	tests := []struct {
		name  string
		dtype string
		spec  models.KVCacheSpec
		want  []string // substrings of the error; none means no error
	}{
		{name: "auto takes float32", dtype: "auto", spec: gqa(kernels.F32)},
		{name: "empty takes half", dtype: "", spec: gqa(kernels.F16)},
		{name: "auto takes fp8", dtype: "auto", spec: gqa(kernels.F8E4M3)},
		{name: "fp8 got fp8", dtype: "fp8", spec: gqa(kernels.F8E4M3)},
		{name: "fp8_e4m3 got fp8", dtype: "fp8_e4m3", spec: gqa(kernels.F8E4M3)},
		{
			name: "fp8 got half", dtype: "fp8", spec: gqa(kernels.F16),
			want: []string{"cache.kv_cache_dtype fp8", "F8_E4M3", "gqa cache got F16", "GQA model", "kv_cache_dtype: auto"},
		},
		{
			name: "fp8 on float32 caches", dtype: "fp8_e4m3", spec: gqa(kernels.F32),
			want: []string{"cache.kv_cache_dtype fp8_e4m3", "gqa cache got F32"},
		},
		{name: "f16 got half", dtype: "f16", spec: gqa(kernels.F16)},
		{
			name: "f16 on float32 caches", dtype: "f16", spec: gqa(kernels.F32),
			want: []string{"cache.kv_cache_dtype f16", "F16", "gqa cache got F32", "f16 needs the CPU backend (GQA and MLA models)"},
		},
		{
			name: "fp8 on an MLA model", dtype: "fp8", spec: mla,
			want: []string{"cache.kv_cache_dtype fp8", "mla cache got BF16", "MLA models such as DeepSeek keep a float32 or f16 latent cache"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkKVCacheDType(config.Cache{KVCacheDType: tc.dtype}, tc.spec)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Errorf("error %v does not wrap config.ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// An fp8 cache asked of an MLA model (the shipped DeepSeek-architecture
// model, whose latent cache stays float32) fails New with the config error
// instead of quietly running in float32; the same model builds with auto,
// or with f16 (a half latent cache), and a GQA model gets its 8-bit (or,
// with f16, 16-bit) caches on the CPU backend.
func TestNewRefusesFP8OnLatentCaches(t *testing.T) {
	mla := filepath.Join("..", "assets", "deepseek-tiny")
	cfg := tinyConfig(t, mla, func(c *config.Config) { c.Cache.KVCacheDType = "fp8" })
	e, err := New(cfg, Options{})
	if err == nil {
		e.Close()
		t.Fatal("New succeeded")
	}
	if !errors.Is(err, config.ErrInvalid) {
		t.Errorf("error %v does not wrap config.ErrInvalid", err)
	}
	for _, w := range []string{"cache.kv_cache_dtype fp8", "mla cache got F32", "MLA models"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	for _, c := range []struct {
		dir, dtype string
		want       kernels.DType
	}{{mla, "auto", kernels.F32}, {mla, "f16", kernels.F16}, {tinyLlama(t), "fp8", kernels.F8E4M3}, {tinyLlama(t), "f16", kernels.F16}} {
		e, err := New(tinyConfig(t, c.dir, func(cfg *config.Config) { cfg.Cache.KVCacheDType = c.dtype }), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Model().KVCacheSpec().DType; got != c.want {
			t.Errorf("%s with kv_cache_dtype %s: cache %v, want %v", c.dir, c.dtype, got, c.want)
		}
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	}
}

// Close lets the loop finish every request it holds (an engine that runs
// on its own) and answers what a Step-driven engine still holds with an
// error; either way it returns, and every request gets its last output.
func TestCloseAnswersEveryRequest(t *testing.T) {
	dir := tinyLlama(t)
	for _, manual := range []bool{false, true} {
		t.Run(fmt.Sprint("manual=", manual), func(t *testing.T) {
			e, err := New(tinyConfig(t, dir, nil), Options{ManualSteps: manual})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			finished := map[string]engine.RequestOutput{}
			for i, p := range prompts(6) {
				id := fmt.Sprint(i)
				err := e.AddRequest(&engine.Request{ID: id, PromptTokenIDs: p.IDs, Params: greedy(5), OnOutput: func(o engine.RequestOutput) {
					if o.Finished {
						mu.Lock()
						finished[id] = o
						mu.Unlock()
					}
				}})
				if err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := e.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown = %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(finished) != 6 {
				t.Fatalf("%d of 6 requests got a last output", len(finished))
			}
			for id, o := range finished {
				if manual && o.FinishReason != engine.FinishError {
					t.Errorf("request %s of a Step-driven engine: %v, want an error", id, o.FinishReason)
				}
				if !manual && o.FinishReason != engine.FinishLength {
					t.Errorf("request %s: %v (%v), want it served to its length", id, o.FinishReason, o.Err)
				}
			}
			if err := e.AddRequest(&engine.Request{ID: "late", PromptTokenIDs: []int{1, 2}, Params: greedy(2)}); !errors.Is(err, ErrClosed) {
				t.Errorf("AddRequest after Close = %v, want ErrClosed", err)
			}
		})
	}
}

// cpu.simd picks the CPU kernels' inner loops; the backend's name says
// which ran.
func TestCPUSIMDSetting(t *testing.T) {
	dir := tinyLlama(t)
	e, err := New(tinyConfig(t, dir, func(c *config.Config) { c.CPU.SIMD = "go" }), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if name := e.Backend().Name(); !strings.Contains(name, "go") {
		t.Errorf("backend %q: want the pure-Go path", name)
	}
}

// TestCPUKVCacheDType: under auto a model directory keeps float32 K/V
// caches on the CPU and a GGUF file gets IEEE half, llama.cpp's default;
// a type asked for is kept either way.
func TestCPUKVCacheDType(t *testing.T) {
	for _, tc := range []struct {
		kv   kernels.DType
		gguf bool
		want kernels.DType
	}{
		{0, false, 0},
		{0, true, kernels.F16},
		{kernels.F32, true, kernels.F32},
		{kernels.F32, false, kernels.F32},
		{kernels.F16, false, kernels.F16},
		{kernels.F8E4M3, true, kernels.F8E4M3},
	} {
		if got := CPUKVCacheDType(tc.kv, tc.gguf); got != tc.want {
			t.Errorf("cache.kv_cache_dtype %v, GGUF %v: %v, want %v", tc.kv, tc.gguf, got, tc.want)
		}
	}
}

// TestCPUActivations: every cpu.activation_rounding the config accepts
// maps to its CPU backend mode; auto (and the empty default) to llama.cpp's
// rounding for GGUF quantized weights on a model directory, and for a GGUF
// file also to bfloat16 activations meeting its BF16 weights, as llama.cpp
// multiplies them.
func TestCPUActivations(t *testing.T) {
	for _, tc := range []struct {
		rounding string
		gguf     bool
		want     cpu.ActRounding
	}{
		{"", false, cpu.ActLlamaCppQuantized},
		{"auto", false, cpu.ActLlamaCppQuantized},
		{"", true, cpu.ActBF16},
		{"auto", true, cpu.ActBF16},
		{"none", false, cpu.ActFloat32},
		{"none", true, cpu.ActFloat32},
		{"llama_cpp", false, cpu.ActLlamaCpp},
		{"llama_cpp", true, cpu.ActLlamaCpp},
		{"bf16", false, cpu.ActBF16},
		{"bf16", true, cpu.ActBF16},
	} {
		if got := CPUActivations(tc.rounding, tc.gguf); got != tc.want {
			t.Errorf("cpu.activation_rounding %q, GGUF %v: mode %d, want %d", tc.rounding, tc.gguf, got, tc.want)
		}
	}
}

// A GGUF file's K/V caches are IEEE half under cache.kv_cache_dtype auto
// on the CPU (llama.cpp's default) and float32 when f32 is asked for; the
// model directory it was written from keeps float32 under auto.
func TestGGUFKVCacheDefault(t *testing.T) {
	// A random Llama with the shipped model's tokenizer, which GGUF metadata holds.
	dir := t.TempDir()
	if err := random.WriteLlamaWithTokenizer(dir, random.SmallLlama(8192), 7, filepath.Join("..", "assets", "deepseek-tiny")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := ggufwrite.Write(&buf, dir, "", "f32"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model, dtype string
		want         kernels.DType
	}{{file, "auto", kernels.F16}, {file, "f32", kernels.F32}, {file, "f16", kernels.F16}, {dir, "auto", kernels.F32}} {
		e, err := New(tinyConfig(t, c.model, func(cfg *config.Config) { cfg.Cache.KVCacheDType = c.dtype }), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Model().KVCacheSpec().DType; got != c.want {
			t.Errorf("%s with kv_cache_dtype %s: cache %v, want %v", filepath.Base(c.model), c.dtype, got, c.want)
		}
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	}
}
