package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// refLinear is y = x W^T + b in float64.
func refLinear(x, w, bias []float32, m, n, k int) []float32 {
	out := make([]float32, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for kk := range k {
				s += float64(x[i*k+kk]) * float64(w[j*k+kk])
			}
			if bias != nil {
				s += float64(bias[j])
			}
			out[i*n+j] = float32(s)
		}
	}
	return out
}

func TestLinear(t *testing.T) {
	b := newTestBackend(t, 3)
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, tc := range []struct {
			m, n, k int
			bias    bool
		}{{1, 5, 3, false}, {7, 33, 64, true}, {12, 100, 130, false}, {3, 300, 257, true}} {
			t.Run(fmt.Sprintf("%v/%dx%dx%d/bias=%v", dt, tc.m, tc.n, tc.k, tc.bias), func(t *testing.T) {
				r := rand.New(rand.NewPCG(1, uint64(tc.n)))
				x := randVals(r, tc.m*tc.k, 1)
				w := roundTo(dt, randVals(r, tc.n*tc.k, 0.5))
				var bias []float32
				var bt kernels.Tensor
				if tc.bias {
					bias = randVals(r, tc.n, 1)
					bt = put(t, b, kernels.F32, bias, tc.n)
				}
				out := alloc(t, b, tc.m, tc.n)
				err := b.Linear(out, put(t, b, kernels.F32, x, tc.m, tc.k), put(t, b, dt, w, tc.n, tc.k), bt)
				if err != nil {
					t.Fatal(err)
				}
				checkClose(t, "linear", vals(out), refLinear(x, w, bias, tc.m, tc.n, tc.k), 1e-5)
			})
		}
	}
}

// TestBatchInvarianceLinear: a row alone and inside a batch of 7, on backends
// with different thread counts, gives bit-identical outputs.
func TestBatchInvarianceLinear(t *testing.T) {
	const n, k = 333, 200
	r := rand.New(rand.NewPCG(2, 2))
	batch := randVals(r, 7*k, 1)
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		w := randVals(r, n*k, 0.5)
		var ref []float32
		for _, threads := range []int{1, 2, 5} {
			b := newTestBackend(t, threads)
			wt := put(t, b, dt, w, n, k)
			for row := range 7 {
				one := alloc(t, b, 1, n)
				if err := b.Linear(one, put(t, b, kernels.F32, batch[row*k:(row+1)*k], 1, k), wt, nil); err != nil {
					t.Fatal(err)
				}
				all := alloc(t, b, 7, n)
				if err := b.Linear(all, put(t, b, kernels.F32, batch, 7, k), wt, nil); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, fmt.Sprintf("%v row %d threads %d alone vs batch", dt, row, threads), vals(one), vals(all)[row*n:(row+1)*n])
				if row == 3 {
					if ref == nil {
						ref = vals(one)
					}
					checkIdentical(t, fmt.Sprintf("%v threads %d vs 1", dt, threads), vals(one), ref)
				}
			}
		}
	}
}

func refNorm(x, w []float32, eps float32) []float32 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	r := 1 / math.Sqrt(s/float64(len(x))+float64(eps))
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(float64(v) * r * float64(w[i]))
	}
	return out
}

func TestNorms(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(3, 3))
	const rows, n, eps = 300, 130, 1e-6
	x := randVals(r, rows*n, 2)
	res := randVals(r, rows*n, 2)
	w := randVals(r, n, 1)
	var want, wantRes []float32
	for i := range rows {
		want = append(want, refNorm(x[i*n:(i+1)*n], w, eps)...)
	}
	out := alloc(t, b, rows, n)
	if err := b.RMSNorm(out, put(t, b, kernels.F32, x, rows, n), put(t, b, kernels.F32, w, n), eps); err != nil {
		t.Fatal(err)
	}
	checkClose(t, "rms_norm", vals(out), want, 1e-6)

	want = want[:0]
	for i := range x {
		wantRes = append(wantRes, x[i]+res[i])
	}
	for i := range rows {
		want = append(want, refNorm(wantRes[i*n:(i+1)*n], w, eps)...)
	}
	xt := put(t, b, kernels.F32, x, rows, n)
	rt := put(t, b, kernels.F32, res, rows, n)
	if err := b.AddRMSNorm(xt, rt, xt, put(t, b, kernels.F32, w, n), eps); err != nil { // out aliases x
		t.Fatal(err)
	}
	checkIdentical(t, "add_rms_norm residual", vals(rt), wantRes)
	checkClose(t, "add_rms_norm", vals(xt), want, 1e-6)
}

