package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// Long contexts: decode rows split over several key chunks (up to 16, of a
// length set by the row's key count), prefill rows over several query and
// key tiles, head groups wider than one decode block (12 query heads per KV
// head), and a head size that sends prefill rows to the fallback kernel.
func TestGPUAttentionLong(t *testing.T) {
	p := newPair(t, GEMMRound)
	const blockSize, numBlocks = 16, 700
	seqs := [][2]int{{1, 5000}, {1, 300}, {1, 4097}, {100, 1500}, {1, 1}}
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 32, NumKVHeads: 8, HeadDim: 64},
		{NumHeads: 16, NumKVHeads: 8, HeadDim: 128, SlidingWindow: 1000},
		{NumHeads: 12, NumKVHeads: 1, HeadDim: 40},
		{NumHeads: 4, NumKVHeads: 2, HeadDim: 256},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		t.Run(fmt.Sprintf("h%d_kv%d_d%d_w%d", ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow), func(t *testing.T) {
			b := p.pagedBatch(blockSize, numBlocks, seqs)
			width := ap.NumKVHeads * ap.HeadDim
			kc, vc := p.rand(kernels.F32, 1, numBlocks, blockSize, width), p.rand(kernels.F32, 1, numBlocks, blockSize, width)
			q := p.rand(kernels.F32, 1, b.numTokens, ap.NumHeads*ap.HeadDim)
			out := p.zeros(kernels.F32, b.numTokens, ap.NumHeads*ap.HeadDim)
			p.poison(out)
			if err := p.c.Attention(out.c, q.c, kc.c, vc.c, &b.cpuMeta, ap); err != nil {
				t.Fatal(err)
			}
			if err := p.g.Attention(out.g, q.g, kc.g, vc.g, &b.gpuMeta, ap); err != nil {
				t.Fatal(err)
			}
			p.check("attention", out, 1e-5)
		})
	}
}

// A decode row's bits do not depend on the width of the block tables (which
// sets how many key chunks the launch holds) nor on its neighbours, and a
// prefill row's bits do not depend on how the prompt is chunked.
func TestGPUAttentionInvariance(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	const blockSize, numBlocks = 16, 200
	ap := kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: 64, Scale: 0.125}
	w := ap.NumHeads * ap.HeadDim
	kc, vc := p.rand(kernels.F32, 1, numBlocks, blockSize, ap.NumKVHeads*ap.HeadDim), p.rand(kernels.F32, 1, numBlocks, blockSize, ap.NumKVHeads*ap.HeadDim)
	b := p.pagedBatch(blockSize, numBlocks, [][2]int{{1, 700}, {1, 33}, {100, 1000}, {1, 1000}})
	q := p.rand(kernels.F32, 1, b.numTokens, w)
	run := func(m *kernels.AttentionMetadata, qt kernels.Tensor) []float32 {
		t.Helper()
		o, err := g.Alloc(kernels.F32, qt.Shape()[0], w)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Attention(o, qt, kc.g, vc.g, m, ap); err != nil {
			t.Fatal(err)
		}
		return p.f32(g, o)
	}
	ints := func(xs []int32, shape ...int) kernels.Tensor {
		return upload(t, g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
	}
	same := func(what string, a, b []float32) {
		t.Helper()
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s: element %d: %v vs %v", what, i, a[i], b[i])
			}
		}
	}
	all := run(&b.gpuMeta, q.g)
	tables := p.i32(g, b.gpuMeta.BlockTables)
	maxBlocks := b.gpuMeta.BlockTables.Shape()[1]
	row := func(s int) []int32 { return tables[s*maxBlocks : (s+1)*maxBlocks] }

	// Sequence 0 (700 keys) alone, in a table 12 times wider, decode-only.
	const wide = 12 * 64
	wt := make([]int32, wide)
	for i := range wt {
		wt[i] = -1
	}
	copy(wt, row(0))
	solo := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, MaxSeqlenQ: 1, BlockSize: blockSize,
		CuSeqlensQ: ints([]int32{0, 1}, 2), SeqlensK: ints([]int32{700}, 1), BlockTables: ints(wt, 1, wide)}
	q0, err := g.Rows(q.g, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	same("decode row alone in a wide table vs in the batch", run(&solo, q0), all[:w])

	// Sequence 2's prompt (100 rows over 1000 keys) in two chunks: 37 rows,
	// then 63.
	start := 2 // rows of sequence 2 start after the two decode rows
	for _, c := range [][2]int{{0, 37}, {37, 100}} {
		n := c[1] - c[0]
		meta := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: n, MaxSeqlenQ: n, BlockSize: blockSize,
			CuSeqlensQ: ints([]int32{0, int32(n)}, 2), SeqlensK: ints([]int32{int32(900 + c[1])}, 1),
			BlockTables: ints(row(2), 1, maxBlocks)}
		qc, err := g.Rows(q.g, start+c[0], start+c[1])
		if err != nil {
			t.Fatal(err)
		}
		same(fmt.Sprintf("prefill rows [%d, %d) as a chunk vs the whole prompt", c[0], c[1]),
			run(&meta, qc), all[(start+c[0])*w:(start+c[1])*w])
	}

	// A decode-only batch that holds a prefill sequence is reported.
	bad := b.gpuMeta
	bad.MaxSeqlenQ = 1
	o, _ := g.Alloc(kernels.F32, b.numTokens, w)
	if err := g.Attention(o, q.g, kc.g, vc.g, &bad, ap); err != nil {
		t.Fatal(err)
	}
	if err := g.Sync(); err == nil {
		t.Error("MaxSeqlenQ 1 with a 100-row sequence: no device check reported")
	}
}

