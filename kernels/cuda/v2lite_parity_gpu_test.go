package cuda_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
)

// V2LiteFullParityEnv, set to 1, runs TestGPUDeepSeekV2LiteFullParity
// (tools/gpu/check.sh's parity phase sets it): the whole 27-layer
// DeepSeek-V2-Lite shape takes 31 GB of device memory and the CPU
// backend's share of host memory, so the plain TestGPU run leaves it out.
const V2LiteFullParityEnv = "DEEPINFER_V2LITE_FULL_PARITY"

// v2LiteFullTol bounds max|logit-cpu|/max|cpu| at every position of the
// whole-depth V2-Lite shape in GEMM split (activations split into two
// 16-bit halves: about float32 accuracy) against the CPU backend (float32
// arithmetic over the same BF16 weights). Both keep float32 latent caches
// here, so what differs is the order of the sums, compounded over 27
// layers; the 4-layer fixtures of TestGPUFixtureParity meet 1e-2 in split
// mode against HF's float32 reference, and the same bound holds here.
const v2LiteFullTol = 1e-2

// TestGPUDeepSeekV2LiteFullParity runs the DeepSeek-V2-Lite shape with all
// 27 layers (tools/configs/real/deepseek-v2-lite.json: MLA with rank 512,
// 64 routed experts of which 6 a token plus 2 shared, the first layer
// dense) on random BF16 weights (fastWeights, each matrix its own values)
// through the CUDA backend in GEMM split and through the CPU backend, and
// compares them: the logits of two prompts at every position, then 16
// greedy tokens of each, decoded one step at a time over the paged caches
// with the CPU fed the GPU's tokens (teacher forcing), so that a near tie
// flipped once does not make every later position a mismatch. Bounds: the
// relative error v2LiteFullTol at every position, and the same top-1 at
// 98% of positions or more (random weights leave near ties among 102400
// logits). The summary line gives the worst error and the agreement.
func TestGPUDeepSeekV2LiteFullParity(t *testing.T) {
	if os.Getenv(V2LiteFullParityEnv) != "1" {
		t.Skipf("set %s=1 to run the 27-layer DeepSeek-V2-Lite shape against the CPU backend (31 GB of device memory)", V2LiteFullParityEnv)
	}
	_, cfg := shapeConfig(t, "deepseek-v2-lite", "deepseek-v2", false)
	if cfg.NumHiddenLayers != 27 {
		t.Fatalf("deepseek-v2-lite.json has %d layers, want 27", cfg.NumHiddenLayers)
	}
	w, err := fastWeights(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := gpuOrSkip(t, cuda.Options{GEMM: cuda.GEMMSplit})
	cpuOps := cpu.New(cpu.Options{})
	t.Cleanup(func() { cpuOps.Close() })
	const blockSize, numBlocks, maxLen, greedyN = 16, 64, 512, 16
	mg, err := models.Builtin().New(g, cfg, w, models.Options{MaxModelLen: maxLen})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := models.Builtin().New(cpuOps, cfg, w, models.Options{MaxModelLen: maxLen})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(27, 27))
	worst, top1, positions := 0.0, 0, 0
	check := func(what string, got, want []float32) {
		t.Helper()
		e := cuda.MaxRelErr(got, want)
		worst = math.Max(worst, e)
		if e > v2LiteFullTol || math.IsNaN(e) {
			t.Errorf("%s: max|logit-cpu|/max|cpu| = %.3g > %g", what, e, v2LiteFullTol)
		}
		if cuda.Argmax(got) == cuda.Argmax(want) {
			top1++
		}
		positions++
	}
	for pi, n := range []int{7, 100} {
		ids, table := randomPrompt(r, n, greedyN, cfg.VocabSize, blockSize, numBlocks)
		cg, err := mg.NewKVCache(numBlocks, blockSize)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := mc.NewKVCache(numBlocks, blockSize)
		if err != nil {
			t.Fatal(err)
		}
		got := cuda.Forward(t, mg, g, cg, ids, 0, table)
		want := cuda.Forward(t, mc, cpuOps, cc, ids, 0, table)
		for p := range ids {
			check(fmt.Sprintf("prompt %d position %d", pi, p), got[p], want[p])
		}
		next := int32(cuda.Argmax(got[n-1]))
		for s := range greedyN {
			lg := cuda.Forward(t, mg, g, cg, []int32{next}, n+s, table)
			lc := cuda.Forward(t, mc, cpuOps, cc, []int32{next}, n+s, table)
			check(fmt.Sprintf("prompt %d greedy step %d", pi, s), lg[0], lc[0])
			next = int32(cuda.Argmax(lg[0]))
		}
	}
	t.Logf("deepseek-v2-lite 27 layers, GEMM split vs the CPU backend (%s): worst max|logit-cpu|/max|cpu| %.2e, top-1 %d/%d",
		cpuOps.Name(), worst, top1, positions)
	if top1*100 < positions*98 {
		t.Errorf("top-1 agrees at %d of %d positions, want 98%% or more", top1, positions)
	}
}

// gpuOrSkip is a CUDA backend with options o, closed when the test ends;
// the test is skipped where no library or device is found (unless
// cuda.LibraryEnv names a library, which must then load).
func gpuOrSkip(t *testing.T, o cuda.Options) *cuda.Backend {
	t.Helper()
	g, err := cuda.New(o)
	if err != nil {
		if os.Getenv(cuda.LibraryEnv) == "" && (errors.Is(err, cuda.ErrNoLibrary) || errors.Is(err, cuda.ErrNoDevice)) {
			t.Skipf("GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// randomPrompt draws n token ids below vocab and a block table of
// distinct blocks among numBlocks covering n + extra tokens.
func randomPrompt(r *rand.Rand, n, extra, vocab, blockSize, numBlocks int) (ids, table []int32) {
	ids = make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	need := (n + extra + blockSize - 1) / blockSize
	table = make([]int32, need)
	for j, b := range r.Perm(numBlocks)[:need] {
		table[j] = int32(b)
	}
	return ids, table
}
