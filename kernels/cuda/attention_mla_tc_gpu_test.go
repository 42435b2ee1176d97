package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// mlaTCShapes are the tensor-core MLA tests' layer sizes: DeepSeek-V2's
// latent and head sizes with 3 heads (rows of the m16 tile left empty),
// with 16 (DeepSeek-V2-Lite's heads) and 20 (two head groups), and the
// shipped default model's (kv_lora_rank 128, rope 16).
var mlaTCShapes = []kernels.MLAParams{
	{NumHeads: 3, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
	{NumHeads: 16, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
	{NumHeads: 20, NopeDim: 128, RopeDim: 64, KVLoraRank: 512, VHeadDim: 128},
	{NumHeads: 8, NopeDim: 32, RopeDim: 16, KVLoraRank: 128, VHeadDim: 32},
}

// mlaTCCases add long decode rows (several chunks a row) to attnCases.
var mlaTCCases = append(append([]struct {
	name string
	seqs [][2]int
}{}, attnCases...), struct {
	name string
	seqs [][2]int
}{"long", [][2]int{{1, 700}, {1, 1500}, {2, 2100}}})

// mlaTCTol is the bound on max|cuda-cpu|/max|cpu| of the tensor-core MLA
// against the CPU backend over the same cache values: the absorbed
// queries, the probabilities and the chunks' partial outputs are rounded
// to half (2^-11) or, over a BF16 cache, the first two to bfloat16 (2^-8).
func mlaTCTol(dt kernels.DType) float64 {
	if dt == kernels.BF16 {
		return 3e-2
	}
	return 5e-3
}

// mlaCacheWidth is the last dimension of a latent cache of dtype dt for
// p's layer: the row's values, or for the 8-bit cache its packed bytes.
func mlaCacheWidth(dt kernels.DType, p kernels.MLAParams) int {
	if dt == kernels.F8E4M3 {
		return kernels.MLAF8RowBytes(p.KVLoraRank, p.RopeDim)
	}
	return p.KVLoraRank + p.RopeDim
}

// mlaHostRow encodes one latent row (c_kv then k_pe) as the cache of dtype
// dt stores it (kernels.MLACacher): the reference of WriteMLACache.
func mlaHostRow(dt kernels.DType, ckv, kpe []float32) []byte {
	kvl, rope := len(ckv), len(kpe)
	switch dt {
	case kernels.F16, kernels.BF16, kernels.F32:
		return hostBytes(dt, append(append([]float32{}, ckv...), kpe...))
	}
	row := make([]byte, kernels.MLAF8RowBytes(kvl, rope))
	for g := 0; g < kvl/kernels.MLAF8Group; g++ {
		xs := ckv[g*kernels.MLAF8Group : (g+1)*kernels.MLAF8Group]
		var amax float32
		for _, x := range xs {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		scale := float32(1)
		if amax > 0 {
			scale = amax / 448
		}
		for i, x := range xs {
			row[g*kernels.MLAF8Group+i] = kernels.F32ToF8E4M3(x / scale)
		}
		binary.LittleEndian.PutUint32(row[kvl+2*rope+4*g:], math.Float32bits(scale))
	}
	for r, x := range kpe {
		binary.LittleEndian.PutUint16(row[kvl+2*r:], kernels.F32ToF16(x))
	}
	return row
}

// mlaHostValues decodes a cache of dtype dt ([slots] rows of p's layout) to
// the float32 values the tensor-core kernels compute with: 16-bit values
// widened; 8-bit ones times their group's scale, rounded to half.
func mlaHostValues(dt kernels.DType, raw []byte, p kernels.MLAParams, slots int) []float32 {
	kvl, rope := p.KVLoraRank, p.RopeDim
	w := kvl + rope
	out := make([]float32, slots*w)
	for s := range slots {
		o := out[s*w : (s+1)*w]
		switch dt {
		case kernels.F16, kernels.BF16:
			for e := range w {
				u := binary.LittleEndian.Uint16(raw[(s*w+e)*2:])
				if dt == kernels.F16 {
					o[e] = kernels.F16ToF32(u)
				} else {
					o[e] = kernels.BF16ToF32(u)
				}
			}
		case kernels.F8E4M3:
			rb := kernels.MLAF8RowBytes(kvl, rope)
			row := raw[s*rb : (s+1)*rb]
			for c := range kvl {
				scale := math.Float32frombits(binary.LittleEndian.Uint32(row[kvl+2*rope+4*(c/kernels.MLAF8Group):]))
				o[c] = kernels.F16ToF32(kernels.F32ToF16(kernels.F8E4M3ToF32(row[c]) * scale))
			}
			for r := range rope {
				o[kvl+r] = kernels.F16ToF32(binary.LittleEndian.Uint16(row[kvl+2*r:]))
			}
		}
	}
	return out
}

// mlaWriteAll fills every row of a narrowed GPU cache through WriteMLACache
// with random latents (group 1 of row 3 all zeros, to cover the 8-bit
// scale of zeros) and returns the cache's bytes.
func (p *pair) mlaWriteAll(t *testing.T, cache kernels.Tensor, mp kernels.MLAParams, slots int) []byte {
	t.Helper()
	ckv := randVals(p.r, slots*mp.KVLoraRank, 1)
	if slots > 3 && mp.KVLoraRank >= 2*kernels.MLAF8Group {
		clear(ckv[3*mp.KVLoraRank+kernels.MLAF8Group : 3*mp.KVLoraRank+2*kernels.MLAF8Group])
	}
	kpe := randVals(p.r, slots*mp.RopeDim, 2)
	sm := make([]int32, slots)
	for i := range sm {
		sm[i] = int32(i)
	}
	x := upload(t, p.g, kernels.F32, kernels.F32Bytes(ckv), kernels.F32, slots, mp.KVLoraRank)
	xp := upload(t, p.g, kernels.F32, kernels.F32Bytes(kpe), kernels.F32, slots, mp.RopeDim)
	smt := upload(t, p.g, kernels.I32, kernels.I32Bytes(sm), kernels.I32, slots)
	if err := p.g.WriteMLACache(cache, x, xp, smt, mp); err != nil {
		t.Fatal(err)
	}
	raw := p.raw(p.g, cache)
	// The writer's bytes are the host encoding's, row by row.
	rb := len(raw) / slots
	for s := range slots {
		want := mlaHostRow(cache.DType(), ckv[s*mp.KVLoraRank:(s+1)*mp.KVLoraRank], kpe[s*mp.RopeDim:(s+1)*mp.RopeDim])
		if got := raw[s*rb : s*rb+len(want)]; !bytes.Equal(got, want) {
			t.Fatalf("WriteMLACache %v: row %d differs from the host encoding", cache.DType(), s)
		}
	}
	return raw
}

// mlaTC runs MLAAttention over a narrowed cache of dtype cdt (every row
// written by WriteMLACache) and wkvb of dtype wdt on the GPU, and the CPU
// backend over a float32 cache of the same values; checks them within
// mlaTCTol and returns the GPU output's bytes.
func (p *pair) mlaTC(t *testing.T, mp kernels.MLAParams, cdt, wdt kernels.DType, seqs [][2]int) []byte {
	t.Helper()
	const blockSize, numBlocks = 16, 300 // the long case's sequences take 272 blocks
	slots := blockSize * numBlocks
	b := p.pagedBatch(blockSize, numBlocks, seqs)
	width := mlaCacheWidth(cdt, mp)
	gc, err := p.g.Alloc(cdt, numBlocks, blockSize, width)
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
	e := p.check("mla_attention "+cdt.String()+" w"+wdt.String(), out, mlaTCTol(cdt))
	t.Logf("mla_attention %v, wkvb %v: max relative error against the CPU backend: %.3g (bound %.3g)", cdt, wdt, e, mlaTCTol(cdt))
	return p.raw(p.g, out.g)
}

func mlaScaled(mp kernels.MLAParams) kernels.MLAParams {
	mp.Scale = float32(1 / math.Sqrt(float64(mp.NopeDim+mp.RopeDim)))
	return mp
}

// MLAAttention over half, bfloat16 and 8-bit latent caches (tensor cores)
// against the CPU backend over float32 caches holding the same values, for
// decode, prefill, mixed and long batches; WriteMLACache's bytes against
// the host encoding (mlaHostRow), bit for bit. Bounds: mlaTCTol.
func TestGPUMLATensorCores(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, mp := range mlaTCShapes {
		mp = mlaScaled(mp)
		for _, cdt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
			for _, tc := range mlaTCCases {
				t.Run(fmt.Sprintf("%s/%s/h%d/kvl%d", tc.name, cdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
					p.mlaTC(t, mp, cdt, kernels.BF16, tc.seqs)
				})
			}
		}
	}
}

// The absorption products (q_nope W_UK, o_lat W_UV^T) run on tensor cores
// for 16-bit wkvb (the float32 inputs split into two parts of the weight's
// type) and on CUDA cores for float32 wkvb. MLAAttention with F16 and F32
// wkvb (BF16: TestGPUMLATensorCores) against the CPU backend within
// mlaTCTol; and for each of the three, decode rows at several places of a
// 70-row batch (other places in the kernels' tiles of 16 rows and blocks
// of 64) give the bits they get alone.
func TestGPUMLAAbsorbWeights(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, mp := range []kernels.MLAParams{mlaTCShapes[1], mlaTCShapes[3]} {
		mp = mlaScaled(mp)
		for _, wdt := range []kernels.DType{kernels.F16, kernels.F32} {
			for _, tc := range mlaTCCases {
				t.Run(fmt.Sprintf("cpu/%s/w%s/h%d/kvl%d", tc.name, wdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
					p.mlaTC(t, mp, kernels.F16, wdt, tc.seqs)
				})
			}
		}
		for _, wdt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
			t.Run(fmt.Sprintf("alone/w%s/h%d/kvl%d", wdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
				mlaAbsorbAlone(t, p, mp, wdt)
			})
		}
	}
}

// mlaAbsorbAlone checks that decode rows 0, 21, 63, 64 and 69 of a batch
// of 70 (keys 1 to 300 each, F16 cache, wkvb of dtype wdt) give, alone,
// the bits they get in the batch.
func mlaAbsorbAlone(t *testing.T, p *pair, mp kernels.MLAParams, wdt kernels.DType) {
	const blockSize, numBlocks, rows = 16, 256, 70
	cache, err := p.g.Alloc(kernels.F16, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	p.mlaWriteAll(t, cache, mp, blockSize*numBlocks)
	w := p.rand(wdt, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	r := mlaRunner{t: t, g: p.g, mp: mp, cache: cache, w: w.g, blockSize: blockSize}
	qw := mp.NumHeads * (mp.NopeDim + mp.RopeDim)
	ow := mp.NumHeads * mp.VHeadDim * 4
	const width = (300 + blockSize - 1) / blockSize
	var seqs [][2]int
	var tables [][]int32
	for s := range rows {
		k := 1 + p.r.IntN(300)
		tb := make([]int32, (k+blockSize-1)/blockSize)
		for i := range tb {
			tb[i] = int32((3*s + 7*i) % numBlocks)
		}
		seqs, tables = append(seqs, [2]int{1, k}), append(tables, tb)
	}
	qs := randVals(p.r, rows*qw, 1)
	batch := r.run(seqs, tables, width, qs)
	for _, i := range []int{0, 21, 63, 64, 69} {
		alone := r.run([][2]int{seqs[i]}, [][]int32{tables[i]}, width, qs[i*qw:(i+1)*qw])
		if !bytes.Equal(alone, batch[i*ow:(i+1)*ow]) {
			t.Errorf("wkvb %v: decode row %d of %d alone: bits differ from the batch's", wdt, i, rows)
		}
	}
}

// An 8-bit latent cache gives the bits of a half cache holding its values
// (each 8-bit value times its scale, rounded to half): the absorbed
// kernels widen the tiles to exactly that, and so does the prefill path's
// expansion (mlaPrefillShape), whose rows are in the batch too: a prompt,
// a chunk after a cached prefix and a sequence one row short of the
// threshold.
func TestGPUMLAFP8AsHalf(t *testing.T) {
	p := newPair(t, GEMMRound)
	const blockSize, numBlocks = 16, 200
	slots := blockSize * numBlocks
	mp := mlaScaled(mlaTCShapes[1])
	if !mlaPrefillShape(mp, kernels.F8E4M3) {
		t.Fatalf("the V2-Lite shape over an 8-bit cache does not take the prefill path")
	}
	seqs := [][2]int{{1, 37}, {1, 900}, {5, 300}, {100, 100}, {40, 700}, {mlaPrefillMinRows - 1, 50}}
	b := p.pagedBatch(blockSize, numBlocks, seqs)
	f8, err := p.g.Alloc(kernels.F8E4M3, numBlocks, blockSize, kernels.MLAF8RowBytes(mp.KVLoraRank, mp.RopeDim))
	if err != nil {
		t.Fatal(err)
	}
	vals := mlaHostValues(kernels.F8E4M3, p.mlaWriteAll(t, f8, mp, slots), mp, slots)
	half := upload(t, p.g, kernels.F16, hostBytes(kernels.F16, vals), kernels.F16, numBlocks, blockSize, mp.KVLoraRank+mp.RopeDim)
	w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	q := p.rand(kernels.F32, 1, b.numTokens, mp.NumHeads*(mp.NopeDim+mp.RopeDim))
	var outs [2][]byte
	for i, c := range []kernels.Tensor{f8, half} {
		out, _ := p.g.Alloc(kernels.F32, b.numTokens, mp.NumHeads*mp.VHeadDim)
		if err := p.g.MLAAttention(out, q.g, c, w.g, &b.gpuMeta, mp); err != nil {
			t.Fatal(err)
		}
		outs[i] = p.raw(p.g, out)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Errorf("8-bit cache: bits differ from the half cache holding its values")
	}
}

// Batch invariance of the tensor-core MLA: a decode row alone, among 63
// other rows of other lengths (where the grid cuts each chunk's output
// into fewer slices), and under block tables twice as wide gives the same
// bits; a prompt prefilled in chunks of 37 + 63 rows gives the bits of the
// whole prompt, and its last row those of the same row decoded alone (to
// rounding where the prompt's rows take the non-absorbed prefill kernels,
// mlaPrefillShape).
func TestGPUMLATensorCoresInvariance(t *testing.T) {
	p := newPair(t, GEMMRound)
	for _, cdt := range []kernels.DType{kernels.F16, kernels.F8E4M3} {
		for _, mp := range []kernels.MLAParams{mlaTCShapes[1], mlaTCShapes[3]} {
			mp = mlaScaled(mp)
			t.Run(fmt.Sprintf("%s/h%d/kvl%d", cdt, mp.NumHeads, mp.KVLoraRank), func(t *testing.T) {
				mlaInvariance(t, p, mp, cdt)
			})
		}
	}
}

func mlaInvariance(t *testing.T, p *pair, mp kernels.MLAParams, cdt kernels.DType) {
	const blockSize, numBlocks, prompt = 16, 1024, 100
	slots := blockSize * numBlocks
	width := mlaCacheWidth(cdt, mp)
	cache, err := p.g.Alloc(cdt, numBlocks, blockSize, width)
	if err != nil {
		t.Fatal(err)
	}
	p.mlaWriteAll(t, cache, mp, slots)
	w := p.rand(kernels.BF16, 0.2, mp.NumHeads*(mp.NopeDim+mp.VHeadDim), mp.KVLoraRank)
	qw := mp.NumHeads * (mp.NopeDim + mp.RopeDim)
	ow := mp.NumHeads * mp.VHeadDim * 4
	// run computes the rows of seqs (q_len, k_len) over tables: sequence s
	// reads blocks tables[s]; q rows are qrows in order.
	run := func(seqs [][2]int, tables [][]int32, width int, qrows []float32) []byte {
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
		m := kernels.AttentionMetadata{NumSeqs: len(seqs), NumTokens: n, BlockSize: blockSize,
			CuSeqlensQ:  upload(t, p.g, kernels.I32, kernels.I32Bytes(cu), kernels.I32, len(cu)),
			SeqlensK:    upload(t, p.g, kernels.I32, kernels.I32Bytes(sk), kernels.I32, len(sk)),
			BlockTables: upload(t, p.g, kernels.I32, kernels.I32Bytes(flat), kernels.I32, len(seqs), width)}
		q := upload(t, p.g, kernels.F32, kernels.F32Bytes(qrows), kernels.F32, n, qw)
		out, _ := p.g.Alloc(kernels.F32, n, mp.NumHeads*mp.VHeadDim)
		if err := p.g.MLAAttention(out, q, cache, w.g, &m, mp); err != nil {
			t.Fatal(err)
		}
		return p.raw(p.g, out)
	}
	table := func(first, n int) []int32 {
		tb := make([]int32, n)
		for i := range tb {
			tb[i] = int32((first + 7*i) % numBlocks)
		}
		return tb
	}
	// Decode: row 0 (1500 keys) alone, among 63 others, under wider tables.
	const keys = 1500
	q0 := randVals(p.r, qw, 1)
	alone := run([][2]int{{1, keys}}, [][]int32{table(0, 94)}, 94, q0)
	seqs, tables, qs := [][2]int{{1, keys}}, [][]int32{table(0, 94)}, append([]float32{}, q0...)
	for s := 1; s < 64; s++ {
		k := 1 + p.r.IntN(1400)
		seqs = append(seqs, [2]int{1, k})
		tables = append(tables, table(s*3, (k+blockSize-1)/blockSize))
		qs = append(qs, randVals(p.r, qw, 1)...)
	}
	crowd := run(seqs, tables, 94, qs)
	if !bytes.Equal(alone, crowd[:ow]) {
		t.Errorf("decode row alone and among 64 rows: bits differ")
	}
	if wide := run([][2]int{{1, keys}}, [][]int32{table(0, 94)}, 188, q0); !bytes.Equal(alone, wide) {
		t.Errorf("decode row under tables twice as wide: bits differ")
	}
	// Prefill: the whole prompt, in chunks of 37 + 63, and its last row decoded.
	qp := randVals(p.r, prompt*qw, 1)
	tb := table(5, (prompt+blockSize-1)/blockSize)
	whole := run([][2]int{{prompt, prompt}}, [][]int32{tb}, len(tb), qp)
	first := run([][2]int{{37, 37}}, [][]int32{tb}, len(tb), qp[:37*qw])
	second := run([][2]int{{63, prompt}}, [][]int32{tb}, len(tb), qp[37*qw:])
	if !bytes.Equal(whole, append(first, second...)) {
		t.Errorf("prefill in chunks of 37 + 63 rows: bits differ from the whole prompt's")
	}
	last := run([][2]int{{1, prompt}}, [][]int32{tb}, len(tb), qp[(prompt-1)*qw:])
	if mlaPrefillShape(mp, cdt) {
		// The prompt's rows took the non-absorbed prefill kernels, the row
		// decoded alone the absorbed ones: equal to rounding only.
		if e := maxRelErr(kernels.BytesF32(last), kernels.BytesF32(whole[(prompt-1)*ow:])); e > mlaTCTol(cdt) || math.IsNaN(e) {
			t.Errorf("the prompt's last row decoded alone: max relative error %.3g against the prefill's > %.3g", e, mlaTCTol(cdt))
		}
	} else if !bytes.Equal(last, whole[(prompt-1)*ow:]) {
		t.Errorf("the prompt's last row decoded alone: bits differ from the prefill's")
	}
	t.Logf("%v cache: bit-identical alone, among 64 rows, under wider tables; chunked prefill = whole", cdt)
}

// The latent cache follows the GQA caches' rule (Backend.MLACacheLayout):
// half for 16-bit weights in GEMM mode round, 8-bit rows with
// KVCacheDType F8E4M3, float32 for float32 weights, GEMM mode split and
// sizes the tensor-core kernels do not take.
func TestGPUMLACacheLayout(t *testing.T) {
	v2 := mlaTCShapes[1]
	small := kernels.MLAParams{NumHeads: 4, NopeDim: 16, RopeDim: 8, KVLoraRank: 32, VHeadDim: 12}
	tests := []struct {
		opts  Options
		w     kernels.DType
		p     kernels.MLAParams
		dt    kernels.DType
		width int
	}{
		{Options{GEMM: GEMMRound}, kernels.BF16, v2, kernels.F16, 576},
		{Options{GEMM: GEMMRound}, kernels.F32, v2, kernels.F32, 576},
		{Options{GEMM: GEMMSplit}, kernels.BF16, v2, kernels.F32, 576},
		{Options{GEMM: GEMMRound, KVCacheDType: kernels.F8E4M3}, kernels.BF16, v2, kernels.F8E4M3, 656},
		{Options{GEMM: GEMMRound}, kernels.BF16, small, kernels.F32, 40},
	}
	for _, tc := range tests {
		g := newGPUOpts(t, tc.opts)
		if dt, w := g.MLACacheLayout(tc.w, tc.p); dt != tc.dt || w != tc.width {
			t.Errorf("%+v, weights %v, kvl %d: got (%v, %d), want (%v, %d)", tc.opts, tc.w, tc.p.KVLoraRank, dt, w, tc.dt, tc.width)
		}
	}
}