// Prefill rows of a model with 16-bit weights run on tensor cores in GEMM
// mode round (q, k, v and the probabilities as half, float32 accumulation):
// close to the float32 CPU backend, bit-identical whether a prompt is
// chunked or whole, and exact again in GEMM mode split.
func TestGPUAttentionTensorCores(t *testing.T) {
	const blockSize, numBlocks = 16, 400
	seqs := [][2]int{{100, 1500}, {1, 300}, {64, 64}, {37, 37}, {130, 700}, {2, 2}}
	for _, mode := range []GEMMMode{GEMMRound, GEMMSplit} {
		p := newPair(t, mode)
		tol := 5e-3 // half inputs
		if mode == GEMMSplit {
			tol = 1e-5 // the float32 kernel
		}
		for _, ap := range []kernels.AttentionParams{
			{NumHeads: 32, NumKVHeads: 8, HeadDim: 64},
			{NumHeads: 16, NumKVHeads: 8, HeadDim: 128},
			{NumHeads: 8, NumKVHeads: 2, HeadDim: 128, SlidingWindow: 90},
			{NumHeads: 12, NumKVHeads: 1, HeadDim: 40}, // no tensor-core kernel: float32
		} {
			ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
			ap.InputDType = kernels.BF16
			name := fmt.Sprintf("%s/h%d_kv%d_d%d_w%d", mode, ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow)
			t.Run(name, func(t *testing.T) {
				b := p.pagedBatch(blockSize, numBlocks, seqs)
				width := ap.NumKVHeads * ap.HeadDim
				kc, vc := p.rand(kernels.F32, 1, numBlocks, blockSize, width), p.rand(kernels.F32, 1, numBlocks, blockSize, width)
				w := ap.NumHeads * ap.HeadDim
				q := p.rand(kernels.F32, 1, b.numTokens, w)
				out := p.zeros(kernels.F32, b.numTokens, w)
				p.poison(out)
				if err := p.c.Attention(out.c, q.c, kc.c, vc.c, &b.cpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				if err := p.g.Attention(out.g, q.g, kc.g, vc.g, &b.gpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				e := p.check("attention", out, tol)
				t.Logf("attention %s: max relative error vs the CPU backend %.2e", name, e)

				// The first sequence (100 rows over 1500 keys) chunked 37 + 63
				// gives the bits of the whole batch.
				all := p.f32(p.g, out.g)
				tables := p.i32(p.g, b.gpuMeta.BlockTables)
				maxBlocks := b.gpuMeta.BlockTables.Shape()[1]
				ints := func(xs []int32, shape ...int) kernels.Tensor {
					return upload(t, p.g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
				}
				// The decode row (sequence 1, 300 keys) alone, in a table 8
				// times wider, gives its bits in the batch.
				wide := 8 * maxBlocks
				wt := make([]int32, wide)
				for i := range wt {
					wt[i] = -1
				}
				copy(wt, tables[maxBlocks:2*maxBlocks])
				solo := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: 1, MaxSeqlenQ: 1, BlockSize: blockSize,
					CuSeqlensQ: ints([]int32{0, 1}, 2), SeqlensK: ints([]int32{300}, 1), BlockTables: ints(wt, 1, wide)}
				qd, err := p.g.Rows(q.g, 100, 101)
				if err != nil {
					t.Fatal(err)
				}
				od, err := p.g.Alloc(kernels.F32, 1, w)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.g.Attention(od, qd, kc.g, vc.g, &solo, ap); err != nil {
					t.Fatal(err)
				}
				for i, v := range p.f32(p.g, od) {
					if math.Float32bits(v) != math.Float32bits(all[100*w+i]) {
						t.Fatalf("decode row alone in a wide table: element %d is %v, in the batch %v", i, v, all[100*w+i])
					}
				}
				for _, c := range [][2]int{{0, 37}, {37, 100}} {
					n := c[1] - c[0]
					meta := kernels.AttentionMetadata{NumSeqs: 1, NumTokens: n, MaxSeqlenQ: n, BlockSize: blockSize,
						CuSeqlensQ: ints([]int32{0, int32(n)}, 2), SeqlensK: ints([]int32{int32(1400 + c[1])}, 1),
						BlockTables: ints(tables[:maxBlocks], 1, maxBlocks)}
					qc, err := p.g.Rows(q.g, c[0], c[1])
					if err != nil {
						t.Fatal(err)
					}
					o, err := p.g.Alloc(kernels.F32, n, w)
					if err != nil {
						t.Fatal(err)
					}
					if err := p.g.Attention(o, qc, kc.g, vc.g, &meta, ap); err != nil {
						t.Fatal(err)
					}
					got, want := p.f32(p.g, o), all[c[0]*w:c[1]*w]
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("rows [%d, %d) as a chunk: element %d is %v, the whole prompt gave %v", c[0], c[1], i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// Half caches (the backend's choice for 16-bit models in GEMM mode round):
// WriteCache rounds float32 rows to half, and Attention over half caches
// equals the float32 CPU backend over the same rounded values, for decode and
// prefill rows, on the float32 kernels (InputDType F32) and on tensor cores.
func TestGPUAttentionHalfCache(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	if got := g.KVCacheDType(kernels.BF16); got != kernels.F16 {
		t.Fatalf("KVCacheDType(BF16) in GEMM mode round = %v, want F16", got)
	}
	if got := g.KVCacheDType(kernels.F32); got != kernels.F32 {
		t.Fatalf("KVCacheDType(F32) = %v, want F32", got)
	}
	const blockSize, numBlocks = 16, 300
	seqs := [][2]int{{1, 700}, {100, 1000}, {1, 33}, {64, 64}, {300, 400}} // (query rows, keys)
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 32, NumKVHeads: 8, HeadDim: 64},
		{NumHeads: 16, NumKVHeads: 4, HeadDim: 128, SlidingWindow: 300},
		{NumHeads: 12, NumKVHeads: 1, HeadDim: 40},
	} {
		for _, in := range []kernels.DType{kernels.F32, kernels.BF16} {
			ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
			ap.InputDType = in
			name := fmt.Sprintf("d%d_w%d_inputs_%s", ap.HeadDim, ap.SlidingWindow, in)
			t.Run(name, func(t *testing.T) {
				b := p.pagedBatch(blockSize, numBlocks, seqs)
				width := ap.NumKVHeads * ap.HeadDim
				var kc, vc dual
				var kf, vf kernels.Tensor // the rounded values in float32 caches on the GPU
				for i, c := range []*dual{&kc, &vc} {
					vals := randVals(p.r, numBlocks*blockSize*width, 1)
					half := make([]uint16, len(vals))
					for i, v := range vals {
						half[i] = kernels.F32ToF16(v)
						vals[i] = kernels.F16ToF32(half[i])
					}
					c.c = upload(t, p.c, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, width)
					c.g = upload(t, g, kernels.F16, kernels.U16Bytes(half), kernels.F16, numBlocks, blockSize, width)
					f := upload(t, g, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, width)
					if i == 0 {
						kf = f
					} else {
						vf = f
					}
				}
				w := ap.NumHeads * ap.HeadDim
				q := p.rand(kernels.F32, 1, b.numTokens, w)
				out := p.zeros(kernels.F32, b.numTokens, w)
				p.poison(out)
				if err := p.c.Attention(out.c, q.c, kc.c, vc.c, &b.cpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				if err := g.Attention(out.g, q.g, kc.g, vc.g, &b.gpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				tol := 1e-5
				if in == kernels.BF16 && (ap.HeadDim == 64 || ap.HeadDim == 128) {
					tol = 5e-3
				}
				e := p.check("attention", out, tol)
				t.Logf("attention over half caches %s: max relative error vs the CPU backend %.2e", name, e)

				// The kernels that read half caches (cp.async tiles for
				// prefill) give the bits of the ones that read float32
				// caches holding the same values.
				of, err := g.Alloc(kernels.F32, b.numTokens, w)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.Attention(of, q.g, kf, vf, &b.gpuMeta, ap); err != nil {
					t.Fatal(err)
				}
				half, full := p.f32(g, out.g), p.f32(g, of)
				for i := range half {
					if math.Float32bits(half[i]) != math.Float32bits(full[i]) {
						t.Fatalf("element %d: %v over the half cache, %v over the float32 cache of the same values", i, half[i], full[i])
					}
				}
			})
		}
	}

	// WriteCache rounds float32 rows to the nearest half.
	src := p.rand(kernels.F32, 3, 5, 24)
	slots := upload(t, g, kernels.I32, kernels.I32Bytes([]int32{7, -1, 0, 31, 12}), kernels.I32, 5)
	cache, err := g.Alloc(kernels.F16, 2, 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]uint16, 2*16*32)
	if err := g.Upload(cache, kernels.U16Bytes(zero), kernels.F16); err != nil {
		t.Fatal(err)
	}
	if err := g.WriteCache(cache, src.g, slots, 8); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 2*16*32*2)
	if err := g.Download(raw, cache); err != nil {
		t.Fatal(err)
	}
	vals := p.f32(p.c, src.c)
	for r, slot := range []int{7, -1, 0, 31, 12} {
		if slot < 0 {
			continue
		}
		for j := range 24 {
			off := (slot*32 + 8 + j) * 2
			got := uint16(raw[off]) | uint16(raw[off+1])<<8
			if want := kernels.F32ToF16(vals[r*24+j]); got != want {
				t.Fatalf("row %d column %d: half %#04x, want %#04x", r, j, got, want)
			}
		}
	}
}

// 8-bit E4M3 caches (Options.KVCacheDType): KVCacheDType picks them for
// every model; WriteCache rounds to the nearest E4M3 value as the host does
// (ties to even, saturated at +-448, NaN kept); the tensor-core decode and
// prefill kernels, which widen the 8-bit values to half (in registers or in
// shared memory), give the bits of the kernels over a half cache holding
// the rounded values,
// for decode rows, whole and chunked prompts, a window, head sizes 64 and
// 128 and groups 2 to 8; the float32 kernels (float32 inputs, other head
// sizes, groups over 16) agree with the CPU backend over the same values.
func TestGPUAttentionFP8Cache(t *testing.T) {
	p := newPair(t, GEMMRound)
	g8 := newGPUOpts(t, Options{KVCacheDType: kernels.F8E4M3})
	for _, c := range []struct {
		ops     *Backend
		weights kernels.DType
		want    kernels.DType
	}{{g8, kernels.BF16, kernels.F8E4M3}, {g8, kernels.F16, kernels.F8E4M3}, {g8, kernels.F32, kernels.F8E4M3}, {p.g, kernels.BF16, kernels.F16}} {
		if got := c.ops.KVCacheDType(c.weights); got != c.want {
			t.Errorf("KVCacheDType(%v) with Options.KVCacheDType %v = %v, want %v", c.weights, c.ops.kvCache, got, c.want)
		}
	}
	if _, err := New(Options{KVCacheDType: kernels.BF16}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("New with KVCacheDType BF16: %v, want ErrUnsupported", err)
	}

	const blockSize, numBlocks = 16, 300
	seqs := [][2]int{{1, 700}, {100, 1000}, {1, 33}, {64, 64}, {300, 400}, {1, 2000}} // (query rows, keys)
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 32, NumKVHeads: 8, HeadDim: 64},
		{NumHeads: 16, NumKVHeads: 8, HeadDim: 128},
		{NumHeads: 16, NumKVHeads: 2, HeadDim: 128, SlidingWindow: 300},
		{NumHeads: 8, NumKVHeads: 4, HeadDim: 64, SlidingWindow: 50},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		ap.InputDType = kernels.BF16
		name := fmt.Sprintf("h%d_kv%d_d%d_w%d", ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow)
		t.Run(name, func(t *testing.T) {
			b := p.pagedBatch(blockSize, numBlocks, seqs)
			width, w := ap.NumKVHeads*ap.HeadDim, ap.NumHeads*ap.HeadDim
			var k8, v8, kh, vh kernels.Tensor
			var kcpu, vcpu kernels.Tensor
			for i := range 2 {
				vals := randVals(p.r, numBlocks*blockSize*width, 3)
				raw := hostBytes(kernels.F8E4M3, vals)
				for j := range vals {
					vals[j] = kernels.F8E4M3ToF32(raw[j])
				}
				c8 := upload(t, p.g, kernels.F8E4M3, raw, kernels.F8E4M3, numBlocks, blockSize, width)
				ch := upload(t, p.g, kernels.F16, hostBytes(kernels.F16, vals), kernels.F16, numBlocks, blockSize, width)
				cc := upload(t, p.c, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, width)
				if i == 0 {
					k8, kh, kcpu = c8, ch, cc
				} else {
					v8, vh, vcpu = c8, ch, cc
				}
			}
			q := p.rand(kernels.F32, 1, b.numTokens, w)
			out8, outh := p.zeros(kernels.F32, b.numTokens, w), p.zeros(kernels.F32, b.numTokens, w)
			p.poison(out8)
			if err := p.g.Attention(out8.g, q.g, k8, v8, &b.gpuMeta, ap); err != nil {
				t.Fatal(err)
			}
			if err := p.g.Attention(outh.g, q.g, kh, vh, &b.gpuMeta, ap); err != nil {
				t.Fatal(err)
			}
			got, want := p.f32(p.g, out8.g), p.f32(p.g, outh.g)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("element %d: %v over the 8-bit cache, %v over the half cache of the same values", i, got[i], want[i])
				}
			}
			// And near the float32 CPU backend over the same values (the
			// tensor cores round q and the probabilities to half).
			if err := p.c.Attention(out8.c, q.c, kcpu, vcpu, &b.cpuMeta, ap); err != nil {
				t.Fatal(err)
			}
			t.Logf("8-bit caches %s: max relative error vs the CPU backend %.2e", name, p.check("attention", out8, 5e-3))
		})
	}

	// The float32 kernels over 8-bit caches, against the CPU backend.
	b := p.pagedBatch(blockSize, numBlocks, [][2]int{{1, 40}, {20, 20}, {1, 700}, {70, 90}})
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 8, NumKVHeads: 2, HeadDim: 64, InputDType: kernels.F32},
		{NumHeads: 8, NumKVHeads: 2, HeadDim: 40, InputDType: kernels.BF16},
		{NumHeads: 32, NumKVHeads: 1, HeadDim: 64, InputDType: kernels.BF16},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		e, _ := p.attentionOverCaches(t, b, ap, kernels.F8E4M3, numBlocks, blockSize, 3)
		t.Logf("8-bit caches, %+v: max relative error vs the CPU backend %.2e", ap, e)
	}

	// WriteCache rounds float32 rows to the nearest E4M3 value.
	vals := []float32{0.3, -1.0625, 448, 449, 465, -1e6, float32(math.Inf(1)), 1e-4, 0.0009765625, -0.00146484375,
		float32(math.NaN()), 3.3, 17.5, -240.5, 0, 0.01171875}
	src := upload(t, p.g, kernels.F32, kernels.F32Bytes(vals), kernels.F32, 2, 8)
	slots := upload(t, p.g, kernels.I32, kernels.I32Bytes([]int32{5, 30}), kernels.I32, 2)
	cache := upload(t, p.g, kernels.F8E4M3, make([]byte, 2*16*16), kernels.F8E4M3, 2, 16, 16)
	if err := p.g.WriteCache(cache, src, slots, 4); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 2*16*16)
	if err := p.g.Download(raw, cache); err != nil {
		t.Fatal(err)
	}
	for r, slot := range []int{5, 30} {
		for j := range 8 {
			x := vals[r*8+j]
			if got, want := raw[slot*16+4+j], kernels.F32ToF8E4M3(x); got != want {
				t.Errorf("WriteCache(%v): %#02x, want %#02x (%v)", x, got, want, kernels.F8E4M3ToF32(want))
			}
		}
	}
}