func TestSiLUMulAddConcat(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(4, 4))
	const rows, n = 5, 7
	gu := randVals(r, rows*2*n, 4)
	out := alloc(t, b, rows, n)
	if err := b.SiLUMul(out, put(t, b, kernels.F32, gu, rows, 2*n)); err != nil {
		t.Fatal(err)
	}
	var want []float32
	for i := range rows {
		for j := range n {
			g, u := float64(gu[i*2*n+j]), float64(gu[i*2*n+n+j])
			want = append(want, float32(g/(1+math.Exp(-g))*u))
		}
	}
	checkClose(t, "silu_mul", vals(out), want, 1e-6)

	a, c := randVals(r, rows*n, 1), randVals(r, rows*3, 1)
	sum := alloc(t, b, rows, n)
	if err := b.Add(sum, put(t, b, kernels.F32, a, rows, n), put(t, b, kernels.F32, gu[:rows*n], rows, n)); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i] = a[i] + gu[i]
	}
	checkIdentical(t, "add", vals(sum), want)
	cat := alloc(t, b, rows, n+3)
	if err := b.Concat(cat, put(t, b, kernels.F32, a, rows, n), put(t, b, kernels.F32, c, rows, 3)); err != nil {
		t.Fatal(err)
	}
	want = want[:0]
	for i := range rows {
		want = append(append(want, a[i*n:(i+1)*n]...), c[i*3:(i+1)*3]...)
	}
	checkIdentical(t, "concat", vals(cat), want)

	// SplitColumns undoes Concat; bad widths, shapes and dtypes are refused.
	pa, pc := alloc(t, b, rows, n), alloc(t, b, rows, 3)
	if err := b.SplitColumns(cat, pa, pc); err != nil {
		t.Fatal(err)
	}
	checkIdentical(t, "split_columns a", vals(pa), a)
	checkIdentical(t, "split_columns b", vals(pc), c)
	for name, parts := range map[string][]kernels.Tensor{
		"no parts":     nil,
		"widths short": {pa},
		"widths long":  {pa, pc, alloc(t, b, rows, 1)},
		"rows":         {pa, alloc(t, b, rows+1, 3)},
		"dtype":        {pa, putI32(t, b, make([]int32, rows*3), rows, 3)},
	} {
		if err := b.SplitColumns(cat, parts...); err == nil {
			t.Errorf("split_columns, %s: no error", name)
		}
	}
}

func TestEmbeddingAndLogits(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(5, 5))
	const vocab, hidden = 50, 24
	table := roundTo(kernels.BF16, randVals(r, vocab*hidden, 1))
	tt := put(t, b, kernels.BF16, table, vocab, hidden)
	ids := []int32{3, 49, 0, 3}
	emb := alloc(t, b, len(ids), hidden)
	if err := b.Embedding(emb, tt, putI32(t, b, ids, len(ids))); err != nil {
		t.Fatal(err)
	}
	var want []float32
	for _, id := range ids {
		want = append(want, table[int(id)*hidden:(int(id)+1)*hidden]...)
	}
	checkIdentical(t, "embedding", vals(emb), want)

	err := b.Embedding(alloc(t, b, 1, hidden), tt, putI32(t, b, []int32{vocab}, 1))
	if !errors.Is(err, kernels.ErrOutOfRange) {
		t.Errorf("embedding of id %d: err %v, want ErrOutOfRange", vocab, err)
	}

	norm := randVals(r, hidden, 1)
	rows := []int32{3, 1}
	logits := alloc(t, b, len(rows), vocab)
	if err := b.Logits(logits, emb, putI32(t, b, rows, len(rows)), put(t, b, kernels.F32, norm, hidden), tt, 1e-5); err != nil {
		t.Fatal(err)
	}
	var x []float32
	for _, row := range rows {
		x = append(x, refNorm(want[int(row)*hidden:(int(row)+1)*hidden], norm, 1e-5)...)
	}
	checkClose(t, "logits", vals(logits), refLinear(x, table, nil, len(rows), vocab, hidden), 1e-5)

	all := alloc(t, b, len(ids), vocab)
	if err := b.Logits(all, emb, nil, nil, tt, 0); err != nil {
		t.Fatal(err)
	}
	checkClose(t, "logits all rows", vals(all), refLinear(want, table, nil, len(ids), vocab, hidden), 1e-5)
}

// refRoPE rotates with complex arithmetic in float64, independently of the
// layout code: pair i is (i, i+half) or (2i, 2i+1).
func refRoPE(x []float32, pos []int32, cos, sin []float32, p kernels.RoPEParams) []float32 {
	out := slices.Clone(x)
	half := p.RotaryDim / 2
	width := p.NumHeads * p.HeadSize
	for i, ps := range pos {
		for h := range p.NumHeads {
			base := i*width + h*p.HeadSize + p.Offset
			for j := range half {
				a, bb := base+j, base+j+half
				if p.Interleaved {
					a, bb = base+2*j, base+2*j+1
				}
				z := complex(float64(x[a]), float64(x[bb])) * complex(float64(cos[int(ps)*half+j]), float64(sin[int(ps)*half+j]))
				out[a], out[bb] = float32(real(z)), float32(imag(z))
			}
		}
	}
	return out
}

