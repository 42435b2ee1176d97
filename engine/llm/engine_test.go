package llm

import (
	"errors"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
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
			want: []string{"cache.kv_cache_dtype fp8", "F8_E4M3", "gqa cache got F16", "device: cuda", "GEMM mode round", "BF16 or F16 weights", "GQA model"},
		},
		{
			name: "fp8 on float32 caches", dtype: "fp8_e4m3", spec: gqa(kernels.F32),
			want: []string{"cache.kv_cache_dtype fp8_e4m3", "gqa cache got F32", "device: cuda"},
		},
		{
			name: "fp8 on an MLA model", dtype: "fp8", spec: mla,
			want: []string{"cache.kv_cache_dtype fp8", "mla cache got BF16", "MLA models such as DeepSeek keep their latent cache"},
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

// TestNewRefusesFP8OnFloat32Caches builds an engine whose config asks for
// fp8 caches from the CPU backend (bypassing Validate, which refuses it):
// the model loads with float32 caches and New fails with the config error
// instead of quietly running in float32.
func TestNewRefusesFP8OnFloat32Caches(t *testing.T) {
	cfg := tinyConfig(t, tinyLlama(t), nil)
	cfg.Cache.KVCacheDType = "fp8"
	e, err := New(cfg, Options{})
	if err == nil {
		e.Close()
		t.Fatal("New succeeded")
	}
	if !errors.Is(err, config.ErrInvalid) {
		t.Errorf("error %v does not wrap config.ErrInvalid", err)
	}
	for _, w := range []string{"cache.kv_cache_dtype fp8", "cache got F32", "device: cuda"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	// The default (auto) builds from the same model.
	e, err = New(tinyConfig(t, cfg.Model, nil), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
}