// Decode with at most 8 query heads a KV head has three kernels: over
// 8-bit caches di_decode_attn_f8_k (cache bytes widened in registers; off
// with Options.DecodeF8Direct < 0), over those and half and float32
// caches di_decode_attn_km_k (keys as the tensor-core rows; off with
// Options.DisableDecodeKM), and di_decode_attn_tc_k. The first gives the
// bits of the second: it only permutes the terms inside each tensor-core
// instruction's 16-term sum, which the H200 adds without an order. The
// second is within rounding of the third (the same inputs: the pairs draw
// from generators seeded alike), and each of the CPU backend over the same
// values, for groups 1 to 8, head sizes 64 and 128, a window, rows of 1 to
// 2000 keys.
func TestGPUDecodeKeysAsRows(t *testing.T) {
	all := newPair(t, GEMMRound)
	km := newPairOpts(t, Options{DecodeF8Direct: -1})
	tc := newPairOpts(t, Options{DecodeF8Direct: -1, DisableDecodeKM: true})
	const blockSize, numBlocks = 16, 260
	seqs := [][2]int{{1, 700}, {1, 33}, {1, 2000}, {1, 1}, {1, 257}, {1, 1024}}
	differ := map[string]int{} // cases where two kernels' bits differ somewhere, by comparison
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 32, NumKVHeads: 8, HeadDim: 64},
		{NumHeads: 16, NumKVHeads: 8, HeadDim: 128},
		{NumHeads: 16, NumKVHeads: 2, HeadDim: 128, SlidingWindow: 300},
		{NumHeads: 8, NumKVHeads: 8, HeadDim: 64},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		ap.InputDType = kernels.BF16
		for _, cdt := range []kernels.DType{kernels.F16, kernels.F8E4M3, kernels.F32} {
			name := fmt.Sprintf("h%d_kv%d_d%d_w%d_%s", ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow, cdt)
			t.Run(name, func(t *testing.T) {
				var got [3][]float32
				for i, p := range []*pair{all, km, tc} {
					b := p.pagedBatch(blockSize, numBlocks, seqs)
					var e float64
					e, got[i] = p.attentionOverCaches(t, b, ap, cdt, numBlocks, blockSize, 2)
					t.Logf("%s, kernel %d: max relative error vs the CPU backend %.2e", name, i, e)
				}
				for _, c := range []struct {
					what string
					a, b []float32
				}{{"8-bit in registers vs keys as rows", got[0], got[1]}, {"keys as rows vs heads as rows", got[1], got[2]}} {
					e := maxRelErr(c.a, c.b)
					if e > 1e-3 {
						t.Errorf("%s: max relative difference %.3g", c.what, e)
					}
					if !bytes.Equal(kernels.F32Bytes(c.a), kernels.F32Bytes(c.b)) {
						differ[c.what]++
					}
					t.Logf("%s: %s: max relative difference %.2e", name, c.what, e)
				}
			})
		}
	}
	if n := differ["8-bit in registers vs keys as rows"]; n > 0 {
		t.Errorf("8-bit in registers vs keys as rows: bits differ in %d cases, want none", n)
	}
	if differ["keys as rows vs heads as rows"] == 0 {
		t.Error("DisableDecodeKM changed no bit: the backend did not run the other kernel")
	}
}