func TestRoPE(t *testing.T) {
	b := newTestBackend(t, 2)
	r := rand.New(rand.NewPCG(6, 6))
	const maxPos = 40
	for _, p := range []kernels.RoPEParams{
		{NumHeads: 3, HeadSize: 8, RotaryDim: 8},
		{NumHeads: 2, HeadSize: 12, Offset: 4, RotaryDim: 8, Interleaved: true},
		{NumHeads: 4, HeadSize: 10, RotaryDim: 6},
	} {
		half := p.RotaryDim / 2
		cos, sin := make([]float32, maxPos*half), make([]float32, maxPos*half)
		for i := range cos {
			a := r.Float64() * 6
			cos[i], sin[i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
		pos := []int32{0, 7, 39, 7, 3}
		x := randVals(r, len(pos)*p.NumHeads*p.HeadSize, 1)
		xt := put(t, b, kernels.F32, x, len(pos), p.NumHeads*p.HeadSize)
		err := b.RoPE(xt, putI32(t, b, pos, len(pos)), put(t, b, kernels.F32, cos, maxPos, half), put(t, b, kernels.F32, sin, maxPos, half), p)
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, fmt.Sprintf("rope %+v", p), vals(xt), refRoPE(x, pos, cos, sin, p), 1e-6)
	}
}

// seqSpec is one sequence of an attention batch: qLen new rows, kLen keys.
type seqSpec struct{ qLen, kLen int }

// latentCache returns a cache of numBlocks blocks of bs rows of width
// floats holding, for each sequence of specs in order, kLen rows drawn
// from randVals(r, ..., 1) at its slots (pagedBatch's).
func latentCache(t testing.TB, b *Backend, r *rand.Rand, specs []seqSpec, slots [][]int32, numBlocks, bs, width int) kernels.Tensor {
	t.Helper()
	cache := alloc(t, b, numBlocks, bs, width)
	for s, sp := range specs {
		lat := randVals(r, sp.kLen*width, 1)
		if err := b.WriteCache(cache, put(t, b, kernels.F32, lat, sp.kLen, width), putI32(t, b, slots[s], sp.kLen), 0); err != nil {
			t.Fatal(err)
		}
	}
	return cache
}

// pagedBatch builds AttentionMetadata for specs over a cache of numBlocks
// blocks, giving each sequence a shuffled set of blocks; slots[s][t] is the
// cache slot of key t of sequence s.
func pagedBatch(t testing.TB, b *Backend, r *rand.Rand, specs []seqSpec, blockSize, numBlocks int) (*kernels.AttentionMetadata, [][]int32) {
	t.Helper()
	perm := r.Perm(numBlocks)
	maxBlocks := 0
	for _, s := range specs {
		maxBlocks = max(maxBlocks, (s.kLen+blockSize-1)/blockSize)
	}
	cu := []int32{0}
	var seqlensK, tables []int32
	slots := make([][]int32, len(specs))
	var maxQ, maxK int
	for i, s := range specs {
		need := (s.kLen + blockSize - 1) / blockSize
		row := make([]int32, maxBlocks)
		for j := range row {
			row[j] = -1
		}
		for j := range need {
			row[j] = int32(perm[0])
			perm = perm[1:]
		}
		for k := range s.kLen {
			slots[i] = append(slots[i], row[k/blockSize]*int32(blockSize)+int32(k%blockSize))
		}
		tables = append(tables, row...)
		cu = append(cu, cu[len(cu)-1]+int32(s.qLen))
		seqlensK = append(seqlensK, int32(s.kLen))
		maxQ, maxK = max(maxQ, s.qLen), max(maxK, s.kLen)
	}
	var sm []int32
	for i, s := range specs {
		sm = append(sm, slots[i][s.kLen-s.qLen:]...)
	}
	m := &kernels.AttentionMetadata{
		NumSeqs: len(specs), NumTokens: int(cu[len(cu)-1]), MaxSeqlenQ: maxQ, MaxSeqlenK: maxK, BlockSize: blockSize,
		CuSeqlensQ:  putI32(t, b, cu, len(cu)),
		SeqlensK:    putI32(t, b, seqlensK, len(specs)),
		BlockTables: putI32(t, b, tables, len(specs), maxBlocks),
		SlotMapping: putI32(t, b, sm, len(sm)),
	}
	return m, slots
}

// refAttention is dense causal attention in float64 over contiguous keys:
// k and v [kLen][numKV*d], q [qLen][nh*d]; row j sees keys 0..kLen-qLen+j,
// only the last window of them when window > 0.
func refAttention(q, k, v []float32, qLen, kLen, nh, nkv, d int, scale float32, window int) []float32 {
	out := make([]float32, qLen*nh*d)
	group := nh / nkv
	for j := range qLen {
		vis := kLen - qLen + j + 1
		first := 0
		if window > 0 {
			first = max(0, vis-window)
		}
		for h := range nh {
			kh := h / group
			sc := make([]float64, vis)
			mx := math.Inf(-1)
			for t := first; t < vis; t++ {
				var s float64
				for x := range d {
					s += float64(q[j*nh*d+h*d+x]) * float64(k[t*nkv*d+kh*d+x])
				}
				sc[t] = s * float64(scale)
				mx = math.Max(mx, sc[t])
			}
			var sum float64
			for t := first; t < vis; t++ {
				sc[t] = math.Exp(sc[t] - mx)
				sum += sc[t]
			}
			for x := range d {
				var o float64
				for t := first; t < vis; t++ {
					o += sc[t] / sum * float64(v[t*nkv*d+kh*d+x])
				}
				out[j*nh*d+h*d+x] = float32(o)
			}
		}
	}
	return out
}

func TestAttentionPagedMatchesDense(t *testing.T) {
	const nh, nkv, d, bs, numBlocks = 4, 2, 16, 4, 160
	b := newTestBackend(t, 3)
	// Prefill, chunked prefill over a cached prefix, decode, a one-token
	// prompt, and a long chunk that spans several key tiles and row chunks.
	specs := []seqSpec{{5, 5}, {3, 9}, {1, 12}, {1, 1}, {6, 13}, {70, 300}}
	for _, window := range []int{0, 7, 150} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(window)))
			m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
			kc, vc := alloc(t, b, numBlocks, bs, nkv*d), alloc(t, b, numBlocks, bs, nkv*d)
			var qAll, want []float32
			for s, sp := range specs {
				k := randVals(r, sp.kLen*nkv*d, 1)
				v := randVals(r, sp.kLen*nkv*d, 1)
				q := randVals(r, sp.qLen*nh*d, 1)
				sm := putI32(t, b, slots[s], sp.kLen)
				if err := b.WriteCache(kc, put(t, b, kernels.F32, k, sp.kLen, nkv*d), sm, 0); err != nil {
					t.Fatal(err)
				}
				if err := b.WriteCache(vc, put(t, b, kernels.F32, v, sp.kLen, nkv*d), sm, 0); err != nil {
					t.Fatal(err)
				}
				qAll = append(qAll, q...)
				want = append(want, refAttention(q, k, v, sp.qLen, sp.kLen, nh, nkv, d, 0.3, window)...)
			}
			p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.3, SlidingWindow: window}
			out := alloc(t, b, m.NumTokens, nh*d)
			if err := b.Attention(out, put(t, b, kernels.F32, qAll, m.NumTokens, nh*d), kc, vc, m, p); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "paged attention", vals(out), want, 1e-5)

			// Batch invariance: each sequence alone, and single rows decoded
			// alone, give bit-identical rows.
			row := 0
			for s, sp := range specs {
				m1 := singleSeqMeta(t, b, m, s)
				q1 := qAll[row*nh*d : (row+sp.qLen)*nh*d]
				o1 := alloc(t, b, sp.qLen, nh*d)
				if err := b.Attention(o1, put(t, b, kernels.F32, q1, sp.qLen, nh*d), kc, vc, m1, p); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, fmt.Sprintf("sequence %d alone vs batch", s), vals(o1), vals(out)[row*nh*d:(row+sp.qLen)*nh*d])
				for _, j := range []int{0, sp.qLen / 2, sp.qLen - 1} {
					md := decodeMeta(t, b, m, s, j)
					od := alloc(t, b, 1, nh*d)
					qj := qAll[(row+j)*nh*d : (row+j+1)*nh*d]
					if err := b.Attention(od, put(t, b, kernels.F32, qj, 1, nh*d), kc, vc, md, p); err != nil {
						t.Fatal(err)
					}
					checkIdentical(t, fmt.Sprintf("sequence %d row %d decoded alone vs batch", s, j), vals(od), vals(out)[(row+j)*nh*d:(row+j+1)*nh*d])
				}
				row += sp.qLen
			}
			// Rows laid out as a speculative decode's verify rows (one
			// chunk a run, 32 rows at most: the last sequence's 300 keys
			// in 70 rows take three) give the bits of the batch rows.
			attend := func(o, q kernels.Tensor, mv *kernels.AttentionMetadata) error {
				return b.Attention(o, q, kc, vc, mv, p)
			}
			checkVerifyRows(t, b, m, qAll, vals(out), nh*d, nh*d, attend, 0, 1, 4)
			checkVerifyRows(t, b, m, qAll, vals(out), nh*d, nh*d, attend, 5)
		})
	}
}

