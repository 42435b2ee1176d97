package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// randMXFP4 is a random MXFP4 weight of shape: random codes, scales around
// 2^0 (127 +- 6) with a few of the extremes that still give finite
// products (0 and 1: subnormal values; 130 and 131).
func randMXFP4(r *rand.Rand, shape ...int) kernels.MXFP4Weight {
	n := 1
	for _, d := range shape {
		n *= d
	}
	w := kernels.MXFP4Weight{Shape: shape, Blocks: make([]byte, n/2), Scales: make([]byte, n/32)}
	for i := range w.Blocks {
		w.Blocks[i] = byte(r.IntN(256))
	}
	for i := range w.Scales {
		w.Scales[i] = byte(121 + r.IntN(13))
		if r.IntN(16) == 0 {
			w.Scales[i] = []byte{0, 1, 130, 131}[r.IntN(4)]
		}
	}
	return w
}

// widenedBF16 is w as the BF16 tensor models build for backends without
// MXFP4 kernels: each element code * 2^(scale-127), computed in float64
// and rounded to BF16 (exact: every such value is a BF16 value).
func widenedBF16(t testing.TB, b *Backend, w kernels.MXFP4Weight) kernels.Tensor {
	t.Helper()
	e2m1 := [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	k := w.Shape[len(w.Shape)-1]
	n := len(w.Blocks) * 2
	u := make([]uint16, n)
	for i := range n {
		code := w.Blocks[i/2] >> (4 * (i % 2)) & 0x0f
		v := e2m1[code&7] * math.Pow(2, float64(int(w.Scales[(i/k)*(k/32)+(i%k)/32])-127))
		if code&8 != 0 {
			v = -v
		}
		f := float32(v)
		if float64(f) != v || float64(kernels.BF16ToF32(kernels.F32ToBF16(f))) != v {
			t.Fatalf("element %d: %g is not a BF16 value", i, v)
		}
		u[i] = kernels.F32ToBF16(f)
	}
	ten, err := b.Alloc(kernels.BF16, w.Shape...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(ten, kernels.U16Bytes(u), kernels.BF16); err != nil {
		t.Fatal(err)
	}
	return ten
}

func mxfp4Tensor(t testing.TB, b *Backend, w kernels.MXFP4Weight) kernels.Tensor {
	t.Helper()
	ten, err := b.MXFP4Weight(w)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

func TestMXFP4ToF32(t *testing.T) {
	for _, c := range []struct {
		code, scale byte
		want        float32
	}{
		{0x0, 127, 0}, {0x1, 127, 0.5}, {0x3, 127, 1.5}, {0x7, 127, 6}, {0xf, 128, -12}, {0x9, 126, -0.25},
		{0x8, 200, float32(math.Copysign(0, -1))}, {0x2, 0, float32(math.Ldexp(1, -127))},
		{0x1, 0, float32(math.Ldexp(1, -128))}, {0x7, 252, float32(math.Ldexp(6, 125))},
		{0x7, 254, float32(math.Inf(1))}, {0x15, 127, 3}, // only the low nibble counts
	} {
		if got := kernels.MXFP4ToF32(c.code, c.scale); math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("MXFP4ToF32(%#x, %d) = %g, want %g", c.code, c.scale, got, c.want)
		}
	}
}

// TestMXFP4MoEMatchesBF16: MoEClampedSwiGLU with MXFP4 experts gives the
// bits of the same call with the experts widened to BF16, for every
// kernel set, with llama.cpp's activation rounding on and off, one token
// (GEMV) and a batch (GEMM), one thread and several.
func TestMXFP4MoEMatchesBF16(t *testing.T) {
	const e, hidden, inter, topK = 4, 64, 96, 2
	r := rand.New(rand.NewPCG(4, 4))
	gu, dn := randMXFP4(r, e, 2*inter, hidden), randMXFP4(r, e, hidden, inter)
	gub, dnb := randVals(r, e*2*inter, 0.5), randVals(r, e*hidden, 0.5)
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	var sets []string
	for _, impl := range simd.Impls() {
		sets = append(sets, impl.Name())
	}
	for _, set := range sets {
		for _, acts := range []ActRounding{ActFloat32, ActLlamaCpp} {
			for _, tc := range []struct{ tokens, threads int }{{1, 1}, {1, 3}, {9, 1}, {9, 3}} {
				name := fmt.Sprintf("%s acts=%d tokens=%d threads=%d", set, acts, tc.tokens, tc.threads)
				b := New(Options{Threads: tc.threads, SIMD: set, PureGo: set == "go", Activations: acts})
				x := randVals(r, tc.tokens*hidden, 2)
				ids := make([]int32, tc.tokens*topK)
				for i := range tc.tokens {
					p := r.Perm(e)
					ids[i*topK], ids[i*topK+1] = int32(p[0]), int32(p[1])
				}
				w := randVals(r, tc.tokens*topK, 1)
				run := func(gut, dnt kernels.Tensor) []float32 {
					out := alloc(t, b, tc.tokens, hidden)
					err := b.MoEClampedSwiGLU(out, put(t, b, kernels.F32, x, tc.tokens, hidden), putI32(t, b, ids, tc.tokens, topK),
						put(t, b, kernels.F32, w, tc.tokens, topK), gut, put(t, b, kernels.F32, gub, e, 2*inter),
						dnt, put(t, b, kernels.F32, dnb, e, hidden), act)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					return vals(out)
				}
				want := run(widenedBF16(t, b, gu), widenedBF16(t, b, dn))
				got := run(mxfp4Tensor(t, b, gu), mxfp4Tensor(t, b, dn))
				checkIdentical(t, name, got, want)
				b.Close()
			}
		}
	}
}

// TestMXFP4LinearTiles: the tile loop with a partial last tile, a bias
// and several rows gives linear's bits for the widened weight.
func TestMXFP4LinearTiles(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	b := newTestBackend(t, 3)
	for _, tc := range []struct{ m, n, k int }{{1, 37, 64}, {5, 37, 96}, {3, 16, 32}, {2, 1, 32}} {
		w := randMXFP4(r, tc.n, tc.k)
		mx, bf := mxfp4Tensor(t, b, w).(*Tensor), widenedBF16(t, b, w).(*Tensor)
		x, bias := randVals(r, tc.m*tc.k, 1), randVals(r, tc.n, 1)
		for _, bv := range [][]float32{nil, bias} {
			got, want := make([]float32, tc.m*tc.n), make([]float32, tc.m*tc.n)
			b.linearMXFP4(got, x, mx, tc.m, tc.n, tc.k, bv)
			b.linear(want, x, bf, tc.m, tc.n, tc.k, bv)
			checkIdentical(t, fmt.Sprintf("m=%d n=%d k=%d bias=%v", tc.m, tc.n, tc.k, bv != nil), got, want)
		}
		// Rows of an MXFP4 weight are MXFP4 weights of those rows.
		v, err := b.Rows(mx, 1, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		got, want := make([]float32, tc.m*(tc.n-1)), make([]float32, tc.m*(tc.n-1))
		b.linearMXFP4(got, x, v.(*Tensor), tc.m, tc.n-1, tc.k, nil)
		bv, _ := b.Rows(bf, 1, tc.n)
		b.linear(want, x, bv.(*Tensor), tc.m, tc.n-1, tc.k, nil)
		checkIdentical(t, "rows view", got, want)
	}
}

func TestMXFP4WeightErrors(t *testing.T) {
	b := newTestBackend(t, 1)
	ok := kernels.MXFP4Weight{Shape: []int{2, 3, 64}, Blocks: make([]byte, 192), Scales: make([]byte, 12)}
	if _, err := b.MXFP4Weight(ok); err != nil {
		t.Fatal(err)
	}
	nan := ok
	nan.Scales = make([]byte, 12)
	nan.Scales[5] = 0xff
	for _, c := range []struct {
		name string
		w    kernels.MXFP4Weight
		want error
	}{
		{"1-D", kernels.MXFP4Weight{Shape: []int{64}, Blocks: make([]byte, 32), Scales: make([]byte, 2)}, kernels.ErrShape},
		{"k not a multiple of 32", kernels.MXFP4Weight{Shape: []int{2, 48}, Blocks: make([]byte, 48), Scales: make([]byte, 3)}, kernels.ErrShape},
		{"short blocks", kernels.MXFP4Weight{Shape: []int{2, 3, 64}, Blocks: make([]byte, 191), Scales: make([]byte, 12)}, kernels.ErrShape},
		{"short scales", kernels.MXFP4Weight{Shape: []int{2, 3, 64}, Blocks: make([]byte, 192), Scales: make([]byte, 11)}, kernels.ErrShape},
		{"NaN scale", nan, kernels.ErrDType},
	} {
		if _, err := b.MXFP4Weight(c.w); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Only the gpt-oss expert kernel takes MXFP4 weights; the others
	// refuse them, and the two expert weights must agree.
	r := rand.New(rand.NewPCG(6, 6))
	mx := mxfp4Tensor(t, b, randMXFP4(r, 2, 64, 64))
	x, out := put(t, b, kernels.F32, randVals(r, 64, 1), 1, 64), alloc(t, b, 1, 64)
	m, _ := b.Rows(mx, 0, 1)
	m, _ = b.Reshape(m, 64, 64)
	if err := b.Linear(out, x, m, nil); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("Linear with an MXFP4 weight: %v, want ErrDType", err)
	}
	if _, err := b.Reshape(mx, 2, 32, 128); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("Reshape changing the rows of an MXFP4 weight: %v, want ErrShape", err)
	}
	ids, wts := putI32(t, b, []int32{0}, 1, 1), put(t, b, kernels.F32, []float32{1}, 1, 1)
	gu := mxfp4Tensor(t, b, randMXFP4(r, 2, 128, 64))
	if err := b.MoE(out, x, ids, wts, gu, mx); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("MoE with MXFP4 experts: %v, want ErrDType", err)
	}
	dnBF := put(t, b, kernels.BF16, randVals(r, 2*64*64, 1), 2, 64, 64)
	err := b.MoEClampedSwiGLU(out, x, ids, wts, gu, alloc(t, b, 2, 128), dnBF, alloc(t, b, 2, 64), kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702})
	if !errors.Is(err, kernels.ErrDType) {
		t.Errorf("MXFP4 gate_up with BF16 down: %v, want ErrDType", err)
	}
}