// A block of the 8-bit decode kernel may take a run of consecutive chunks
// of a row (the row's chunks dealt evenly over ceil(nsplit / n) blocks with
// Options.DecodeChunksPerBlock n, over a count chosen from the batch's size
// when 0), and so may one of the keys-as-rows kernel (unless
// Options.DecodeKMBlockPerChunk; over half caches, or 8-bit ones with
// Options.DecodeF8Direct < 0): each chunk's arithmetic is the
// same in any block, so one, two, three (not dividing the chunk count) and
// all chunks a block give the same bits, with
// two or three copy stages, over half and 8-bit caches, rows of one to
// eight chunks, a window that starts mid-chunk and a row shorter than one
// tile.
func TestGPUDecodeChunksPerBlock(t *testing.T) {
	// Chunks a block (0: from the batch), copy stages of the 8-bit kernel
	// (0: 3; -1: the keys-as-rows kernel instead), one block a chunk for the
	// keys-as-rows kernel.
	type variant struct {
		cpb, stages   int
		kmOnePerChunk bool
	}
	variants := []variant{{0, 0, false}, {1, 0, false}, {2, 0, false}, {3, 0, false}, {32, 0, false}, {3, 2, false},
		{0, 2, false}, {3, -1, false}, {0, -1, true}, {32, 0, true}, {1, 0, true}}
	pairs := make([]*pair, len(variants))
	for i, v := range variants {
		pairs[i] = newPairOpts(t, Options{DecodeChunksPerBlock: v.cpb, DecodeF8Direct: v.stages, DecodeKMBlockPerChunk: v.kmOnePerChunk})
	}
	const blockSize, numBlocks = 16, 400
	seqs := [][2]int{{1, 2000}, {1, 700}, {1, 257}, {1, 40}, {1, 1500}, {1, 1024}, {1, 513}}
	for _, ap := range []kernels.AttentionParams{
		{NumHeads: 16, NumKVHeads: 8, HeadDim: 128},
		{NumHeads: 16, NumKVHeads: 2, HeadDim: 128, SlidingWindow: 300},
		{NumHeads: 32, NumKVHeads: 8, HeadDim: 64, SlidingWindow: 1100},
	} {
		ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
		ap.InputDType = kernels.BF16
		for _, cdt := range []kernels.DType{kernels.F8E4M3, kernels.F16} {
			name := fmt.Sprintf("h%d_kv%d_d%d_w%d_%s", ap.NumHeads, ap.NumKVHeads, ap.HeadDim, ap.SlidingWindow, cdt)
			t.Run(name, func(t *testing.T) {
				var want []float32
				for i, p := range pairs {
					b := p.pagedBatch(blockSize, numBlocks, seqs)
					e, got := p.attentionOverCaches(t, b, ap, cdt, numBlocks, blockSize, 2)
					if i == 0 {
						want = got
						t.Logf("max relative error vs the CPU backend %.2e", e)
						continue
					}
					if !bytes.Equal(kernels.F32Bytes(got), kernels.F32Bytes(want)) {
						t.Errorf("%+v: bits differ from the default's (max relative difference %.3g)", variants[i], maxRelErr(got, want))
					}
				}
			})
		}
	}
}