// 16-bit IEEE-half and 8-bit E4M3 caches (Options.KVCacheDType):
// WriteCache rounds each value as kernels.F32ToF16 / F32ToF8E4M3 do, and
// Attention over them gives the bits of Attention over float32 caches
// holding the rounded values, for prefill, chunked and decode rows, with
// and without a window.
func TestAttentionNarrowCache(t *testing.T) {
	const nh, nkv, d, bs, numBlocks = 4, 2, 16, 4, 160
	for _, tc := range []struct {
		dt     kernels.DType
		big    float32                       // largest magnitude written (E4M3: beyond its range, and -Inf, saturated)
		stored func(c *Tensor, i int) uint16 // the code at element i
		code   func(float32) uint16
		value  func(uint16) float32
	}{
		{kernels.F16, 30, func(c *Tensor, i int) uint16 { return c.u16[i] }, kernels.F32ToF16, kernels.F16ToF32},
		{kernels.F8E4M3, 300, func(c *Tensor, i int) uint16 { return uint16(c.u8[i]) },
			func(x float32) uint16 { return uint16(kernels.F32ToF8E4M3(x)) },
			func(h uint16) float32 { return kernels.F8E4M3ToF32(uint8(h)) }},
	} {
		t.Run(tc.dt.String(), func(t *testing.T) {
			b := New(Options{Threads: 3, KVCacheDType: tc.dt})
			t.Cleanup(func() { b.Close() })
			if got := b.KVCacheDType(kernels.BF16); got != tc.dt {
				t.Errorf("KVCacheDType = %v, want %v", got, tc.dt)
			}
			if got := newTestBackend(t, 1).KVCacheDType(kernels.BF16); got != kernels.F32 {
				t.Errorf("KVCacheDType without the option = %v, want F32", got)
			}
			specs := []seqSpec{{5, 5}, {3, 9}, {1, 12}, {70, 300}}
			for _, window := range []int{0, 7} {
				r := rand.New(rand.NewPCG(9, uint64(window)))
				m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
				kn, vn := allocDT(t, b, tc.dt, numBlocks, bs, nkv*d), allocDT(t, b, tc.dt, numBlocks, bs, nkv*d)
				kf, vf := alloc(t, b, numBlocks, bs, nkv*d), alloc(t, b, numBlocks, bs, nkv*d)
				var qAll []float32
				for s, sp := range specs {
					sm := putI32(t, b, slots[s], sp.kLen)
					for _, c := range [][2]kernels.Tensor{{kn, kf}, {vn, vf}} {
						x := randVals(r, sp.kLen*nkv*d, tc.big)
						if tc.dt == kernels.F8E4M3 {
							x[0] = float32(math.Inf(-1))
						}
						if err := b.WriteCache(c[0], put(t, b, kernels.F32, x, sp.kLen, nkv*d), sm, 0); err != nil {
							t.Fatal(err)
						}
						rounded := make([]float32, len(x))
						for i, v := range x {
							rounded[i] = tc.value(tc.code(v))
						}
						if err := b.WriteCache(c[1], put(t, b, kernels.F32, rounded, sp.kLen, nkv*d), sm, 0); err != nil {
							t.Fatal(err)
						}
						for i, slot := range slots[s] {
							for e := range nkv * d {
								got := tc.stored(c[0].(*Tensor), int(slot)*nkv*d+e)
								if want := tc.code(x[i*nkv*d+e]); got != want {
									t.Fatalf("WriteCache(%v) = %#04x, want %#04x", x[i*nkv*d+e], got, want)
								}
							}
						}
					}
					qAll = append(qAll, randVals(r, sp.qLen*nh*d, 0.01)...)
				}
				p := kernels.AttentionParams{NumHeads: nh, NumKVHeads: nkv, HeadDim: d, Scale: 0.3, SlidingWindow: window}
				q := put(t, b, kernels.F32, qAll, m.NumTokens, nh*d)
				on, of := alloc(t, b, m.NumTokens, nh*d), alloc(t, b, m.NumTokens, nh*d)
				if err := b.Attention(on, q, kn, vn, m, p); err != nil {
					t.Fatal(err)
				}
				if err := b.Attention(of, q, kf, vf, m, p); err != nil {
					t.Fatal(err)
				}
				for i, v := range vals(of) {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("window %d: output %d = %v: the comparison below would see no values", window, i, v)
					}
				}
				checkIdentical(t, fmt.Sprintf("window %d: %v caches vs float32 caches of the rounded values", window, tc.dt), vals(on), vals(of))
				if err := b.Attention(on, q, kn, vf, m, p); !errors.Is(err, kernels.ErrDType) {
					t.Errorf("mixed K and V cache types: %v, want ErrDType", err)
				}
			}
		})
	}
}

