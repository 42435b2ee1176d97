package models

import (
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// fixtureDir holds the parity fixtures: <name>/{f32,bf16}/ HF model folders
// and <name>/reference.safetensors with HF transformers' outputs.
const fixtureDir = "../../testdata/models"

var fixtureNames = []string{"llama", "mistral", "qwen3", "deepseek-v2", "deepseek-v3", "qwen3-moe", "mixtral", "deepseek-v3-fp8", "qwen3-fp8"}

// fixtureVariants names the variants of the fixtures that do not have the
// usual f32 and bf16: the FP8 checkpoints, whose reference is HF in float32
// over their dequantized weights.
var fixtureVariants = map[string][]string{"deepseek-v3-fp8": {"fp8"}, "qwen3-fp8": {"fp8"}}

// parityTargets returns the fixture root, names and variants to check. The
// environment can point the same test at other folders of the same layout,
// such as real-shape models made by tools/make_fixtures.py on a larger
// machine: DEEPINFER_PARITY_DIR, DEEPINFER_PARITY_NAMES and
// DEEPINFER_PARITY_VARIANTS (comma-separated).
func parityTargets() (dir string, names, variants []string) {
	dir, names, variants = fixtureDir, fixtureNames, nil
	if v := os.Getenv("DEEPINFER_PARITY_DIR"); v != "" {
		dir = v
	}
	if v := os.Getenv("DEEPINFER_PARITY_NAMES"); v != "" {
		names = strings.Split(v, ",")
	}
	if v := os.Getenv("DEEPINFER_PARITY_VARIANTS"); v != "" {
		variants = strings.Split(v, ",")
	}
	return dir, names, variants
}

// fixtureVariantsOf returns the variants to check of fixture name: those
// the environment names, else the fixture's own.
func fixtureVariantsOf(name string, variants []string) []string {
	if variants != nil {
		return variants
	}
	if v, ok := fixtureVariants[name]; ok {
		return v
	}
	return []string{"f32", "bf16"}
}

// fixtureTolerance is the bound on max|logit - ref| / max|ref| per position.
// The FP8 checkpoints are held to the float32 bound: their reference runs
// the dequantized weights in float32.
var fixtureTolerance = map[string]float64{"f32": 1e-4, "bf16": 1e-2, "fp8": 1e-4}

type fixtureRef struct {
	f *weights.File
	t *testing.T
}

func (r fixtureRef) has(name string) bool { return r.f.Has(name) }

func (r fixtureRef) ints(name string) []int32 {
	ten, err := r.f.Tensor(name)
	if err != nil {
		r.t.Fatal(err)
	}
	v, err := ten.Ints()
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// rows returns a 2-D F32 reference tensor as float64 rows.
func (r fixtureRef) rows(name string) [][]float64 {
	ten, err := r.f.Tensor(name)
	if err != nil {
		r.t.Fatal(err)
	}
	v := f64(ten.Float32s())
	n := ten.Shape[len(ten.Shape)-1]
	var out [][]float64
	for i := 0; i < len(v); i += n {
		out = append(out, v[i:i+n])
	}
	return out
}

// TestFixtureParity runs every fixture, F32 and BF16, through the paged KV
// path against HF transformers: logits of whole prompts at every position,
// token-by-token decode, 32 greedy tokens, and the MTP logits where present.
func TestFixtureParity(t *testing.T) {
	fixtureDir, fixtureNames, variants := parityTargets()
	if _, err := os.Stat(fixtureDir); errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no fixtures under %s", fixtureDir)
	}
	const blockSize, numBlocks = 4, 64
	ops := newBackend(t, 0)
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			rf, err := weights.OpenFile(filepath.Join(fixtureDir, name, "reference.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer rf.Close()
			ref := fixtureRef{rf, t}
			for _, variant := range fixtureVariantsOf(name, variants) {
				t.Run(variant, func(t *testing.T) {
					m, err := Builtin().Load(ops, filepath.Join(fixtureDir, name, variant), Options{MaxModelLen: 128})
					if err != nil {
						t.Fatal(err)
					}
					checkRopeAgainstFixture(t, m, ref, variant)
					tol := fixtureTolerance[variant]
					r := rand.New(rand.NewPCG(uint64(len(name)), 1))
					for i := 0; ref.has(variant + ".prompt." + strconv.Itoa(i) + ".ids"); i++ {
						key := variant + ".prompt." + strconv.Itoa(i)
						ids, want := ref.ints(key+".ids"), ref.rows(key+".logits")
						greedyWant := ref.ints(variant + ".greedy." + strconv.Itoa(i) + ".ids")
						cache, err := m.NewKVCache(numBlocks, blockSize)
						if err != nil {
							t.Fatal(err)
						}
						table := newBlockPool(r, numBlocks).table(blockSize, len(ids)+len(greedyWant))
						got, hidden := step(t, m, cache, seqStep{ids, 0, table})
						worst := 0.0
						for p := range ids {
							e := relErr(got[p], want[p])
							worst = math.Max(worst, e)
							if e > tol {
								t.Errorf("prompt %d position %d: max|logit-ref|/max|ref| = %.3g > %g", i, p, e, tol)
							}
						}
						// Greedy continuation, one token per step over the paged cache.
						next := int32(argmax(got[len(ids)-1]))
						greedy := []int32{next}
						for len(greedy) < len(greedyWant) {
							lg, _ := step(t, m, cache, seqStep{[]int32{next}, len(ids) + len(greedy) - 1, table})
							next = int32(argmax(lg[0]))
							greedy = append(greedy, next)
						}
						for k := range greedyWant {
							if greedy[k] != greedyWant[k] {
								t.Errorf("prompt %d: greedy token %d is %d, HF %d (ours %v, HF %v)", i, k, greedy[k], greedyWant[k], greedy, greedyWant)
								break
							}
						}
						// Token-by-token decode of the prompt over a fresh cache.
						dcache, err := m.NewKVCache(numBlocks, blockSize)
						if err != nil {
							t.Fatal(err)
						}
						dworst := 0.0
						for p := range ids {
							lg, _ := step(t, m, dcache, seqStep{ids[p : p+1], p, table})
							dworst = math.Max(dworst, relErr(lg[0], want[p]))
						}
						if dworst > tol {
							t.Errorf("prompt %d: token-by-token decode error %.3g > %g", i, dworst, tol)
						}
						t.Logf("prompt %d (%d tokens): prefill error %.2g, decode error %.2g, greedy %d/%d", i, len(ids), worst, dworst, countEqual(greedy, greedyWant), len(greedyWant))
						checkMTPAgainstFixture(t, m, ref, variant, i, hidden, tol, r)
					}
				})
			}
		})
	}
}