// Options.DecodeChunk sets the decode attention's chunk length: every
// setting matches the CPU backend, rows of at most 512 keys keep their
// chunks of 128 (the same bits as the default's), and a longer row's bits
// change with the setting (so the option reached the kernels).
func TestGPUDecodeChunkOption(t *testing.T) {
	const blockSize, numBlocks = 16, 400
	seqs := [][2]int{{1, 2000}, {1, 300}, {1, 1500}, {1, 512}, {1, 700}}
	ap := kernels.AttentionParams{NumHeads: 16, NumKVHeads: 8, HeadDim: 128, InputDType: kernels.BF16}
	ap.Scale = float32(1 / math.Sqrt(float64(ap.HeadDim)))
	w := ap.NumHeads * ap.HeadDim
	for _, cdt := range []kernels.DType{kernels.F8E4M3, kernels.F16} {
		t.Run(cdt.String(), func(t *testing.T) {
			var want []float32
			for _, chunk := range []int{0, 512, 1024} {
				p := newPair(t, GEMMRound)
				if chunk > 0 {
					p.g = newGPUOpts(t, Options{GEMM: GEMMRound, DecodeChunk: chunk})
				}
				b := p.pagedBatch(blockSize, numBlocks, seqs)
				e, got := p.attentionOverCaches(t, b, ap, cdt, numBlocks, blockSize, 2)
				t.Logf("chunk %d: max relative error vs the CPU backend %.2e", chunk, e)
				if chunk == 0 {
					want = got
					continue
				}
				for i, sq := range seqs {
					same := bytes.Equal(kernels.F32Bytes(got[i*w:(i+1)*w]), kernels.F32Bytes(want[i*w:(i+1)*w]))
					if short := sq[1] <= 512; same != short {
						t.Errorf("chunk %d, row of %d keys: bits equal to the default's: %v, want %v", chunk, sq[1], same, short)
					}
				}
			}
		})
	}
}