// decodeMeta is the metadata of row j of sequence s computed alone, as a
// decode step: one query seeing the keys that row sees in the batch.
func decodeMeta(t testing.TB, b *Backend, m *kernels.AttentionMetadata, s, j int) *kernels.AttentionMetadata {
	cu := m.CuSeqlensQ.(*Tensor).i32
	qLen := int(cu[s+1] - cu[s])
	kLen := int(m.SeqlensK.(*Tensor).i32[s]) - qLen + j + 1
	bt := m.BlockTables.(*Tensor)
	mb := bt.shape[1]
	return &kernels.AttentionMetadata{
		NumSeqs: 1, NumTokens: 1, MaxSeqlenQ: 1, MaxSeqlenK: kLen, BlockSize: m.BlockSize,
		CuSeqlensQ:  putI32(t, b, []int32{0, 1}, 2),
		SeqlensK:    putI32(t, b, []int32{int32(kLen)}, 1),
		BlockTables: putI32(t, b, bt.i32[s*mb:(s+1)*mb], 1, mb),
		SlotMapping: putI32(t, b, m.SlotMapping.(*Tensor).i32[int(cu[s])+j:int(cu[s])+j+1], 1),
	}
}

// verifyMeta lays out the rows of sequences seqs of a batch as a
// speculative decode lays out its verify rows: each row a sequence of its
// own with one query, the keys it sees, and its sequence's block table.
func verifyMeta(t testing.TB, b *Backend, m *kernels.AttentionMetadata, seqs ...int) (*kernels.AttentionMetadata, []int) {
	cu := m.CuSeqlensQ.(*Tensor).i32
	bt := m.BlockTables.(*Tensor)
	mb := bt.shape[1]
	cuV, kV := []int32{0}, []int32{}
	var tables, slots []int32
	var rows []int // the batch row of each verify row
	maxK := 0
	for _, s := range seqs {
		qLen := int(cu[s+1] - cu[s])
		for j := range qLen {
			kLen := int(m.SeqlensK.(*Tensor).i32[s]) - qLen + j + 1
			maxK = max(maxK, kLen)
			cuV = append(cuV, cuV[len(cuV)-1]+1)
			kV = append(kV, int32(kLen))
			tables = append(tables, bt.i32[s*mb:(s+1)*mb]...)
			slots = append(slots, m.SlotMapping.(*Tensor).i32[int(cu[s])+j])
			rows = append(rows, int(cu[s])+j)
		}
	}
	n := len(rows)
	return &kernels.AttentionMetadata{
		NumSeqs: n, NumTokens: n, MaxSeqlenQ: 1, MaxSeqlenK: maxK, BlockSize: m.BlockSize,
		CuSeqlensQ:  putI32(t, b, cuV, n+1),
		SeqlensK:    putI32(t, b, kV, n),
		BlockTables: putI32(t, b, tables, n, mb),
		SlotMapping: putI32(t, b, slots, n),
	}, rows
}

