package simd

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/pool"
)

// batchDecodeShapes are the products of one decode step of the shipped
// default model (hidden 256, MLA with ranks 128, 8 heads, 8 experts of 192
// with one shared, vocabulary 8192) at batch 64: m is the rows a product
// sees (a routed expert sees 64 x 2 / 8 = 16 on average).
var batchDecodeShapes = []struct {
	name    string
	m, n, k int
}{
	{"q_a", 64, 128, 256},
	{"q_b", 64, 384, 128},
	{"kv_a", 64, 144, 256},
	{"o", 64, 256, 256},
	{"dense_gate_up", 64, 2048, 256},
	{"dense_down", 64, 256, 1024},
	{"expert_gate_up", 16, 384, 256},
	{"expert_down", 16, 256, 192},
	{"shared_gate_up", 64, 384, 256},
	{"shared_down", 64, 256, 192},
	{"lm_head", 64, 8192, 256},
}

var batchDtype = flag.Int("batch-dtype", 1, "BenchmarkLinearBatchDecode weight type: index into benchDtypes (0 f32, 1 bf16, 2 f16), or 3: bf16 weights in pairs with activations rounded to bfloat16 (LinearBF16Pairs)")

// BenchmarkLinearBatchDecode runs the BF16 products of a batch-64 decode
// step of the default model over the pool, 16 columns a grain as the
// backend splits them, with weights hot in the caches (the whole model is
// 19M parameters), and reports GFLOP/s and the share of the FMA peak
// measured before each case (-batch-dtype 3: the pairs run two products a
// lane and instruction, so their peak is twice the FMA's).
func BenchmarkLinearBatchDecode(b *testing.B) {
	p := pool.New(*benchWorkers)
	defer p.Close()
	roof := newRoofline(p)
	r := rand.New(rand.NewPCG(5, 5))
	impl := benchImpl(b)
	pairs := *batchDtype == 3
	dt, name := benchDtypes[1], "bf16pairs" // the pairs' weights are bf16
	if !pairs {
		dt = benchDtypes[*batchDtype]
		name = dt.name
	}
	for _, sh := range batchDecodeShapes {
		w := dt.make(r, sh.n*sh.k)
		x := randVec(r, sh.m*sh.k)
		xh := make([]uint16, len(x)) // the pairs' activations, rounded once as the backend does a product
		RoundBF16(xh, x)
		out := make([]float32, sh.m*sh.n)
		b.Run(fmt.Sprintf("%s/%s/%s_m%d_%dx%d", impl, name, sh.name, sh.m, sh.n, sh.k), func(b *testing.B) {
			benchGEMMCase(b, p, roof, 16, sh.m, sh.n, sh.k, func(lo, hi int) {
				if pairs {
					impl.LinearBF16Pairs(out, xh, w.([]uint16), sh.m, sh.n, sh.k, lo, hi)
					return
				}
				dt.run(impl, out, x, w, sh.m, sh.n, sh.k, lo, hi)
			})
		})
	}
}