// attentionOverCaches runs attention over b with random K and V caches of
// element type cdt (values uniform in +-scale) on the GPU and, over the
// same values widened to float32, on the CPU backend; it checks them
// within 5e-3 and returns the error and the GPU's output.
func (p *pair) attentionOverCaches(t *testing.T, b pagedBatch, ap kernels.AttentionParams, cdt kernels.DType, numBlocks, blockSize int, scale float32) (float64, []float32) {
	t.Helper()
	width, w := ap.NumKVHeads*ap.HeadDim, ap.NumHeads*ap.HeadDim
	var caches [2]dual
	for j := range caches {
		vals := randVals(p.r, numBlocks*blockSize*width, scale)
		raw := hostBytes(cdt, vals)
		for k := range vals {
			switch cdt {
			case kernels.F8E4M3:
				vals[k] = kernels.F8E4M3ToF32(raw[k])
			case kernels.F16:
				vals[k] = kernels.F16ToF32(kernels.F32ToF16(vals[k]))
			}
		}
		caches[j].g = upload(t, p.g, cdt, raw, cdt, numBlocks, blockSize, width)
		caches[j].c = upload(t, p.c, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, width)
	}
	q := p.rand(kernels.F32, 1, b.numTokens, w)
	out := p.zeros(kernels.F32, b.numTokens, w)
	p.poison(out)
	if err := p.g.Attention(out.g, q.g, caches[0].g, caches[1].g, &b.gpuMeta, ap); err != nil {
		t.Fatal(err)
	}
	if err := p.c.Attention(out.c, q.c, caches[0].c, caches[1].c, &b.cpuMeta, ap); err != nil {
		t.Fatal(err)
	}
	return p.check("attention", out, 5e-3), p.f32(p.g, out.g)
}