func countEqual(a, b []int32) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] == b[i] {
			n++
		}
	}
	return n
}

// checkRopeAgainstFixture compares the model's RoPE frequencies and scales
// with those HF recorded.
func checkRopeAgainstFixture(t *testing.T, m Model, ref fixtureRef, variant string) {
	t.Helper()
	cfg := m.Config()
	name := variant + ".rope.inv_freq"
	if !ref.has(name) {
		return
	}
	want := ref.rows(name)[0]
	inv, att, err := ropeInvFreq(cfg.Rope, 2*len(want), cfg.MaxPositionEmbeddings)
	if err != nil {
		t.Fatal(err)
	}
	got := inv(0)
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-6*math.Abs(want[i]) {
			t.Errorf("rope inv_freq[%d] = %.9g, HF %.9g", i, got[i], want[i])
		}
	}
	md := ref.f.Metadata()
	if s, ok := md["rope_attention_scaling"]; ok {
		if want, err := strconv.ParseFloat(s, 64); err == nil && math.Abs(att-want) > 1e-6*want {
			t.Errorf("rope attention scaling %.9g, HF %.9g", att, want)
		}
	}
	if s, ok := md["attn_softmax_scale"]; ok {
		want, err := strconv.ParseFloat(s, 64)
		var got float64
		switch x := m.(type) {
		case *deepseek:
			got = float64(x.dims.Scale)
		case *llama:
			got = 1 / math.Sqrt(float64(x.headDim))
		}
		if err == nil && math.Abs(got-want) > 1e-6*want {
			t.Errorf("attention softmax scale %.9g, HF %.9g", got, want)
		}
	}
}

// checkMTPAgainstFixture runs MTP depth 0 over the prompt positions, fed the
// main model's hidden states, against the fixture's MTP logits.
func checkMTPAgainstFixture(t *testing.T, m Model, ref fixtureRef, variant string, i int, hidden kernels.Tensor, tol float64, r *rand.Rand) {
	t.Helper()
	key := variant + ".mtp." + strconv.Itoa(i)
	if !ref.has(key + ".ids") {
		return
	}
	mtp := m.MTP()
	if mtp == nil {
		t.Fatalf("fixture has MTP logits, model has no MTP module")
	}
	ids, want := ref.ints(key+".ids"), ref.rows(key+".logits")
	cache, err := mtp.NewKVCache(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	h := HostBatch{BlockSize: 4}
	h.AddSequence(ids, 0, newBlockPool(r, 16).table(4, len(ids)))
	b, err := h.Upload(opsOf(m), 16)
	if err != nil {
		t.Fatal(err)
	}
	out, err := mtp.Forward(t.Context(), 0, cache, b, hidden)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := mtp.ComputeLogits(0, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := rowsOf(t, opsOf(m), lg)
	worst := 0.0
	for p := range ids {
		worst = math.Max(worst, relErr(got[p], want[p]))
	}
	if worst > tol {
		t.Errorf("mtp prompt %d: max relative error %.3g > %g", i, worst, tol)
	}
	t.Logf("mtp prompt %d: error %.2g", i, worst)
}
