package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// mlaPrefillShapes are the layer sizes the non-absorbed prefill kernels
// take (mlaPrefillShape): DeepSeek-V2-Lite's (16 heads), DeepSeek-V3's (128
// heads) and kv_lora_rank 128 with 5 heads.
var mlaPrefillShapes = []kernels.MLAParams{
	{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
	{NumHeads: 128, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
	{NumHeads: 5, NopeDim: 128, RopeDim: 64, KVLoraRank: 128, VHeadDim: 128},
}

// mlaPrefillTol is the bound on max|cuda-cpu|/max|cpu| of MLAAttention
// with prefill rows against the CPU backend over the same cache values
// (for the 8-bit cache, its values widened to half as the kernels widen
// them: mlaHostValues). On the prefill path q, the expanded K_nope and V
// (float32 sums over kv_lora_rank, rounded once) and the probabilities are
// each rounded once to the operands' 16-bit type (the cache's; half for
// the 8-bit cache), unit roundoff 2^-11 for half and 2^-8 for bfloat16; a score sums 192 such products, so its error is a few units
// of roundoff, and so is the output's, a convex combination of rounded
// values. The bounds are the absorbed path's (mlaTCTol), which rounds as
// many operands: about 10x (half) and 4x (bfloat16) the roundoff.
func mlaPrefillTol(dt kernels.DType) float64 { return mlaTCTol(dt) }

// mlaPrefillCases are batches of (q_len, k_len) sequences: prompts, a
// prompt of exactly mlaPrefillMinRows rows and one of a row fewer,
// chunks with a prefix already in the cache, decode rows and short
// sequences (the absorbed path) beside them; big marks the cases the
// 128-head shape skips (the CPU reference would take long).
var mlaPrefillCases = []mlaPrefillCase{
	{"prompt", [][2]int{{100, 100}}, false},
	{"threshold", [][2]int{{mlaPrefillMinRows, mlaPrefillMinRows}, {mlaPrefillMinRows - 1, mlaPrefillMinRows - 1}}, false},
	{"mixed", [][2]int{{5, 5}, {40, 40}, {1, 300}, {70, 130}, {3, 600}, {15, 15}, {150, 400}}, false},
	{"prefix", [][2]int{{33, 120}, {1, 90}, {64, 64}, {65, 200}}, false},
	{"long", [][2]int{{300, 1100}, {17, 17}}, true},
}

type mlaPrefillCase struct {
	name string
	seqs [][2]int
	big  bool
}

// eachMLAPrefillCase calls f with every layer size of mlaPrefillShapes
// (scaled), cache dtype (half, bfloat16, 8-bit) and case of
// mlaPrefillCases, but the big cases at more than 16 heads.
func eachMLAPrefillCase(f func(mp kernels.MLAParams, cdt kernels.DType, tc mlaPrefillCase)) {
	for _, mp := range mlaPrefillShapes {
		mp = mlaScaled(mp)
		for _, cdt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
			for _, tc := range mlaPrefillCases {
				if !tc.big || mp.NumHeads <= 16 {
					f(mp, cdt, tc)
				}
			}
		}
	}
}

// mlaPrefillVsCPU runs MLAAttention over a latent cache of dtype cdt
// (written by WriteMLACache) and wkvb of dtype wdt on the GPU, and the CPU
// backend over a float32 cache of the same values; it checks them within
// mlaPrefillTol and returns the error.
func (p *pair) mlaPrefillVsCPU(t *testing.T, mp kernels.MLAParams, cdt, wdt kernels.DType, seqs [][2]int) float64 {
	t.Helper()
	const blockSize, numBlocks = 16, 300
	slots := blockSize * numBlocks
	b := p.pagedBatch(blockSize, numBlocks, seqs)
	gc, err := p.g.Alloc(cdt, numBlocks, blockSize, mlaCacheWidth(cdt, mp))
	if err != nil {
		t.Fatal(err)
	}
	vals := mlaHostValues(cdt, p.mlaWriteAll(t, gc, mp, slots), mp, slots)
	cc := upload(t, p.c, kernels.F32, kernels.F32Bytes(vals), kernels.F32, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	w := p.rand(wdt, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	p.poison(out)
	if err := p.c.MLAAttention(out.c, q.c, cc, w.c, &b.cpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	if err := p.g.MLAAttention(out.g, q.g, gc, w.g, &b.gpuMeta, mp); err != nil {
		t.Fatal(err)
	}
	return p.check("mla_prefill "+cdt.String(), out, mlaPrefillTol(cdt))
}

// MLAAttention with prefill rows over half, bfloat16 and 8-bit latent
// caches against the CPU backend over float32 caches holding the same
// values:
// prompts, chunks after a cached prefix and decode and short rows in one
// batch (both paths in one call), at 16, 128 and 5 heads, with BF16 and
// (for the weight's conversion to half) F32 wkvb. Bounds: mlaPrefillTol.
func TestGPUMLAPrefill(t *testing.T) {
	p := newPair(t, GEMMRound)
	eachMLAPrefillCase(func(mp kernels.MLAParams, cdt kernels.DType, tc mlaPrefillCase) {
		wdts := []kernels.DType{kernels.BF16}
		if tc.name == "mixed" && mp.NumHeads == 16 {
			wdts = append(wdts, kernels.F32)
		}
		for _, wdt := range wdts {
			t.Run(fmt.Sprintf("%s/%s/w%s/h%d/kvl%d", tc.name, cdt, wdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
				e := p.mlaPrefillVsCPU(t, mp, cdt, wdt, tc.seqs)
				t.Logf("mla_prefill %v: max relative error against the CPU backend: %.3g (bound %.3g)", cdt, e, mlaPrefillTol(cdt))
			})
		}
	})
}

// mlaRunner runs MLAAttention on the GPU over one latent cache and weight
// for batches given as (q_len, k_len) sequences, block tables and query
// rows, and returns the output's bytes.
type mlaRunner struct {
	t         *testing.T
	g         *Backend
	mp        kernels.MLAParams
	cache, w  kernels.Tensor
	blockSize int
}

func (r mlaRunner) run(seqs [][2]int, tables [][]int32, width int, qrows []float32) []byte {
	r.t.Helper()
	cu, sk := []int32{0}, []int32{}
	flat := make([]int32, len(seqs)*width)
	for i := range flat {
		flat[i] = -1
	}
	for s, sq := range seqs {
		cu = append(cu, cu[len(cu)-1]+int32(sq[0]))
		sk = append(sk, int32(sq[1]))
		copy(flat[s*width:], tables[s])
	}
	n := int(cu[len(cu)-1])
	m := kernels.AttentionMetadata{NumSeqs: len(seqs), NumTokens: n, BlockSize: r.blockSize,
		CuSeqlensQ:  upload(r.t, r.g, kernels.I32, kernels.I32Bytes(cu), kernels.I32, len(cu)),
		SeqlensK:    upload(r.t, r.g, kernels.I32, kernels.I32Bytes(sk), kernels.I32, len(sk)),
		BlockTables: upload(r.t, r.g, kernels.I32, kernels.I32Bytes(flat), kernels.I32, len(seqs), width)}
	qw := r.mp.NumHeads * (r.mp.NopeDim + r.mp.RopeDim)
	q := upload(r.t, r.g, kernels.F32, kernels.F32Bytes(qrows), kernels.F32, n, qw)
	out, err := r.g.Alloc(kernels.F32, n, r.mp.NumHeads*r.mp.VHeadDim)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.g.MLAAttention(out, q, r.cache, r.w, &m, r.mp); err != nil {
		r.t.Fatal(err)
	}
	buf := make([]byte, kernels.NumElements(out)*4)
	if err := r.g.Download(buf, out); err != nil {
		r.t.Fatal(err)
	}
	return buf
}

// mlaPart is one sequence of a batch: (q_len, k_len), its block table and
// its query rows.
type mlaPart struct {
	seq   [2]int
	table []int32
	q     []float32
}

// Batch and chunk invariance of the prefill path: a 100-row prompt gives
// the same bits whole, in chunks of 37 + 63 and of 20 + 17 + 63 rows (each
// chunk over the keys the earlier ones left in the cache), under a block
// table reaching 8192 keys, and inside a batch of four sequences; in that
// batch a decode row, a 3-row sequence (both absorbed) and a 30-row chunk
// after a 270-key prefix give their bits alone. A 20-row chunk after a
// 4180-key prefix gives the same bits alone and beside another long
// sequence (at 128 heads the two calls expand the heads in two and in three
// passes). Half, bfloat16 and 8-bit caches, 16, 128 and 5 heads.
func TestGPUMLAPrefillInvariance(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, tc := range []struct {
		mp  kernels.MLAParams
		cdt kernels.DType
	}{
		{mlaPrefillShapes[0], kernels.F16}, {mlaPrefillShapes[0], kernels.BF16},
		{mlaPrefillShapes[1], kernels.F16}, {mlaPrefillShapes[2], kernels.BF16},
		{mlaPrefillShapes[0], kernels.F8E4M3}, {mlaPrefillShapes[2], kernels.F8E4M3},
	} {
		mp := mlaScaled(tc.mp)
		t.Run(fmt.Sprintf("%s/h%d/kvl%d", tc.cdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
			mlaPrefillInvariance(t, p, mp, tc.cdt)
		})
	}
}

func mlaPrefillInvariance(t *testing.T, p *pair, mp kernels.MLAParams, cdt kernels.DType) {
	const blockSize, numBlocks, prompt = 16, 320, 100
	cache, err := p.g.Alloc(cdt, numBlocks, blockSize, mlaCacheWidth(cdt, mp))
	if err != nil {
		t.Fatal(err)
	}
	p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
	w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	r := mlaRunner{t: t, g: p.g, mp: mp, cache: cache, w: w.g, blockSize: blockSize}
	qw := mp.NumHeads * (mp.NopeDim + mp.RopeDim)
	ow := mp.NumHeads * mp.VHeadDim * 4 // output bytes a row
	table := func(first, keys int) []int32 {
		tb := make([]int32, (keys+blockSize-1)/blockSize)
		for i := range tb {
			tb[i] = int32((first + 7*i) % numBlocks)
		}
		return tb
	}
	qp := randVals(p.r, prompt*qw, 1)
	tb := table(5, prompt)
	whole := r.run([][2]int{{prompt, prompt}}, [][]int32{tb}, len(tb), qp)
	for _, cuts := range [][]int{{37, 63}, {20, 17, 63}} {
		var got []byte
		done := 0
		for _, n := range cuts {
			got = append(got, r.run([][2]int{{n, done + n}}, [][]int32{tb}, len(tb), qp[done*qw:(done+n)*qw])...)
			done += n
		}
		if !bytes.Equal(got, whole) {
			t.Errorf("prefill in chunks of %v rows: bits differ from the whole prompt's", cuts)
		}
	}
	if wide := r.run([][2]int{{prompt, prompt}}, [][]int32{tb}, 8192/blockSize, qp); !bytes.Equal(wide, whole) {
		t.Errorf("the prompt under a block table of 8192 keys: bits differ")
	}
	// A batch: a decode row, the prompt, a chunk after a cached prefix, a
	// short sequence; each against its own run alone.
	parts := []mlaPart{
		{[2]int{1, 500}, table(40, 500), randVals(p.r, qw, 1)},
		{[2]int{prompt, prompt}, tb, qp},
		{[2]int{30, 300}, table(90, 300), randVals(p.r, 30*qw, 1)},
		{[2]int{3, 40}, table(150, 40), randVals(p.r, 3*qw, 1)},
	}
	var seqs [][2]int
	var tables [][]int32
	var qs []float32
	width := 0
	for _, pt := range parts {
		seqs, tables, qs = append(seqs, pt.seq), append(tables, pt.table), append(qs, pt.q...)
		width = max(width, len(pt.table))
	}
	batch := r.run(seqs, tables, width, qs)
	row := 0
	for i, pt := range parts {
		alone := r.run([][2]int{pt.seq}, [][]int32{pt.table}, len(pt.table), pt.q)
		if i == 1 && !bytes.Equal(alone, whole) {
			t.Fatalf("the prompt alone: bits differ between two runs")
		}
		if got := batch[row*ow : (row+pt.seq[0])*ow]; !bytes.Equal(got, alone) {
			t.Errorf("sequence %d (q_len %d, k_len %d) in a batch of four: bits differ from its run alone", i, pt.seq[0], pt.seq[1])
		}
		row += pt.seq[0]
	}
	long := mlaPart{[2]int{20, 4200}, table(11, 4200), randVals(p.r, 20*qw, 1)}
	other := mlaPart{[2]int{64, 4000}, table(3, 4000), randVals(p.r, 64*qw, 1)}
	alone := r.run([][2]int{long.seq}, [][]int32{long.table}, len(long.table), long.q)
	two := r.run([][2]int{long.seq, other.seq}, [][]int32{long.table, other.table}, len(long.table), append(append([]float32{}, long.q...), other.q...))
	if !bytes.Equal(two[:long.seq[0]*ow], alone) {
		t.Errorf("a 20-row chunk after 4180 keys: bits differ beside another long sequence")
	}
	t.Logf("%v cache, %d heads: chunked prefill = whole prompt, under wider tables and in a batch, bit for bit", cdt, mp.NumHeads)
}

// mlaInputs is one MLAAttention call as host bytes: the batch b (its
// metadata on p's GPU backend), the latent cache's bytes of dtype cdt
// (blocks of b's block size), BF16 wkvb and float32 q.
type mlaInputs struct {
	mp          kernels.MLAParams
	b           pagedBatch
	cdt         kernels.DType
	cache, w, q []byte
}

// run uploads the call to backend g, runs it and returns the output's
// bytes.
func (in mlaInputs) run(t *testing.T, p *pair, g *Backend) []byte {
	t.Helper()
	mp, b := in.mp, in.b
	width := mlaCacheWidth(in.cdt, mp)
	c := upload(t, g, in.cdt, in.cache, in.cdt, len(in.cache)/(width*in.cdt.Size()*b.gpuMeta.BlockSize), b.gpuMeta.BlockSize, width)
	w := upload(t, g, kernels.BF16, in.w, kernels.BF16, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	q := upload(t, g, kernels.F32, in.q, kernels.F32, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	ints := func(x kernels.Tensor) kernels.Tensor {
		return upload(t, g, kernels.I32, p.raw(p.g, x), kernels.I32, x.Shape()...)
	}
	m := b.gpuMeta
	m.CuSeqlensQ, m.SeqlensK, m.BlockTables, m.SlotMapping = ints(m.CuSeqlensQ), ints(m.SeqlensK), ints(m.BlockTables), ints(m.SlotMapping)
	out, err := g.Alloc(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.MLAAttention(out, q, c, w, &m, mp); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, kernels.NumElements(out)*4)
	if err := g.Download(buf, out); err != nil {
		t.Fatal(err)
	}
	return buf
}

// Rows of sequences below mlaPrefillMinRows rows keep the absorbed path's
// bits in a call with prefill rows (Options.DisableMLAPrefill runs every
// row on that path: a second backend over the same bytes), and the prefill
// rows differ from that path's by rounding only.
func TestGPUMLAPrefillPaths(t *testing.T) {
	p := newPair(t, GEMMRound)
	ab := newGPUOpts(t, Options{GEMM: GEMMRound, DisableMLAPrefill: true})
	mp := mlaScaled(mlaPrefillShapes[0])
	const blockSize, numBlocks = 16, 128
	seqs := [][2]int{{1, 300}, {mlaPrefillMinRows - 1, 200}, {mlaPrefillMinRows, 100}, {4, 4}, {80, 200}}
	b := p.pagedBatch(blockSize, numBlocks, seqs)
	cache, err := p.g.Alloc(kernels.F16, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	raw := p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
	wv := hostBytes(kernels.BF16, randVals(p.r, mp.NumHeads*(mp.NopeDim+mp.VHeadDim)*mp.KVLoraRank, 0.2))
	qv := kernels.F32Bytes(randVals(p.r, b.numTokens*mp.NumHeads*(mp.NopeDim+mp.RopeDim), 1))
	in := mlaInputs{mp: mp, b: b, cdt: kernels.F16, cache: raw, w: wv, q: qv}
	split := kernels.BytesF32(in.run(t, p, p.g))
	absorbed := kernels.BytesF32(in.run(t, p, ab))
	ow := mp.NumHeads * mp.VHeadDim
	row := 0
	for _, s := range seqs {
		got, want := split[row*ow:(row+s[0])*ow], absorbed[row*ow:(row+s[0])*ow]
		if s[0] < mlaPrefillMinRows {
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("sequence (%d, %d): element %d is %v, want the absorbed path's %v", s[0], s[1], i, got[i], want[i])
				}
			}
		} else if e := maxRelErr(got, want); e > mlaPrefillTol(kernels.F16) || math.IsNaN(e) {
			t.Errorf("sequence (%d, %d): prefill path against the absorbed path: max relative error %.3g > %.3g", s[0], s[1], e, mlaPrefillTol(kernels.F16))
		}
		row += s[0]
	}
}

// The prefill path on wgmma (the default on sm_90a builds: attention, and
// for 16-bit caches the expansion) gives the bits of its mma.sync kernels
// (Options.DisableMLAPrefillWGMMA: a second backend over the same bytes): every case of TestGPUMLAPrefill, over
// half, bfloat16 and 8-bit caches, at 16, 128 and 5 heads (on builds
// without wgmma both backends run the mma.sync kernel).
func TestGPUMLAPrefillWGMMA(t *testing.T) {
	p := newPair(t, GEMMRound)
	mm := newGPUOpts(t, Options{GEMM: GEMMRound, DisableMLAPrefillWGMMA: true})
	const blockSize, numBlocks = 16, 300
	eachMLAPrefillCase(func(mp kernels.MLAParams, cdt kernels.DType, tc mlaPrefillCase) {
		t.Run(fmt.Sprintf("%s/%s/h%d/kvl%d", tc.name, cdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
			b := p.pagedBatch(blockSize, numBlocks, tc.seqs)
			cache, err := p.g.Alloc(cdt, numBlocks, blockSize, mlaCacheWidth(cdt, mp))
			if err != nil {
				t.Fatal(err)
			}
			raw := p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
			in := mlaInputs{mp: mp, b: b, cdt: cdt, cache: raw,
				w: hostBytes(kernels.BF16, randVals(p.r, mp.NumHeads*(mp.NopeDim+mp.VHeadDim)*mp.KVLoraRank, 0.2)),
				q: kernels.F32Bytes(randVals(p.r, b.numTokens*mp.NumHeads*(mp.NopeDim+mp.RopeDim), 1))}
			wg, ref := in.run(t, p, p.g), in.run(t, p, mm)
			if !bytes.Equal(wg, ref) {
				a, r := kernels.BytesF32(wg), kernels.BytesF32(ref)
				n := 0
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(r[i]) {
						n++
					}
				}
				t.Fatalf("%d of %d outputs differ from the mma.sync kernel's (max relative difference %.3g)", n, len(a), maxRelErr(a, r))
			}
		})
	})
}

// A call of several sequences sized by the host copy of its query offsets
// (HostCuSeqlensQ: no read of the plan's counts) gives the bits of the
// same call reading them: prompts, chunks after a cached prefix, decode
// and short rows together, and a call with no prefill sequence, over
// half, bfloat16 and 8-bit caches. A host copy whose totals differ from
// the device's offsets is ErrOutOfRange naming mla_attention at Sync; one
// of the wrong length is refused when the call is made.
func TestGPUMLAPrefillHint(t *testing.T) {
	p := newPair(t, GEMMRound)
	mp := mlaScaled(mlaPrefillShapes[0])
	const blockSize, numBlocks = 16, 300
	batches := [][][2]int{
		mlaPrefillCases[2].seqs, // mixed
		mlaPrefillCases[3].seqs, // prefix
		{{1, 300}, {5, 5}, {mlaPrefillMinRows - 1, 40}},
	}
	for _, cdt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
		cache, err := p.g.Alloc(cdt, numBlocks, blockSize, mlaCacheWidth(cdt, mp))
		if err != nil {
			t.Fatal(err)
		}
		p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
		w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
		for i, seqs := range batches {
			b := p.pagedBatch(blockSize, numBlocks, seqs)
			q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
			run := func(hostCu []int32) []byte {
				m := b.gpuMeta
				m.HostCuSeqlensQ = hostCu
				out, err := p.g.Alloc(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.g.MLAAttention(out, q.g, cache, w.g, &m, mp); err != nil {
					t.Fatal(err)
				}
				if err := p.g.Sync(); err != nil {
					t.Fatalf("%v cache, batch %d, host offsets %v: %v", cdt, i, hostCu != nil, err)
				}
				return p.raw(p.g, out)
			}
			if read, hinted := run(nil), run(b.cu); !bytes.Equal(read, hinted) {
				t.Errorf("%v cache, batch %d %v: bits differ between the call sized by its host offsets and the one reading its plan", cdt, i, seqs)
			}
		}
	}
	// Host offsets that do not match the device's.
	cache, err := p.g.Alloc(kernels.F16, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
	w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	b := p.pagedBatch(blockSize, numBlocks, [][2]int{{40, 40}, {1, 90}})
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out := p.zeros(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
	m := b.gpuMeta
	m.HostCuSeqlensQ = []int32{0, 20, 41} // two prefill sequences where the device has one
	if err := p.g.MLAAttention(out.g, q.g, cache, w.g, &m, mp); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Sync(); !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "mla_attention") {
		t.Errorf("Sync after host offsets that differ from the device's: %v, want ErrOutOfRange naming mla_attention", err)
	}
	m.HostCuSeqlensQ = []int32{0, 41}
	if err := p.g.MLAAttention(out.g, q.g, cache, w.g, &m, mp); err == nil || !strings.Contains(err.Error(), "HostCuSeqlensQ") {
		t.Errorf("host offsets of the wrong length: %v, want an error naming HostCuSeqlensQ", err)
	}
}

// A prefill sequence with fewer keys than query rows, or with a cache
// block out of range, is reported at the next Sync (ErrOutOfRange naming
// mla_attention); with too few keys its rows are zero. The other sequence
// of the batch gets the bits it gets alone.
func TestGPUMLAPrefillChecks(t *testing.T) {
	p := newPair(t, GEMMRound)
	g := p.g
	mp := mlaScaled(mlaPrefillShapes[0])
	const blockSize, numBlocks, rows = 16, 20, 70
	cache, err := g.Alloc(kernels.F16, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
	w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	qw, ow := mp.NumHeads*(mp.NopeDim+mp.RopeDim), mp.NumHeads*mp.VHeadDim
	qv := randVals(p.r, 2*rows*qw, 1)
	ints := func(xs []int32, shape ...int) kernels.Tensor {
		return upload(t, g, kernels.I32, kernels.I32Bytes(xs), kernels.I32, shape...)
	}
	run := func(m kernels.AttentionMetadata, n int) ([]float32, error) {
		q := upload(t, g, kernels.F32, kernels.F32Bytes(qv[:n*qw]), kernels.F32, n, qw)
		out := upload(t, g, kernels.F32, kernels.F32Bytes(randVals(p.r, n*ow, 9)), kernels.F32, n, ow)
		if err := g.MLAAttention(out, q, cache, w.g, &m, mp); err != nil {
			t.Fatal(err)
		}
		err := g.Sync()
		vals, derr := kernels.ToF32(g, out)
		if derr != nil {
			t.Fatal(derr)
		}
		return vals, err
	}
	for _, bad := range []string{"keys", "block"} {
		t.Run(bad, func(t *testing.T) {
			tables := []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
			keys := []int32{rows, rows}
			if bad == "keys" {
				keys[1] = rows - 20
			} else {
				tables[7] = numBlocks + 3
			}
			got, err := run(kernels.AttentionMetadata{NumSeqs: 2, NumTokens: 2 * rows, BlockSize: blockSize,
				CuSeqlensQ: ints([]int32{0, rows, 2 * rows}, 3), SeqlensK: ints(keys, 2), BlockTables: ints(tables, 2, 5)}, 2*rows)
			if !errors.Is(err, kernels.ErrOutOfRange) || !strings.Contains(err.Error(), "mla_attention") {
				t.Fatalf("Sync after a bad sequence: %v, want ErrOutOfRange naming mla_attention", err)
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
				for i := rows * ow; i < 2*rows*ow; i++ {
					if got[i] != 0 {
						t.Fatalf("bad sequence, element %d = %v, want 0", i-rows*ow, got[i])
					}
				}
			}
		})
	}
}

// BenchmarkGPUMLAPrefill times MLAAttention over one prompt of 4096 tokens
// (one sequence, all its keys new) at DeepSeek-V2-Lite's layer sizes (16
// heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v head 128) over half,
// bfloat16 and 8-bit latent caches: the prefill path (expansion plus
// FlashAttention; its attention on wgmma where the build has it) and, in
// the same run, the same path with the mma.sync attention kernel
// (Options.DisableMLAPrefillWGMMA) and the absorbed path for every row
// (Options.DisableMLAPrefill). Figures are TFLOP/s of the causal
// non-absorbed attention, H x 2 x (192 + 128) x n(n+1)/2 FLOPs (85.9
// GFLOP at n = 4096), for both paths, so that their ratio is the speedup;
// the expansion's own 2 x n x 512 x 256 x H FLOPs (17.2 GFLOP) are not
// counted. tools/gpu/check.sh's mla phase prints the lines.
func BenchmarkGPUMLAPrefill(b *testing.B) {
	mp := mlaScaled(mlaPrefillShapes[0])
	const n, blockSize = 4096, 64
	flops := float64(mp.NumHeads) * 2 * float64(mp.NopeDim+mp.RopeDim+mp.VHeadDim) * float64(n) * float64(n+1) / 2
	for _, cdt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
		b.Run("cache="+cdt.String(), func(b *testing.B) {
			pf := newGPUOpts(b, Options{GEMM: GEMMRound})
			mm := newGPUOpts(b, Options{GEMM: GEMMRound, DisableMLAPrefillWGMMA: true})
			ab := newGPUOpts(b, Options{GEMM: GEMMRound, DisableMLAPrefill: true})
			var ms [3]float64
			for i, g := range []*Backend{pf, mm, ab} {
				r, _ := mlaBenchInputs(b, g, mp, cdt, [][2]int{{n, n}}, blockSize)
				reps := 20
				if i == 2 {
					reps = 3
				}
				ms[i] = timeIt(b, g, reps, func() error { return g.MLAAttention(r.out, r.q, r.cache, r.w, &r.m, mp) })
			}
			tf := func(ms float64) float64 { return flops / (ms / 1e3) / 1e12 }
			b.ReportMetric(ms[0]*1e3, "us/op")
			b.ReportMetric(tf(ms[0]), "TFLOP/s")
			b.Logf("mla prefill | cache %-4s tokens %d heads %d | prefill path %8.1f us %6.1f TFLOP/s | its mma.sync attention %8.1f us %6.1f TFLOP/s | absorbed path %8.1f us %6.1f TFLOP/s | %.2fx, %.2fx",
				cdt, n, mp.NumHeads, ms[0]*1e3, tf(ms[0]), ms[1]*1e3, tf(ms[1]), ms[2]*1e3, tf(ms[2]), ms[1]/ms[0], ms[2]/ms[0])
		})
	}
}

// BenchmarkGPUMLAPrefillMixed times MLAAttention over a mixed batch at
// DeepSeek-V2-Lite's layer sizes: one prompt chunk of 256 rows after 256
// cached keys beside 63 decode rows of 1024 keys, half latent cache, as
// 27 calls back to back (a forward pass's layers). Without the host copy
// of the query offsets every call waits for its plan's counts (the
// device's queue drains before the next call's launches); with it
// (HostCuSeqlensQ) none does. Figures: us a call each way, same run.
func BenchmarkGPUMLAPrefillMixed(b *testing.B) {
	mp := mlaScaled(mlaPrefillShapes[0])
	const blockSize, layers = 64, 27
	g := newGPUOpts(b, Options{GEMM: GEMMRound})
	seqs := [][2]int{{256, 512}}
	for range 63 {
		seqs = append(seqs, [2]int{1, 1024})
	}
	in, cu := mlaBenchInputs(b, g, mp, kernels.F16, seqs, blockSize)
	m, out, q, cache, w := in.m, in.out, in.q, in.cache, in.w
	var us [2]float64
	for round := range 2 { // alternating: read, hinted, read, hinted; the second round kept
		for i, hostCu := range [][]int32{nil, cu} {
			mm := m
			mm.HostCuSeqlensQ = hostCu
			ms := timeIt(b, g, 10, func() error {
				for range layers {
					if err := g.MLAAttention(out, q, cache, w, &mm, mp); err != nil {
						return err
					}
				}
				return nil
			})
			if round == 1 {
				us[i] = ms * 1e3 / layers
			}
		}
	}
	b.ReportMetric(us[1], "us/op")
	b.Logf("mla prefill | mixed batch (a 256-row chunk after 256 keys, 63 decode rows of 1024 keys), %d calls back to back | reading the plan %.1f us a call | host offsets %.1f us a call | %.2fx",
		layers, us[0], us[1], us[0]/us[1])
}

// mlaBench is one MLAAttention call's operands on one backend.
type mlaBench struct {
	out, q, cache, w kernels.Tensor
	m                kernels.AttentionMetadata
}

// mlaBenchInputs builds one MLAAttention call on g over sequences seqs
// (q_len, k_len; each sequence's keys in blocks of its own, in order) over
// a cache of dtype cdt written by WriteMLACache with random latents, with
// BF16 weights; it returns the call's operands (m without host offsets)
// and the host copy of its query offsets.
func mlaBenchInputs(b *testing.B, g *Backend, mp kernels.MLAParams, cdt kernels.DType, seqs [][2]int, blockSize int) (mlaBench, []int32) {
	r := rand.New(rand.NewPCG(11, 13))
	cu, sk := []int32{0}, []int32{}
	maxQ, maxK := 0, 0
	for _, s := range seqs {
		cu = append(cu, cu[len(cu)-1]+int32(s[0]))
		sk = append(sk, int32(s[1]))
		maxQ, maxK = max(maxQ, s[0]), max(maxK, s[1])
	}
	width := (maxK + blockSize - 1) / blockSize
	bt, blocks := make([]int32, 0, len(seqs)*width), 0
	for _, s := range seqs {
		nb := (s[1] + blockSize - 1) / blockSize
		for j := range width {
			if j < nb {
				bt = append(bt, int32(blocks+j))
			} else {
				bt = append(bt, -1)
			}
		}
		blocks += nb
	}
	n, slots := int(cu[len(cu)-1]), blocks*blockSize
	cache, err := g.Alloc(cdt, blocks, blockSize, mlaCacheWidth(cdt, mp))
	if err != nil {
		b.Fatal(err)
	}
	ckv := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, slots*mp.KVLoraRank, 1)), kernels.F32, slots, mp.KVLoraRank)
	kpe := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, slots*mp.RopeDim, 1)), kernels.F32, slots, mp.RopeDim)
	sm := make([]int32, slots)
	for i := range sm {
		sm[i] = int32(i)
	}
	if err := g.WriteMLACache(cache, ckv, kpe, upload(b, g, kernels.I32, kernels.I32Bytes(sm), kernels.I32, slots), mp); err != nil {
		b.Fatal(err)
	}
	m := kernels.AttentionMetadata{NumSeqs: len(seqs), NumTokens: n, MaxSeqlenQ: maxQ, MaxSeqlenK: maxK, BlockSize: blockSize,
		CuSeqlensQ:  upload(b, g, kernels.I32, kernels.I32Bytes(cu), kernels.I32, len(cu)),
		SeqlensK:    upload(b, g, kernels.I32, kernels.I32Bytes(sk), kernels.I32, len(sk)),
		BlockTables: upload(b, g, kernels.I32, kernels.I32Bytes(bt), kernels.I32, len(seqs), width)}
	w := upload(b, g, kernels.BF16, hostBytes(kernels.BF16, randVals(r, mp.NumHeads*(mp.NopeDim+mp.VHeadDim)*mp.KVLoraRank, 0.05)),
		kernels.BF16, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	q := upload(b, g, kernels.F32, kernels.F32Bytes(randVals(r, n*mp.NumHeads*(mp.NopeDim+mp.RopeDim), 1)), kernels.F32,
		n, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	out, err := g.Alloc(kernels.F32, n, mp.NumHeads*mp.VHeadDim)
	if err != nil {
		b.Fatal(err)
	}
	return mlaBench{out: out, q: q, cache: cache, w: w, m: m}, cu
}