// The prefill kernel that runs a KV head's query heads in one block
// (di_prefill_attn_gqa_k, the default over half caches) gives the bits of
// the one-head-a-block kernel (Options.DisablePrefillGQA) at every group
// size it takes (1, 2, 4, 8: 128, 64, 32 and 16 query rows a block) and at
// one it does not (3, which falls back), for both head sizes, block sizes 16
// and 32, a sliding window, and a batch of whole prompts, chunked prompts
// (keys before the rows), a prompt of two rows and decode rows.
func TestGPUPrefillGQA(t *testing.T) {
	one := newGPUOpts(t, Options{DisablePrefillGQA: true})
	p := newPair(t, GEMMRound)
	const numBlocks = 200
	seqs := [][2]int{{300, 300}, {1, 90}, {77, 1000}, {2, 2}, {130, 131}, {1, 5}} // (query rows, keys)
	for _, c := range []struct{ heads, kvHeads, dim, window int }{
		{32, 8, 64, 0}, {16, 16, 64, 0}, {16, 8, 128, 0}, {16, 2, 64, 100}, {24, 8, 64, 0}, {16, 4, 128, 0},
	} {
		for _, blockSize := range []int{16, 32} {
			name := fmt.Sprintf("h%d_kv%d_d%d_w%d_bs%d", c.heads, c.kvHeads, c.dim, c.window, blockSize)
			t.Run(name, func(t *testing.T) {
				ap := kernels.AttentionParams{NumHeads: c.heads, NumKVHeads: c.kvHeads, HeadDim: c.dim,
					SlidingWindow: c.window, Scale: float32(1 / math.Sqrt(float64(c.dim))), InputDType: kernels.BF16}
				b := p.pagedBatch(blockSize, numBlocks, seqs)
				m := b.gpuMeta
				m1 := m
				for _, f := range []*kernels.Tensor{&m1.CuSeqlensQ, &m1.SeqlensK, &m1.BlockTables, &m1.SlotMapping} {
					*f = upload(t, one, kernels.I32, kernels.I32Bytes(p.i32(p.g, *f)), kernels.I32, (*f).Shape()...)
				}
				width, w := c.kvHeads*c.dim, c.heads*c.dim
				both := func(dt kernels.DType, raw []byte, shape ...int) (kernels.Tensor, kernels.Tensor) {
					return upload(t, p.g, dt, raw, dt, shape...), upload(t, one, dt, raw, dt, shape...)
				}
				kg, k1 := both(kernels.F16, hostBytes(kernels.F16, randVals(p.r, numBlocks*blockSize*width, 1)), numBlocks, blockSize, width)
				vg, v1 := both(kernels.F16, hostBytes(kernels.F16, randVals(p.r, numBlocks*blockSize*width, 1)), numBlocks, blockSize, width)
				qg, q1 := both(kernels.F32, kernels.F32Bytes(randVals(p.r, b.numTokens*w, 2)), b.numTokens, w)
				og, err := p.g.Alloc(kernels.F32, b.numTokens, w)
				if err != nil {
					t.Fatal(err)
				}
				o1, err := one.Alloc(kernels.F32, b.numTokens, w)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.g.Attention(og, qg, kg, vg, &m, ap); err != nil {
					t.Fatal(err)
				}
				if err := one.Attention(o1, q1, k1, v1, &m1, ap); err != nil {
					t.Fatal(err)
				}
				got, want := p.f32(p.g, og), p.f32(one, o1)
				nonzero := 0
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("element %d (row %d): %v with a KV head's query heads in one block, %v one head a block", i, i/w, got[i], want[i])
					}
					if want[i] != 0 {
						nonzero++
					}
				}
				if nonzero < len(want)/2 {
					t.Fatalf("only %d of %d outputs are nonzero", nonzero, len(want))
				}
			})
		}
	}
}