// checkVerifyRows runs attend over the rows of seqs laid out as verify rows
// (verifyMeta: runs of one-row sequences over one table, which the plan
// attends as one chunk) and checks each against its row of the batch's
// output out (w values a row): the same bits.
func checkVerifyRows(t *testing.T, b *Backend, m *kernels.AttentionMetadata, qAll, out []float32, qw, w int, attend func(o, q kernels.Tensor, m *kernels.AttentionMetadata) error, seqs ...int) {
	t.Helper()
	mv, rows := verifyMeta(t, b, m, seqs...)
	var q []float32
	for _, r := range rows {
		q = append(q, qAll[r*qw:(r+1)*qw]...)
	}
	o := alloc(t, b, len(rows), w)
	if err := attend(o, put(t, b, kernels.F32, q, len(rows), qw), mv); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		checkIdentical(t, fmt.Sprintf("sequences %v as verify rows: row %d", seqs, r), vals(o)[i*w:(i+1)*w], out[r*w:(r+1)*w])
	}
}

// singleSeqMeta cuts sequence s out of a batch's metadata.
func singleSeqMeta(t testing.TB, b *Backend, m *kernels.AttentionMetadata, s int) *kernels.AttentionMetadata {
	cu := m.CuSeqlensQ.(*Tensor).i32
	bt := m.BlockTables.(*Tensor)
	lo, hi := cu[s], cu[s+1]
	mb := bt.shape[1]
	return &kernels.AttentionMetadata{
		NumSeqs: 1, NumTokens: int(hi - lo), MaxSeqlenQ: int(hi - lo), MaxSeqlenK: m.MaxSeqlenK, BlockSize: m.BlockSize,
		CuSeqlensQ:  putI32(t, b, []int32{0, hi - lo}, 2),
		SeqlensK:    putI32(t, b, m.SeqlensK.(*Tensor).i32[s:s+1], 1),
		BlockTables: putI32(t, b, bt.i32[s*mb:(s+1)*mb], 1, mb),
		SlotMapping: putI32(t, b, m.SlotMapping.(*Tensor).i32[lo:hi], int(hi-lo)),
	}
}

// TestMLAAttention checks absorbed latent attention against the explicit
// form: k_nope = W_UK c_kv, v = W_UV c_kv, standard attention on
// [q_nope, q_pe] . [k_nope, k_pe]; with the default key segments (every
// row here in one) and with segments of one key tile, so that the longest
// sequence's rows span three segments merged (mlaSegmentKeys). Either way a
// row's bits are the same alone, in a batch, as verify rows, in groups,
// under 1, 2 or 3 threads and on the portable Go path.
func TestMLAAttention(t *testing.T) {
	for _, seg := range []int{0, keyTile} {
		t.Run(fmt.Sprintf("segment keys %d", seg), func(t *testing.T) { testMLAAttention(t, seg) })
	}
}

