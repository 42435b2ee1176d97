package models

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// fp8Config is cfg with an fp8 quantization_config of the given block.
func fp8Config(t testing.TB, js string, block [2]int) *weights.Config {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	m["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
		"weight_block_size": block[:]}
	data, _ := json.Marshal(m)
	return parseConfig(t, string(data))
}

// promptLogits runs one prefill of ids and returns its logits.
func promptLogits(t testing.TB, m Model, ids []int32) [][]float32 {
	t.Helper()
	cache, err := m.NewKVCache(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	table := []int32{3, 1, 4, 0, 5, 9, 2, 6}
	got, _ := step(t, m, cache, seqStep{ids, 0, table[:(len(ids)+3)/4]})
	return got
}

// TestFP8Checkpoint: a model loaded from an FP8 checkpoint (written here
// from a random BF16 one) computes what the model of its dequantized
// float32 weights computes, to rounding (fp8DeqBound), and stays within a
// stated bound of the BF16 model it was quantized from.
func TestFP8Checkpoint(t *testing.T) {
	ops := newBackend(t, 2)
	r := rand.New(rand.NewPCG(11, 12))
	for _, name := range []string{"llama", "qwen3", "deepseek-v2", "deepseek-v3", "qwen3-moe", "mixtral"} {
		for _, block := range [][2]int{{16, 16}, {128, 128}} {
			t.Run(fmt.Sprintf("%s/block%dx%d", name, block[0], block[1]), func(t *testing.T) {
				cfg := parseConfig(t, tinyConfigs[name])
				bf16, err := RandomWeights(cfg, kernels.BF16, 21)
				if err != nil {
					t.Fatal(err)
				}
				fp8 := QuantizeFP8(bf16, block)
				fcfg := fp8Config(t, tinyConfigs[name], block)
				opts := Options{MaxModelLen: testMaxLen}
				mf, err := Builtin().New(ops, fcfg, fp8, opts)
				if err != nil {
					t.Fatal(err)
				}
				if f := WeightFormat(mf); !strings.Contains(f, "F8_E4M3") {
					t.Errorf("WeightFormat = %q, want F8_E4M3 in it", f)
				}
				md, err := Builtin().New(ops, cfg, DequantizeFP8(fp8, block), opts)
				if err != nil {
					t.Fatal(err)
				}
				mb, err := Builtin().New(ops, cfg, bf16, opts)
				if err != nil {
					t.Fatal(err)
				}
				ids := randomIDs(r, 9, cfg.VocabSize)
				got, deq, ref := promptLogits(t, mf, ids), promptLogits(t, md, ids), promptLogits(t, mb, ids)
				worst, within := 0.0, 0
				for p := range ids {
					want64 := make([]float64, len(deq[p]))
					for i, v := range deq[p] {
						want64[i] = float64(v)
					}
					if e := relErr(got[p], want64); e > fp8DeqBound {
						t.Fatalf("position %d: FP8 logits %.3g of their largest from the dequantized model's, want <= %g", p, e, fp8DeqBound)
					}
					want := make([]float64, len(ref[p]))
					for i, v := range ref[p] {
						want[i] = float64(v)
					}
					e := relErr(got[p], want)
					worst = math.Max(worst, e)
					if e <= fp8Bound {
						within++
					}
				}
				// E4M3 keeps 3 mantissa bits: each weight moves by up to
				// 1/16 of itself, which moves these tiny models' logits by
				// 2-7% of their largest (measured). A MoE model may also
				// route a token to other experts, which moves that
				// token's logits wholesale: a third of the positions may
				// go past the bound there.
				need := len(ids)
				if cfg.NRoutedExperts > 0 {
					need = (2*len(ids) + 2) / 3
				}
				if within < need {
					t.Errorf("FP8 vs BF16 logits: %d of %d positions within max|diff|/max|ref| <= %g (worst %.3g), want %d",
						within, len(ids), fp8Bound, worst, need)
				}
				t.Logf("FP8 vs BF16: worst %.3g, %d/%d positions within %g", worst, within, len(ids), fp8Bound)
			})
		}
	}
}

// fp8Bound bounds max|FP8 logit - BF16 logit| / max|BF16 logit| of the tiny
// random models.
const fp8Bound = 0.12

// fp8DeqBound bounds max|FP8 logit - dequantized logit| / max|dequantized
// logit|: the FP8 products round each activation times its block scale
// where the dequantized model's round each weight times its scale (at most
// 6.2e-7 measured on these models).
const fp8DeqBound = 1e-5

// TestQuantizeAtLoad: Options.Quantization "fp8" over a BF16 checkpoint
// gives the model of the FP8 checkpoint quantized with 128x128 blocks, bit
// for bit.
func TestQuantizeAtLoad(t *testing.T) {
	ops := newBackend(t, 2)
	r := rand.New(rand.NewPCG(13, 14))
	for _, name := range []string{"qwen3", "deepseek-v3"} {
		t.Run(name, func(t *testing.T) {
			cfg := parseConfig(t, tinyConfigs[name])
			bf16, err := RandomWeights(cfg, kernels.BF16, 5)
			if err != nil {
				t.Fatal(err)
			}
			mq, err := Builtin().New(ops, cfg, bf16, Options{MaxModelLen: testMaxLen, Quantization: "fp8"})
			if err != nil {
				t.Fatal(err)
			}
			mf, err := Builtin().New(ops, fp8Config(t, tinyConfigs[name], [2]int{128, 128}), QuantizeFP8(bf16, [2]int{128, 128}),
				Options{MaxModelLen: testMaxLen})
			if err != nil {
				t.Fatal(err)
			}
			ids := randomIDs(r, 6, cfg.VocabSize)
			a, b := promptLogits(t, mq, ids), promptLogits(t, mf, ids)
			for p := range a {
				if !sameBits(a[p], b[p]) {
					t.Fatalf("position %d: quantized at load != FP8 checkpoint", p)
				}
			}
		})
	}
}

// TestFP8ShardedFiles loads an FP8 checkpoint from files laid out as the
// published ones: sharded, each scale in another shard than its weight,
// BF16 norms and embeddings, and an extra tensor no layer reads (logged
// once, ignored).
func TestFP8ShardedFiles(t *testing.T) {
	ops := newBackend(t, 2)
	block := [2]int{16, 16}
	js := tinyConfigs["deepseek-v3"]
	cfg := parseConfig(t, js)
	bf16, err := RandomWeights(cfg, kernels.BF16, 3)
	if err != nil {
		t.Fatal(err)
	}
	fp8 := QuantizeFP8(bf16, block)
	dir := t.TempDir()
	var cfgMap map[string]any
	_ = json.Unmarshal([]byte(js), &cfgMap)
	cfgMap["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": block[:]}
	data, _ := json.Marshal(cfgMap)
	if err := os.WriteFile(filepath.Join(dir, weights.ConfigFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	shards := [2][]weights.Tensor{}
	weightMap := map[string]string{}
	names := fp8.Names()
	for _, name := range names {
		i := 0
		if strings.HasSuffix(name, "_scale_inv") {
			i = 1
		}
		shards[i] = append(shards[i], fp8[name])
		weightMap[name] = fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)
	}
	shards[1] = append(shards[1], weights.F32Tensor("model.layers.0.self_attn.rotary_emb.inv_freq", []int{2}, []float32{1, 0.5}))
	for i, ts := range shards {
		if err := weights.WriteFile(filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)), ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	index, _ := json.Marshal(map[string]any{"weight_map": weightMap})
	if err := os.WriteFile(filepath.Join(dir, weights.IndexFile), index, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	opts := Options{MaxModelLen: testMaxLen, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	mfile, err := Builtin().Load(ops, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	mmem, err := Builtin().New(ops, fp8Config(t, js, block), fp8, Options{MaxModelLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{5, 17, 3, 90}
	a, b := promptLogits(t, mfile, ids), promptLogits(t, mmem, ids)
	for p := range a {
		if !sameBits(a[p], b[p]) {
			t.Fatalf("position %d: logits from files differ from the in-memory checkpoint", p)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var unused []string
	for _, l := range lines {
		if strings.Contains(l, "does not use") {
			unused = append(unused, l)
		}
	}
	if len(unused) != 1 || !strings.Contains(unused[0], "count=1") || !strings.Contains(unused[0], "rotary_emb.inv_freq") {
		t.Errorf("log = %q, want one line about the unused rotary_emb.inv_freq", logs.String())
	}
}

// noFP8 is a backend without FP8 kernels.
type noFP8 struct{ kernels.Ops }

func TestFP8LoadErrors(t *testing.T) {
	ops := newBackend(t, 1)
	block := [2]int{16, 16}
	js := tinyConfigs["qwen3"]
	cfg := parseConfig(t, js)
	bf16, err := RandomWeights(cfg, kernels.BF16, 3)
	if err != nil {
		t.Fatal(err)
	}
	const q = "model.layers.1.self_attn.q_proj.weight"
	for _, tc := range []struct {
		name  string
		ops   kernels.Ops
		cfg   *weights.Config
		edit  func(w MemWeights)
		opts  Options
		is    error
		wants []string
	}{
		{"scale missing", ops, fp8Config(t, js, block), func(w MemWeights) { delete(w, q+"_scale_inv") }, Options{},
			weights.ErrNotFound, []string{q + "_scale_inv"}},
		{"scale of the wrong shape", ops, fp8Config(t, js, block), func(w MemWeights) {
			w[q+"_scale_inv"] = weights.F32Tensor(q+"_scale_inv", []int{1, 1}, []float32{1})
		}, Options{}, ErrWeights, []string{q + "_scale_inv", "shape [1 1]"}},
		{"no quantization_config", ops, cfg, func(MemWeights) {}, Options{}, ErrWeights, []string{"quantization_config"}},
		{"NaN byte", ops, fp8Config(t, js, block), func(w MemWeights) {
			ten := w[q]
			ten.Data = slices.Clone(ten.Data)
			ten.Data[3] = 0x7f
			w[q] = ten
		}, Options{}, kernels.ErrDType, []string{q, "NaN"}},
		{"backend without FP8", noFP8{ops}, fp8Config(t, js, block), func(MemWeights) {}, Options{}, ErrConfig, []string{"FP8"}},
		{"unknown option", ops, cfg, nil, Options{Quantization: "int4"}, ErrConfig, []string{`"int4"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := bf16
			if tc.edit != nil {
				w = QuantizeFP8(bf16, block)
				tc.edit(w)
			}
			tc.opts.MaxModelLen = testMaxLen
			_, err := Builtin().New(tc.ops, tc.cfg, w, tc.opts)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			for _, want := range tc.wants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to mention %q", err, want)
				}
			}
		})
	}
	awq := *cfg
	awq.Quantization.Method = "awq"
	if _, err := Builtin().New(ops, &awq, bf16, Options{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "awq") {
		t.Errorf("awq checkpoint: err = %v, want ErrConfig naming it", err)
	}
}

// TestMixedDTypes: q, k and v stored in F32, BF16 and FP8 fuse into one
// F32 weight and compute what the all-F32 dequantized model computes.
func TestMixedDTypes(t *testing.T) {
	ops := newBackend(t, 1)
	block := [2]int{16, 16}
	js := tinyConfigs["llama"]
	cfg := parseConfig(t, js)
	f32, err := RandomWeights(cfg, kernels.F32, 4)
	if err != nil {
		t.Fatal(err)
	}
	bf16, err := RandomWeights(cfg, kernels.BF16, 4)
	if err != nil {
		t.Fatal(err)
	}
	fp8 := QuantizeFP8(bf16, block)
	mixed := MemWeights{}
	for name, ten := range f32 {
		mixed[name] = ten
	}
	const a = "model.layers.0.self_attn."
	mixed[a+"k_proj.weight"] = bf16[a+"k_proj.weight"]
	mixed[a+"v_proj.weight"] = fp8[a+"v_proj.weight"]
	mixed[a+"v_proj.weight_scale_inv"] = fp8[a+"v_proj.weight_scale_inv"]
	mixed[a+"o_proj.weight"] = bf16[a+"o_proj.weight"] // F16/BF16 alone keep their dtype
	want := MemWeights{}
	for name, ten := range DequantizeFP8(mixed, block) {
		if ten.DType == weights.BF16 {
			ten = weights.F32Tensor(name, ten.Shape, ten.Float32s())
		}
		want[name] = ten
	}
	mm, err := Builtin().New(ops, fp8Config(t, js, block), mixed, Options{MaxModelLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := Builtin().New(ops, cfg, want, Options{MaxModelLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{1, 2, 3, 50, 96}
	x, y := promptLogits(t, mm, ids), promptLogits(t, mw, ids)
	for p := range x {
		if !sameBits(x[p], y[p]) {
			t.Fatalf("position %d: mixed-dtype model differs from the F32 one", p)
		}
	}
	if f := WeightFormat(mm); !strings.Contains(f, "F32") || !strings.Contains(f, "BF16") {
		t.Errorf("WeightFormat = %q, want F32 and BF16 in it", f)
	}
}