// TestWidenMXFP4AllScales: every simd path's widening (the one the
// backend runs and the Go one behind widenMXFP4) gives
// F32ToBF16(MXFP4ToF32) for every scale, 255 (E8M0's NaN, refused at load)
// included, and every byte: the Go path's pairs for the scales 2..252 and
// its value-at-a-time look-ups for the others, and the SIMD paths' table
// look-ups.
func TestWidenMXFP4AllScales(t *testing.T) {
	blocks := make([]byte, 256)
	for i := range blocks {
		blocks[i] = byte(i)
	}
	dst := make([]uint16, 512)
	for _, p := range simd.Impls() {
		for s := range 256 {
			scales := []byte{byte(s), byte(s), byte(s), byte(s), byte(s), byte(s), byte(s), byte(s),
				byte(s), byte(s), byte(s), byte(s), byte(s), byte(s), byte(s), byte(s)}
			p.WidenMXFP4(dst, blocks, scales)
			for i, got := range dst {
				want := kernels.F32ToBF16(kernels.MXFP4ToF32(blocks[i/2]>>(4*(i%2)), byte(s)))
				if got != want {
					t.Fatalf("%s: scale %d, byte %#02x, nibble %d: %#04x, want %#04x", p.Name(), s, blocks[i/2], i%2, got, want)
				}
			}
		}
	}
}