// A prefill sequence with fewer keys than query rows, or a cache block out
// of range, is reported at the next Sync (ErrOutOfRange naming attention)
// and its rows are zero, while the other sequence of the batch gets the
// bits it gets alone: on every prefill kernel (the float32 one, tensor
// cores over float32 and half caches, one head or a KV head's query heads
// a block).
func TestGPUPrefillAttentionChecks(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	const blockSize, numBlocks, rows = 16, 20, 70
	for _, c := range []struct {
		name        string
		dim         int
		in, cacheDT kernels.DType
	}{
		{"float32", 40, kernels.F32, kernels.F32},
		{"tensor cores, float32 cache", 64, kernels.BF16, kernels.F32},
		{"tensor cores, half cache, one head a block", 128, kernels.BF16, kernels.F16},
		{"tensor cores, half cache, a KV head a block", 64, kernels.BF16, kernels.F16},
		{"tensor cores, 8-bit cache, head size 128", 128, kernels.BF16, kernels.F8E4M3},
		{"tensor cores, 8-bit cache, head size 64", 64, kernels.BF16, kernels.F8E4M3},
	} {
		for _, bad := range []string{"keys", "block"} {
			t.Run(c.name+"/"+bad, func(t *testing.T) {
				ap := kernels.AttentionParams{NumHeads: 8, NumKVHeads: 2, HeadDim: c.dim,
					Scale: float32(1 / math.Sqrt(float64(c.dim))), InputDType: c.in}
				width, w := ap.NumKVHeads*c.dim, ap.NumHeads*c.dim
				cache := func() kernels.Tensor {
					return upload(t, g, c.cacheDT, hostBytes(c.cacheDT, randVals(p.r, numBlocks*blockSize*width, 1)), c.cacheDT, numBlocks, blockSize, width)
				}
				kc, vc := cache(), cache()
				qv := randVals(p.r, 2*rows*w, 1)
				qs := map[int]kernels.Tensor{ // by row count: both sequences, the good one alone
					2 * rows: upload(t, g, kernels.F32, kernels.F32Bytes(qv), kernels.F32, 2*rows, w),
					rows:     upload(t, g, kernels.F32, kernels.F32Bytes(qv[:rows*w]), kernels.F32, rows, w),
				}
				ints := func(xs []int32, shape ...int) kernels.Tensor {
					return upload(t, g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
				}
				// Sequence 0 is good: blocks 0..4; sequence 1 uses 5..9.
				tables := []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
				keys := []int32{rows, rows}
				if bad == "keys" {
					keys[1] = rows - 20
				} else {
					tables[7] = numBlocks + 3
				}
				// run returns the output and what the Sync after it reported
				// (before the download, which would report it too).
				run := func(m kernels.AttentionMetadata, n int) ([]float32, error) {
					out := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, n*w, 9)), kernels.F32, n, w)
					if err := g.Attention(out, qs[n], kc, vc, &m, ap); err != nil {
						t.Fatal(err)
					}
					err := g.Sync()
					vals, derr := kernels.ToF32(g, out)
					if derr != nil {
						t.Fatal(derr)
					}
					return vals, err
				}
				got, err := run(kernels.AttentionMetadata{NumSeqs: 2, NumTokens: 2 * rows, BlockSize: blockSize,
					CuSeqlensQ: ints([]int32{0, rows, 2 * rows}, 3), SeqlensK: ints(keys, 2), BlockTables: ints(tables, 2, 5)}, 2*rows)
				if !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "attention") {
					t.Fatalf("Sync after a bad sequence: %v, want ErrOutOfRange naming attention", err)
				}
				alone, err := run(kernels.AttentionMetadata{NumSeqs: 1, NumTokens: rows, BlockSize: blockSize,
					CuSeqlensQ: ints([]int32{0, rows}, 2), SeqlensK: ints(keys[:1], 1), BlockTables: ints(tables[:5], 1, 5)}, rows)
				if err != nil {
					t.Fatalf("the good sequence alone: %v", err)
				}
				for i := range alone {
					if math.Float32bits(got[i]) != math.Float32bits(alone[i]) {
						t.Fatalf("good sequence, element %d: %v beside the bad one, %v alone", i, got[i], alone[i])
					}
				}
				if bad == "keys" {
					for i := rows * w; i < 2*rows*w; i++ {
						if got[i] != 0 {
							t.Fatalf("bad sequence, element %d = %v, want 0", i-rows*w, got[i])
						}
					}
				}
			})
		}
	}
}