func testMLAAttention(t *testing.T, segKeys int) {
	const nh, nope, rope, kvl, vd, bs, numBlocks = 3, 8, 4, 12, 6, 4, 96
	b := newTestBackend(t, 2)
	b.mla.segmentKeys = segKeys
	r := rand.New(rand.NewPCG(8, 8))
	specs := []seqSpec{{4, 4}, {2, 7}, {1, 10}, {45, 270}}
	m, slots := pagedBatch(t, b, r, specs, bs, numBlocks)
	others := []*Backend{newTestBackend(t, 1), newTestBackend(t, 3), New(Options{Threads: 2, PureGo: true})}
	t.Cleanup(func() { others[2].Close() })
	for _, o := range others {
		o.mla.segmentKeys = segKeys
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		w := roundTo(dt, randVals(r, nh*(nope+vd)*kvl, 0.5))
		wt := put(t, b, dt, w, nh*(nope+vd), kvl)
		cache := alloc(t, b, numBlocks, bs, kvl+rope)
		var qAll, want []float32
		for s, sp := range specs {
			lat := randVals(r, sp.kLen*(kvl+rope), 1)
			if err := b.WriteCache(cache, put(t, b, kernels.F32, lat, sp.kLen, kvl+rope), putI32(t, b, slots[s], sp.kLen), 0); err != nil {
				t.Fatal(err)
			}
			q := randVals(r, sp.qLen*nh*(nope+rope), 1)
			qAll = append(qAll, q...)
			// Explicit keys [kLen][nh*(nope+rope)] and values [kLen][nh*vd],
			// computed without absorption.
			keys := make([]float32, sp.kLen*nh*(nope+rope))
			values := make([]float32, sp.kLen*nh*vd)
			for tk := range sp.kLen {
				c := lat[tk*(kvl+rope) : tk*(kvl+rope)+kvl]
				pe := lat[tk*(kvl+rope)+kvl : (tk+1)*(kvl+rope)]
				for h := range nh {
					for x := range nope {
						var s float64
						for cc := range kvl {
							s += float64(w[(h*(nope+vd)+x)*kvl+cc]) * float64(c[cc])
						}
						keys[tk*nh*(nope+rope)+h*(nope+rope)+x] = float32(s)
					}
					copy(keys[tk*nh*(nope+rope)+h*(nope+rope)+nope:], pe)
					for x := range vd {
						var s float64
						for cc := range kvl {
							s += float64(w[(h*(nope+vd)+nope+x)*kvl+cc]) * float64(c[cc])
						}
						values[tk*nh*vd+h*vd+x] = float32(s)
					}
				}
			}
			want = append(want, refMLA(q, keys, values, sp.qLen, sp.kLen, nh, nope+rope, vd, 0.25)...)
		}
		out := alloc(t, b, m.NumTokens, nh*vd)
		p := kernels.MLAParams{NumHeads: nh, NopeDim: nope, RopeDim: rope, KVLoraRank: kvl, VHeadDim: vd, Scale: 0.25}
		if err := b.MLAAttention(out, put(t, b, kernels.F32, qAll, m.NumTokens, nh*(nope+rope)), cache, wt, m, p); err != nil {
			t.Fatal(err)
		}
		checkClose(t, fmt.Sprintf("mla %v", dt), vals(out), want, 1e-5)
		// Other thread counts and the portable Go path: the same bits
		// (tensors of one CPU backend serve another).
		for i, ob := range others {
			oo := alloc(t, b, m.NumTokens, nh*vd)
			if err := ob.MLAAttention(oo, put(t, b, kernels.F32, qAll, m.NumTokens, nh*(nope+rope)), cache, wt, m, p); err != nil {
				t.Fatal(err)
			}
			checkIdentical(t, fmt.Sprintf("mla %v on backend %d (1, 3 threads, Go path)", dt, i), vals(oo), vals(out))
		}
		// Items absorbed and projected in groups of at most rowChunk rows
		// (here 7, 32 and 13 rows) give the bits of one group.
		b.mla.groupFloats = rowChunk * nh * (kvl + rope)
		grouped := alloc(t, b, m.NumTokens, nh*vd)
		if err := b.MLAAttention(grouped, put(t, b, kernels.F32, qAll, m.NumTokens, nh*(nope+rope)), cache, wt, m, p); err != nil {
			t.Fatal(err)
		}
		b.mla.groupFloats = 0
		checkIdentical(t, fmt.Sprintf("mla %v in groups", dt), vals(grouped), vals(out))
		// Rows decoded alone are bit-identical to their batch rows.
		row := 0
		for s, sp := range specs {
			for _, j := range []int{0, sp.qLen - 1} {
				od := alloc(t, b, 1, nh*vd)
				qj := qAll[(row+j)*nh*(nope+rope) : (row+j+1)*nh*(nope+rope)]
				if err := b.MLAAttention(od, put(t, b, kernels.F32, qj, 1, nh*(nope+rope)), cache, wt, decodeMeta(t, b, m, s, j), p); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, fmt.Sprintf("mla %v sequence %d row %d alone", dt, s, j), vals(od), vals(out)[(row+j)*nh*vd:(row+j+1)*nh*vd])
			}
			row += sp.qLen
		}
		// The rows as verify rows: one chunk a run of one table's rows.
		attend := func(o, q kernels.Tensor, mv *kernels.AttentionMetadata) error {
			return b.MLAAttention(o, q, cache, wt, mv, p)
		}
		checkVerifyRows(t, b, m, qAll, vals(out), nh*(nope+rope), nh*vd, attend, 0, 1)
		checkVerifyRows(t, b, m, qAll, vals(out), nh*(nope+rope), nh*vd, attend, 3)
	}
}

// refMLA is dense causal attention with qk head dim dq and value head dim dv.
func refMLA(q, k, v []float32, qLen, kLen, nh, dq, dv int, scale float32) []float32 {
	out := make([]float32, qLen*nh*dv)
	for j := range qLen {
		vis := kLen - qLen + j + 1
		for h := range nh {
			sc := make([]float64, vis)
			mx := math.Inf(-1)
			for t := range vis {
				var s float64
				for x := range dq {
					s += float64(q[j*nh*dq+h*dq+x]) * float64(k[t*nh*dq+h*dq+x])
				}
				sc[t] = s * float64(scale)
				mx = math.Max(mx, sc[t])
			}
			var sum float64
			for t := range sc {
				sc[t] = math.Exp(sc[t] - mx)
				sum += sc[t]
			}
			for x := range dv {
				var o float64
				for t := range vis {
					o += sc[t] / sum * float64(v[t*nh*dv+h*dv+x])
				}
				out[j*nh*dv+h*dv+x] = float32(o)
			}
		}
	}
	return out
}

// The plan attends runs of one-row sequences over one block table (verify
// rows) as one chunk of rows, and nothing else: not rows over other
// tables, not a run whose key counts decrease, not a sequence of several
// rows, not more than rowChunk rows, and not so few items that a worker
// would idle.
func TestPlanItemsVerifyRuns(t *testing.T) {
	a, b := []int32{4, 9, 2}, []int32{7, 1}
	cases := []struct {
		name   string
		qLen   []int
		kLen   []int
		blocks [][]int32
		want   []attnItem // kvHeads 1
	}{
		{"one run", []int{1, 1, 1}, []int{9, 10, 11}, [][]int32{a[:3], a[:3], a[:3]}, []attnItem{{2, 0, 3, 0}}},
		{"shorter tables first", []int{1, 1}, []int{4, 5}, [][]int32{a[:1], a[:2]}, []attnItem{{1, 0, 2, 0}}},
		{"two tables", []int{1, 1, 1, 1}, []int{5, 6, 7, 8}, [][]int32{a[:2], a[:2], b, b}, []attnItem{{1, 0, 2, 0}, {3, 2, 4, 0}}},
		{"key counts fall", []int{1, 1}, []int{6, 5}, [][]int32{a[:2], a[:2]}, []attnItem{{0, 0, 1, 0}, {1, 1, 2, 0}}},
		{"a prefill between", []int{1, 3, 1}, []int{5, 9, 10}, [][]int32{a[:3], a[:3], a[:3]}, []attnItem{{0, 0, 1, 0}, {1, 1, 4, 0}, {2, 4, 5, 0}}},
	}
	for _, c := range cases {
		p := &attnPlan{qLen: c.qLen, kLen: c.kLen, blocks: c.blocks}
		for i := range c.qLen {
			if i > 0 {
				p.qStart = append(p.qStart, p.qStart[i-1]+c.qLen[i-1])
			} else {
				p.qStart = append(p.qStart, 0)
			}
		}
		if got := p.items(1, 1); !slices.Equal(got, c.want) {
			t.Errorf("%s: items %v, want %v", c.name, got, c.want)
		}
	}
	// 40 verify rows: a chunk of rowChunk rows, then the rest.
	p := &attnPlan{}
	for i := range 40 {
		p.qStart, p.qLen, p.kLen, p.blocks = append(p.qStart, i), append(p.qLen, 1), append(p.kLen, 20+i), append(p.blocks, a)
	}
	if got, want := p.items(2, 1), []attnItem{{rowChunk - 1, 0, rowChunk, 0}, {rowChunk - 1, 0, rowChunk, 1}, {39, rowChunk, 40, 0}, {39, rowChunk, 40, 1}}; !slices.Equal(got, want) {
		t.Errorf("40 rows: items %v, want %v", got, want)
	}
	// 5 verify rows of one head group on 2 workers: runs of 3 and 2, so
	// that both workers have an item; on 8 workers, a row each.
	p = &attnPlan{qStart: []int{0, 1, 2, 3, 4}, qLen: []int{1, 1, 1, 1, 1}, kLen: []int{9, 10, 11, 12, 13}, blocks: [][]int32{a, a, a, a, a}}
	if got, want := p.items(1, 2), []attnItem{{2, 0, 3, 0}, {4, 3, 5, 0}}; !slices.Equal(got, want) {
		t.Errorf("5 rows, 2 workers: items %v, want %v", got, want)
	}
	if got := p.items(1, 8); len(got) != 5 {
		t.Errorf("5 rows, 8 workers: items %v, want one a row", got)
	}
}
