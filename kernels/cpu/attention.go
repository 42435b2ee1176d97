package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// cacheTypes are the K and V cache element types WriteCache and Attention
// take: float32, and IEEE half and 8-bit E4M3 (Options.KVCacheDType),
// rounded when written and widened exactly when read.
var cacheTypes = []kernels.DType{kernels.F32, kernels.F16, kernels.F8E4M3}

// f8e4m3Values maps each E4M3 code to its float32 value (a constant table).
var f8e4m3Values = func() (v [256]float32) {
	for c := range v {
		v[c] = kernels.F8E4M3ToF32(uint8(c))
	}
	return v
}()

// WriteCache scatters rows of src into cache slots (rounded to IEEE half or
// E4M3 for a 16- or 8-bit cache, to nearest even).
func (b *Backend) WriteCache(cache, src, slotMapping kernels.Tensor, col int) error {
	const op = "write_cache"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	c, err := asCPU(op, "cache", cache)
	if err != nil {
		return err
	}
	s, err := asCPU(op, "src", src)
	if err != nil {
		return err
	}
	sm, err := asCPU(op, "slot_mapping", slotMapping)
	if err != nil {
		return err
	}
	cw, err := kernels.WriteCacheShapes("cpu", c, s, sm, col, cacheTypes...)
	if err != nil {
		return err
	}
	t, w, numSlots, width := cw.T, cw.W, cw.Slots, cw.Width
	for i, slot := range sm.i32 {
		if slot < -1 || int(slot) >= numSlots {
			return fmt.Errorf("cpu: %s: slot_mapping[%d] = %d, cache has %d slots: %w", op, i, slot, numSlots, kernels.ErrOutOfRange)
		}
	}
	b.forRows(t, w, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			slot := int(sm.i32[i])
			switch {
			case slot < 0:
			case c.dtype == kernels.F8E4M3:
				for k, x := range s.f32[i*w : (i+1)*w] {
					c.u8[slot*width+col+k] = kernels.F32ToF8E4M3(x)
				}
			case c.dtype == kernels.F16:
				b.k.f32ToF16(c.u16[slot*width+col:slot*width+col+w], s.f32[i*w:(i+1)*w])
			default:
				copy(c.f32[slot*width+col:slot*width+col+w], s.f32[i*w:(i+1)*w])
			}
		}
	})
	return nil
}

// attnPlan is the host view of AttentionMetadata, validated against a cache.
type attnPlan struct {
	blockSize int
	qStart    []int // per sequence
	qLen      []int // per sequence
	kLen      []int // per sequence
	blocks    [][]int32
	tokSeq    []int32 // sequence of each query row
	maxK      int
	ring      *ringSrc  // ring-buffer keys (RingAttention); nil for paged blocks
	sinks     []float32 // per query head sink logit (AttentionParams.Sinks); nil for none
}

// AttentionSinks reports that Attention and RingAttention honour
// AttentionParams.Sinks; see kernels.AttentionSinker.
func (b *Backend) AttentionSinks() bool { return true }

// sinkValues checks AttentionParams.Sinks (F32 [NumHeads]) and returns its
// values, nil when absent.
func sinkValues(op string, p kernels.AttentionParams) ([]float32, error) {
	if p.Sinks == nil {
		return nil, nil
	}
	s, err := asCPU(op, "sinks", p.Sinks)
	if err != nil {
		return nil, err
	}
	if err := kernels.CheckShape("cpu", op, "sinks", s, []int{p.NumHeads}, kernels.F32); err != nil {
		return nil, err
	}
	return s.f32, nil
}

// sinkScale returns the factor that turns a row's accumulated output
// (relative to running max m, denominator l) into its attention output
// when a sink logit joins the denominator: the max is taken over the
// scores and the sink, as the reference subtracts it before its softmax.
func sinkScale(m, l, sink float32) float32 {
	mNew := max(m, sink)
	a := float32(math.Exp(float64(m - mNew)))
	return a / (l*a + float32(math.Exp(float64(sink-mNew))))
}

// plan validates m against numTokens query rows and a cache of numBlocks
// blocks (kernels.MetadataShapes, then the values of its tensors); every
// block a sequence reads must be a valid block index.
func plan(op string, m *kernels.AttentionMetadata, numTokens, numBlocks, blockSize int) (*attnPlan, error) {
	return planSeqs(op, m, numTokens, numBlocks, blockSize, true)
}

// planSeqs is plan; without checkBlocks the block tables are neither
// checked nor read (ring attention reads no block).
func planSeqs(op string, m *kernels.AttentionMetadata, numTokens, numBlocks, blockSize int, checkBlocks bool) (*attnPlan, error) {
	cu, sk, bt, err := kernels.MetadataShapes[*Tensor]("cpu", op, m, numTokens, blockSize)
	if err != nil {
		return nil, err
	}
	n := m.NumSeqs
	if cu.i32[0] != 0 || int(cu.i32[n]) != numTokens {
		return nil, fmt.Errorf("cpu: %s: cu_seqlens_q spans [%d, %d), q has %d rows: %w", op, cu.i32[0], cu.i32[n], numTokens, kernels.ErrShape)
	}
	maxBlocks := bt.shape[1]
	p := &attnPlan{
		blockSize: blockSize,
		qStart:    make([]int, n),
		qLen:      make([]int, n),
		kLen:      make([]int, n),
		blocks:    make([][]int32, n),
		tokSeq:    make([]int32, numTokens),
	}
	for s := range n {
		lo, hi, k := int(cu.i32[s]), int(cu.i32[s+1]), int(sk.i32[s])
		if hi < lo {
			return nil, fmt.Errorf("cpu: %s: cu_seqlens_q decreases at sequence %d: %w", op, s, kernels.ErrShape)
		}
		if k < hi-lo {
			return nil, fmt.Errorf("cpu: %s: sequence %d has %d queries but %d keys: %w", op, s, hi-lo, k, kernels.ErrShape)
		}
		p.qStart[s], p.qLen[s], p.kLen[s] = lo, hi-lo, k
		p.maxK = max(p.maxK, k)
		for i := lo; i < hi; i++ {
			p.tokSeq[i] = int32(s)
		}
		if !checkBlocks {
			continue
		}
		need := (k + blockSize - 1) / blockSize
		if need > maxBlocks {
			return nil, fmt.Errorf("cpu: %s: sequence %d needs %d blocks, block table has %d: %w", op, s, need, maxBlocks, kernels.ErrOutOfRange)
		}
		row := bt.i32[s*maxBlocks : s*maxBlocks+need]
		for j, blk := range row {
			if blk < 0 || int(blk) >= numBlocks {
				return nil, fmt.Errorf("cpu: %s: block_tables[%d][%d] = %d, cache has %d blocks: %w", op, s, j, blk, numBlocks, kernels.ErrOutOfRange)
			}
		}
		p.blocks[s] = row
	}
	return p, nil
}

// visible returns the sequence of query row i and how many keys it sees.
func (p *attnPlan) visible(i int) (seq, numKeys int) {
	s := int(p.tokSeq[i])
	j := i - p.qStart[s]
	return s, p.kLen[s] - p.qLen[s] + j + 1
}

// slot is the cache slot of key t of sequence s.
func (p *attnPlan) slot(s, t int) int {
	return int(p.blocks[s][t/p.blockSize])*p.blockSize + t%p.blockSize
}

// slots writes the cache slots of keys [t0, t0+len(dst)) of sequence s
// into dst: slot for each, one block-table lookup and one division a block
// rather than a key (a division by the block size, unknown at compile
// time, costs more than the rest of a key's work here).
func (p *attnPlan) slots(dst []int32, s, t0 int) {
	bs := p.blockSize
	blocks := p.blocks[s]
	for j := 0; j < len(dst); {
		t := t0 + j
		off := t % bs
		base := int32(int(blocks[t/bs])*bs + off)
		run := dst[j:min(len(dst), j+bs-off)]
		for q := range run {
			run[q] = base + int32(q)
		}
		j += len(run)
	}
}

// Tiling of attention. Keys are processed in tiles of keyTile keys aligned
// on absolute key positions, query rows in chunks of up to rowChunk rows of
// one sequence. Every score (q·k over the head dimension) is one canonical
// SIMD dot product; a row's softmax state is updated tile by tile in key
// order (simd.Impl.OnlineSoftmax, its sum in the canonical lanes of the key's
// position in the tile); and p·v adds each key's value row in key order with
// one fused multiply-add per element into a per-tile sum that starts at +0
// (simd.Impl.AccumRows), which then joins the row's output. Keys a row
// cannot see get probability +0, which changes no bit of the sums, so a
// row's result is the same bits whether it is computed alone (decode) or
// with the rows of a prefill chunk, and whatever the thread split: only the
// tile boundaries, fixed in key positions, shape the order.
const (
	keyTile  = 128
	rowChunk = 32
)

// attnItem is one unit of parallel attention work: query rows [r0, r1) of
// sequence seq (and, for GQA, the query heads of KV head kvHead).
type attnItem struct{ seq, r0, r1, kvHead int }

// items cuts every sequence's query rows into chunks, times kvHeads. A
// run of one-row sequences over the same cache blocks (a speculative
// decode's verify rows: the last token and each draft laid out as a
// sequence of its own, each seeing one more key) joins one chunk, so that
// each key tile is gathered once for all of them and their scores run as
// one wider product; the chunk's sequence is the run's last (the longest
// table), and each row keeps its own key count. A run takes at most
// rowChunk rows, and no more than leaves workers items for the call's
// rows (5 verify rows of one head group on 2 workers: 3 and 2), so that
// merging never idles a worker. A row's bits do not depend on its chunk
// (see keyTile).
func (p *attnPlan) items(kvHeads, workers int) []attnItem {
	rows := 0
	if len(p.qStart) > 0 {
		rows = p.qStart[len(p.qStart)-1] + p.qLen[len(p.qLen)-1]
	}
	maxRun := min(rowChunk, max(1, (rows*kvHeads+workers-1)/max(workers, 1)))
	var out []attnItem
	for s := 0; s < len(p.qStart); {
		if e := p.sharedRun(s, maxRun); e > s+1 {
			for g := range kvHeads {
				out = append(out, attnItem{e - 1, p.qStart[s], p.qStart[e-1] + 1, g})
			}
			s = e
			continue
		}
		for r0 := p.qStart[s]; r0 < p.qStart[s]+p.qLen[s]; r0 += rowChunk {
			r1 := min(r0+rowChunk, p.qStart[s]+p.qLen[s])
			for g := range kvHeads {
				out = append(out, attnItem{s, r0, r1, g})
			}
		}
		s++
	}
	return out
}

// sharedRun returns the end of the run of sequences from s that items may
// attend as one chunk: one query row each, on consecutive rows, key counts
// that do not decrease, and each block table a prefix of the next one's
// (the same blocks for the keys they share), at most maxRun of them. s+1
// when s starts no such run (and for ring buffers, whose keys are not in
// blocks).
func (p *attnPlan) sharedRun(s, maxRun int) int {
	e := s + 1
	if p.qLen[s] != 1 || p.blocks[s] == nil {
		return e
	}
	for e < len(p.qStart) && e-s < maxRun && p.qLen[e] == 1 && p.qStart[e] == p.qStart[e-1]+1 &&
		p.kLen[e] >= p.kLen[e-1] && blockPrefix(p.blocks[e-1], p.blocks[e]) {
		e++
	}
	return e
}

// blockPrefix reports whether table a is a prefix of table b.
func blockPrefix(a, b []int32) bool {
	return len(a) <= len(b) && slices.Equal(a, b[:len(a)])
}

// onlineSoftmax is the running softmax state of R query rows and the key
// range [lo, hi) each row sees in the current tile.
type onlineSoftmax struct {
	m, l, alpha []float32
	lo, hi      []int32
}

func newOnlineSoftmax(r int) *onlineSoftmax {
	o := &onlineSoftmax{m: make([]float32, r), l: make([]float32, r), alpha: make([]float32, r),
		lo: make([]int32, r), hi: make([]int32, r)}
	o.reset(r)
	return o
}

func (o *onlineSoftmax) reset(r int) {
	for i := range r {
		o.m[i], o.l[i] = float32(math.Inf(-1)), 0
	}
}

// see records that row r sees the keys [first-t0, last-t0) of the tile of n
// keys starting at key t0, clipped to the tile.
func (o *onlineSoftmax) see(r, first, last, t0, n int) {
	o.lo[r], o.hi[r] = int32(min(max(first-t0, 0), n)), int32(min(max(last-t0, 0), n))
}

// update turns the scores of rows [0, r) over one tile of n keys (row rr
// seeing keys [lo[rr], hi[rr]), the rest masked) into probabilities
// relative to the running max, in place (simd.Impl.OnlineSoftmax: the
// scores are scaled inside, exponentials are simd.Impl.Exp's), and records
// in alpha the factor that rescales each row's previous output.
func (o *onlineSoftmax) update(k *kernelSet, scores []float32, r, n int, scale float32) {
	k.onlineSoftmax(scores, r, n, scale, o.lo, o.hi, o.m, o.l, o.alpha)
}

// tileRows[j] = j: the rows of a dense key tile for simd.Impl.AccumRows.
var tileRows = func() (t [keyTile]int32) {
	for j := range t {
		t[j] = int32(j)
	}
	return t
}()

// Attention is paged causal GQA attention; see kernels.Ops.
func (b *Backend) Attention(out, q, kCache, vCache kernels.Tensor, m *kernels.AttentionMetadata, p kernels.AttentionParams) error {
	const op = "attention"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCPU(op, "q", q)
	if err != nil {
		return err
	}
	kc, err := asCPU(op, "k_cache", kCache)
	if err != nil {
		return err
	}
	vc, err := asCPU(op, "v_cache", vCache)
	if err != nil {
		return err
	}
	t, err := kernels.AttentionShapes("cpu", o, qs, kc, vc, p, nil, cacheTypes)
	if err != nil {
		return err
	}
	pl, err := plan(op, m, t, kc.shape[0], kc.shape[1])
	if err != nil {
		return err
	}
	if pl.sinks, err = sinkValues(op, p); err != nil {
		return err
	}
	b.attendGQAItems(pl, p, qs.f32, kc, vc, o.f32, !(pl.ring == nil && (kc.dtype == kernels.F32 || kc.dtype == kernels.F16)))
	return nil
}

// attendGQAItems runs attendGQA over the plan's items on the workers,
// tiles telling whether keys and values are copied into scratch tiles
// (see gqaScratchFor). With fewer one-row items than workers (a decode at
// batch 1 of a model with few KV heads) each item's query heads are dealt
// to several workers.
func (b *Backend) attendGQAItems(pl *attnPlan, p kernels.AttentionParams, q []float32, kc, vc *Tensor, out []float32, tiles bool) {
	group := p.NumHeads / p.NumKVHeads
	items := pl.items(p.NumKVHeads, b.threads)
	parts := headParts(items, group, b.threads)
	b.run.For(len(items)*parts, func(lo, hi int) {
		maxR, maxN := 0, min(keyTile, pl.maxK)
		for u := lo; u < hi; u++ {
			it := items[u/parts]
			maxR = max(maxR, (it.r1-it.r0)*group)
		}
		s := b.gqaScratchFor(maxR, maxN, p.HeadDim, tiles)
		for u := lo; u < hi; u++ {
			j := u % parts
			b.attendGQA(items[u/parts], pl, p, q, kc, vc, out, s, group, j*group/parts, (j+1)*group/parts)
		}
		b.gqa.Put(s)
	})
}

// window returns the keys [first, last) query row i sees.
func (p *attnPlan) window(i, slidingWindow int) (first, last int) {
	_, last = p.visible(i)
	if slidingWindow > 0 {
		first = max(0, last-slidingWindow)
	}
	return first, last
}

// gqaScratch holds attendGQA's buffers, sized for its worker's items: qt
// the query rows of a KV head, kt and vt a tile's keys and values (row j at
// j*d) where they are copied, st the scores, acc the outputs, slots the
// cache slots of a tile's keys where they are read in place.
type gqaScratch struct {
	qt, kt, vt, st, acc []float32
	slots, next         []int32 // a tile's cache slots and the next tile's
	sm                  *onlineSoftmax
}

// gqaScratchFor returns buffers for up to r query rows (of one KV head) and
// tiles of up to n keys of head dimension d, from the backend's pool when
// one there is large enough (attendGQA reads only prefixes it sets first);
// tiles: kt and vt too (ring and 8-bit caches, which are copied; float32
// and half paged caches are read in place and need neither). Give it back
// with b.gqa.Put. Allocating kt and vt (2 x 32 KiB at head size 64) for every
// worker of every call cost a third of a one-row call over 129 keys.
func (b *Backend) gqaScratchFor(r, n, d int, tiles bool) *gqaScratch {
	nt := 0
	if tiles {
		nt = n * d
	}
	if s, _ := b.gqa.Get().(*gqaScratch); s != nil && len(s.qt) >= r*d && len(s.kt) >= nt && len(s.vt) >= nt &&
		len(s.st) >= r*n && len(s.acc) >= r*d && len(s.slots) >= n && len(s.next) >= n && len(s.sm.m) >= r {
		return s
	}
	return &gqaScratch{
		qt:    make([]float32, r*d),
		kt:    make([]float32, nt),
		vt:    make([]float32, nt),
		st:    make([]float32, r*n),
		acc:   make([]float32, r*d),
		slots: make([]int32, n),
		next:  make([]int32, n),
		sm:    newOnlineSoftmax(r),
	}
}

// attendGQA runs the query rows of one item over their keys, tile by tile.
// Keys and values of a float32 or half paged cache are read in place
// (their cache slots gathered; half rows widened in registers by
// LinearF16Gather and AccumRowsF16); ring and 8-bit caches are copied
// (widened) into kt and vt first. Either way every score is the canonical
// dot product of the query and key rows and every output the same
// AccumRows sum, so the paths give the same bits for the same values.
func (b *Backend) attendGQA(it attnItem, pl *attnPlan, p kernels.AttentionParams, q []float32, kc, vc *Tensor, out []float32, s *gqaScratch, group, g0, g1 int) {
	d, nh, kvWidth := p.HeadDim, p.NumHeads, p.NumKVHeads*p.HeadDim
	rows, gs := it.r1-it.r0, g1-g0
	r := rows * gs
	// Gather the query heads [g0, g1) of this KV head's group (all of it,
	// or part of a one-row item's: each (row, head) pair has its own
	// scores and softmax, so its bits do not depend on the others'): row
	// (i, hh) -> rr = (i-r0)*gs + hh-g0.
	for i := it.r0; i < it.r1; i++ {
		for hh := g0; hh < g1; hh++ {
			h := it.kvHead*group + hh
			copy(s.qt[((i-it.r0)*gs+hh-g0)*d:], q[i*nh*d+h*d:i*nh*d+(h+1)*d])
		}
	}
	kFirst, _ := pl.window(it.r0, p.SlidingWindow)
	_, kEnd := pl.window(it.r1-1, p.SlidingWindow)
	sm := s.sm
	sm.reset(r)
	clear(s.acc[:r*d])
	kvOff := it.kvHead * d
	inPlace := pl.ring == nil && kc.dtype == kernels.F32
	half := pl.ring == nil && kc.dtype == kernels.F16
	// In place: a tile's slots in bufs[cur], the next tile's, once asked
	// for, in the other.
	bufs, cur, fetched := [2][]int32{s.slots, s.next}, 0, false
	var slots []int32
	for t0 := kFirst / keyTile * keyTile; t0 < kEnd; t0 += keyTile {
		n := min(keyTile, kEnd-t0)
		scores := s.st[:r*n]
		ahead := false // half: the next tile's slots are in bufs[1-cur]
		if inPlace {
			slots = bufs[cur][:n]
			if !fetched {
				pl.slots(slots, it.seq, t0)
			}
			// The tile's values, asked for while its keys are gathered
			// (see the next tile's keys below).
			b.k.prefetchRows(vc.f32[kvOff:], slots, kvWidth, d)
			b.k.linearF32Gather(scores, s.qt[:r*d], kc.f32[kvOff:], slots, kvWidth, r, d)
		} else if half {
			slots = bufs[cur][:n]
			if !fetched {
				pl.slots(slots, it.seq, t0)
			}
			if kvOff%2 == 0 && kvWidth%2 == 0 && d%2 == 0 {
				// As the float32 path does: the tile's values, and the
				// next tile's keys, into L2 while this tile's keys are
				// scored (the first tile's keys too).
				kw, vw := halfWords(kc.u16[kvOff:]), halfWords(vc.u16[kvOff:])
				if !fetched {
					b.k.prefetchRows(kw, slots, kvWidth/2, d/2)
				}
				b.k.prefetchRows(vw, slots, kvWidth/2, d/2)
				if t0+keyTile < kEnd {
					next := bufs[1-cur][:min(keyTile, kEnd-t0-keyTile)]
					pl.slots(next, it.seq, t0+keyTile)
					b.k.prefetchRows(kw, next, kvWidth/2, d/2)
					ahead = true
				}
			}
			b.k.linearF16Gather(scores, s.qt[:r*d], kc.u16[kvOff:], slots, kvWidth, r, d)
		} else {
			for j := range n {
				kt, vt := s.kt[j*d:(j+1)*d], s.vt[j*d:(j+1)*d]
				if pl.ring != nil {
					pl.ring.gather(pl, it.seq, t0+j, kvOff, d, kc, vc, kt, vt)
					continue
				}
				base := pl.slot(it.seq, t0+j)*kvWidth + kvOff
				for e, x := range kc.u8[base : base+d] {
					kt[e] = f8e4m3Values[x]
				}
				for e, x := range vc.u8[base : base+d] {
					vt[e] = f8e4m3Values[x]
				}
			}
			b.k.linearF32(scores, s.qt[:r*d], s.kt[:n*d], r, n, d, 0, n)
		}
		for rr := range r {
			first, last := pl.window(it.r0+rr/gs, p.SlidingWindow)
			sm.see(rr, first, last, t0, n)
		}
		sm.update(&b.k, scores, r, n, p.Scale)
		if inPlace {
			if t0+keyTile < kEnd {
				// The next tile's keys, into L2 while this tile's P.V
				// runs: a decode step's cache comes from memory (the
				// step's weights evicted it since the last step), and the
				// gather of one tile's rows alone keeps too few loads in
				// flight. BenchmarkAttention/cold (one row over 576 keys,
				// 2 cores of an AMD EPYC VM): 67-75 µs a call against
				// 91-97 µs without the two prefetches; from hot caches
				// they cost 5-15% (129 and 1024 keys).
				next := bufs[1-cur][:min(keyTile, kEnd-t0-keyTile)]
				pl.slots(next, it.seq, t0+keyTile)
				b.k.prefetchRows(kc.f32[kvOff:], next, kvWidth, d)
			}
			b.k.accumRows(s.acc[:r*d], sm.alpha, scores, vc.f32[kvOff:], slots, kvWidth, r, d)
			cur, fetched = 1-cur, t0+keyTile < kEnd
		} else if half {
			b.k.accumRowsF16(s.acc[:r*d], sm.alpha, scores, vc.u16[kvOff:], slots, kvWidth, r, d)
			if ahead {
				cur = 1 - cur
			}
			fetched = ahead
		} else {
			b.k.accumRows(s.acc[:r*d], sm.alpha, scores, s.vt[:n*d], tileRows[:n], d, r, d)
		}
	}
	for rr := range r {
		i, h := it.r0+rr/gs, it.kvHead*group+g0+rr%gs
		inv := 1 / sm.l[rr]
		if pl.sinks != nil {
			inv = sinkScale(sm.m[rr], sm.l[rr], pl.sinks[h])
		}
		dst := out[i*nh*d+h*d : i*nh*d+(h+1)*d]
		for e, v := range s.acc[rr*d : (rr+1)*d] {
			dst[e] = v * inv
		}
	}
}

var _ kernels.MLACacher = (*Backend)(nil)

// MLACacheLayout implements kernels.MLACacher: the latent cache rows [c_kv
// k_pe] (KVLoraRank+RopeDim wide) in IEEE half under Options.KVCacheDType
// F16, whatever the weights, else in float32. (The packed 8-bit row is the
// CUDA backend's; an FP8 cache for an MLA model is refused at engine start.)
func (b *Backend) MLACacheLayout(_ kernels.DType, p kernels.MLAParams) (kernels.DType, int) {
	if b.kvCache == kernels.F16 {
		return kernels.F16, p.KVLoraRank + p.RopeDim
	}
	return kernels.F32, p.KVLoraRank + p.RopeDim
}

// WriteMLACache implements kernels.MLACacher: c_kv into columns [0,
// KVLoraRank) and k_pe into the RopeDim after them of each mapped row,
// rounded to nearest even for a half cache (WriteCache's rows). Cost:
// T*(KVLoraRank+RopeDim) element writes.
func (b *Backend) WriteMLACache(cache, ckv, kpe, slotMapping kernels.Tensor, p kernels.MLAParams) error {
	const op = "mla_write_cache"
	if p.KVLoraRank <= 0 || p.RopeDim <= 0 {
		return fmt.Errorf("cpu: %s: params %+v: %w", op, p, kernels.ErrShape)
	}
	if err := kernels.CheckShape("cpu", op, "ckv", ckv, []int{-1, p.KVLoraRank}, kernels.F32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cpu", op, "kpe", kpe, []int{ckv.Shape()[0], p.RopeDim}, kernels.F32); err != nil {
		return err
	}
	if err := kernels.CheckShape("cpu", op, "cache", cache, []int{-1, -1, p.KVLoraRank + p.RopeDim}, kernels.F32, kernels.F16); err != nil {
		return err
	}
	if err := b.WriteCache(cache, ckv, slotMapping, 0); err != nil {
		return err
	}
	return b.WriteCache(cache, kpe, slotMapping, p.KVLoraRank)
}

// MLAAttention is latent attention with weight absorption; see kernels.Ops.
// W_UK in float32, which absorbing q_nope multiplies by, is built from a
// BF16, F16, FP8 or block-quantized wkvb at its first call and reused after
// (see mlaWUK: 4*NumHeads*KVLoraRank*NopeDim bytes kept per weight), from
// an F32 wkvb at every call. Scratch buffers are reused across calls
// (mlaCache.scratch); neither changes any output bit. The latent cache is
// float32 or IEEE half (MLACacheLayout): a half cache's key tiles are
// widened exactly before use, so the outputs are those of a float32 cache
// holding the same values.
func (b *Backend) MLAAttention(out, q, cache, wkvb kernels.Tensor, m *kernels.AttentionMetadata, p kernels.MLAParams) error {
	const op = "mla_attention"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	o, err := asCPU(op, "out", out)
	if err != nil {
		return err
	}
	qs, err := asCPU(op, "q", q)
	if err != nil {
		return err
	}
	c, err := asCPU(op, "cache", cache)
	if err != nil {
		return err
	}
	w, err := asCPU(op, "wkvb", wkvb)
	if err != nil {
		return err
	}
	t, err := kernels.MLAShapes("cpu", o, qs, c, w, p, kernels.F16)
	if err != nil {
		return err
	}
	pl, err := plan(op, m, t, c.shape[0], c.shape[1])
	if err != nil {
		return err
	}
	wuk := b.mlaWUK(w, p)
	items := pl.items(1, b.threads)
	limit := mlaGroupFloats
	if b.mla.groupFloats > 0 {
		limit = b.mla.groupFloats
	}
	groupRows := max(rowChunk, limit/(p.NumHeads*(p.KVLoraRank+p.RopeDim)))
	segKeys := mlaSegmentKeys
	if b.mla.segmentKeys > 0 {
		segKeys = b.mla.segmentKeys
	}
	g, _ := b.mla.groups.Get().(*mlaGroup)
	if g == nil {
		g = &mlaGroup{}
	}
	for a := 0; a < len(items); {
		lo, hi, e := items[a].r0, items[a].r1, a+1
		for e < len(items) && items[e].r0 == hi && items[e].r1-lo <= groupRows {
			hi = items[e].r1
			e++
		}
		g.size(p, hi-lo)
		b.run.For(p.NumHeads, func(h0, h1 int) { b.absorbMLA(g, p, qs.f32, wuk, lo, hi, h0, h1) })
		if units := mlaUnits(items[a:e], pl, segKeys); units != nil {
			b.attendMLASegments(items[a:e], units, pl, p, c, g, lo)
		} else {
			// Fewer one-row items than workers (a decode at batch 1):
			// each item's heads are dealt to several workers.
			parts := headParts(items[a:e], p.NumHeads, b.threads)
			b.run.For((e-a)*parts, func(u0, u1 int) {
				s := b.mlaScratchFor(p, items[a+u0/parts:a+(u1+parts-1)/parts], pl, c.dtype)
				for u := u0; u < u1; u++ {
					it, j := items[a+u/parts], u%parts
					_, kEnd := pl.visible(it.r1 - 1)
					wk := mlaWork{it: it, h0: j * p.NumHeads / parts, h1: (j + 1) * p.NumHeads / parts, k1: kEnd}
					if u+1 < u1 && (u+1)%parts == 0 {
						wk.next = &items[a+(u+1)/parts]
					}
					b.attendMLA(wk, pl, p, c, g, lo, s)
				}
				b.mla.scratch.Put(s)
			})
		}
		b.run.For(p.NumHeads, func(h0, h1 int) { b.projectMLA(g, p, w, o.f32, lo, hi, h0, h1) })
		a = e
	}
	b.mla.groups.Put(g)
	return nil
}

// mlaSegmentKeys is the span of keys, aligned on absolute key positions,
// that one unit of MLAAttention's work attends: a row that sees more keys
// is attended segment by segment, each segment with its own softmax state
// (the tiles of keyTile keys in order, as for a whole row), and the
// segments' states are merged in segment order (mergeMLASegments). So the
// segments of one long row run on different workers, as a decode row at
// batch 1 otherwise keeps one core busy while the others wait, and a row's
// bits depend only on its own key count: the same alone or in any batch,
// under any thread count. A row of at most this many keys is computed as
// before, bit for bit. A multiple of keyTile.
const mlaSegmentKeys = 512

// headParts is how many parts each item's heads (of heads) are cut into
// so that fewer one-row items than workers still use every worker: 1
// otherwise. Each (row, head) pair has its own scores and softmax, so the
// cut changes no bit.
func headParts(items []attnItem, heads, workers int) int {
	n := len(items)
	if n == 0 || n >= workers {
		return 1
	}
	for _, it := range items {
		if it.r1-it.r0 != 1 {
			return 1
		}
	}
	return min(heads, (workers+n-1)/n)
}

// mlaUnit is one segment of an item: its keys [k0, k1).
type mlaUnit struct {
	item, k0, k1 int
}

// mlaUnits returns the segments of items (see mlaSegmentKeys), in item
// order and key order within an item; nil when no item has more than one
// (then nothing is allocated).
func mlaUnits(items []attnItem, pl *attnPlan, segKeys int) []mlaUnit {
	split := false
	for _, it := range items {
		if _, kEnd := pl.visible(it.r1 - 1); kEnd > segKeys {
			split = true
			break
		}
	}
	if !split {
		return nil
	}
	var units []mlaUnit
	for i, it := range items {
		_, kEnd := pl.visible(it.r1 - 1)
		for k0 := 0; k0 < kEnd || k0 == 0; k0 += segKeys {
			units = append(units, mlaUnit{i, k0, min(k0+segKeys, kEnd)})
		}
	}
	return units
}

// mlaWork is one call of attendMLA: item it's heads [h0, h1) over keys
// [k0, k1), the next call's item and first key (to fetch ahead; nil: none),
// and where a key segment's state goes (zero: the whole row, into g.olat).
type mlaWork struct {
	it             attnItem
	h0, h1, k0, k1 int
	next           *attnItem
	nextK0         int
	seg            mlaOut
}

// mlaOut is where attendMLA leaves a segment's unnormalized state: the
// latent sums of its rows (acc, [rows][heads][KVLoraRank]) and each row
// and head's running max and sum (m, l). Zero: the item's rows of g.olat,
// normalized.
type mlaOut struct {
	acc, m, l []float32
}

// mlaScratchFor returns attendMLA's scratch for the items (their largest
// row count and the plan's longest tile); the caller puts it back.
func (b *Backend) mlaScratchFor(p kernels.MLAParams, items []attnItem, pl *attnPlan, cdt kernels.DType) *mlaScratch {
	rows := 0
	for _, it := range items {
		rows = max(rows, it.r1-it.r0)
	}
	tile := min(keyTile, pl.maxK)
	s, _ := b.mla.scratch.Get().(*mlaScratch)
	if s == nil || !s.fits(p, rows, tile, cdt) {
		s = newMLAScratch(p, rows, tile, cdt)
	}
	return s
}

// attendMLASegments attends items segment by segment (units, from
// mlaUnits), the units dealt to the workers, each segment's state kept
// apart, then merges every item's segments into its rows of g.olat.
// Cost: attendMLA's, plus (heads*rows)*(KVLoraRank+2) floats a unit and
// one pass over them.
func (b *Backend) attendMLASegments(items []attnItem, units []mlaUnit, pl *attnPlan, p kernels.MLAParams, c *Tensor, g *mlaGroup, lo int) {
	nh, kvl := p.NumHeads, p.KVLoraRank
	off := make([]int, len(units)+1) // unit u's rows*heads start at off[u]
	for u, un := range units {
		it := items[un.item]
		off[u+1] = off[u] + (it.r1-it.r0)*nh
	}
	buf, pooled := poolFloats(&b.mla.parts, off[len(units)]*(kvl+2))
	defer pooled.done()
	part := func(u int) mlaOut {
		r0, r1 := off[u], off[u+1]
		acc, ms := buf[r0*kvl:r1*kvl], buf[off[len(units)]*kvl:]
		return mlaOut{acc: acc, m: ms[2*r0 : 2*r0+(r1-r0)], l: ms[2*r0+(r1-r0) : 2*r1]}
	}
	b.run.For(len(units), func(u0, u1 int) {
		var its []attnItem
		for _, un := range units[u0:u1] {
			its = append(its, items[un.item])
		}
		s := b.mlaScratchFor(p, its, pl, c.dtype)
		for u := u0; u < u1; u++ {
			// The next unit's first key tile is fetched ahead, as for
			// whole items.
			var next *attnItem
			nextK0 := 0
			if u+1 < u1 {
				next, nextK0 = &items[units[u+1].item], units[u+1].k0
			}
			b.attendMLA(mlaWork{it: items[units[u].item], h1: p.NumHeads, k0: units[u].k0, k1: units[u].k1, next: next, nextK0: nextK0, seg: part(u)},
				pl, p, c, g, lo, s)
		}
		b.mla.scratch.Put(s)
	})
	b.run.For(len(items), func(i0, i1 int) {
		u := 0
		for i := i0; i < i1; i++ {
			for u < len(units) && units[u].item < i {
				u++
			}
			var segs []mlaOut
			for ; u < len(units) && units[u].item == i; u++ {
				segs = append(segs, part(u))
			}
			it := items[i]
			r := (it.r1 - it.r0) * nh
			mergeMLASegments(g.olat[(it.r0-lo)*nh*kvl:(it.r0-lo)*nh*kvl+r*kvl], segs, r, kvl)
		}
	})
}

// mergeMLASegments writes into out the normalized latent outputs of r
// rows (rows*heads) from their segments' states, in segment order: with
// m the largest running max of the segments a row saw keys in, each such
// segment s weighs exp(m_s - m), out = (sum of acc_s weighted) / (sum of
// l_s weighted), the first segment's product taken as it is, each
// following one added, every product rounded on its own (no fused
// multiply-add, so that every build gives the same bits). A row whose
// keys all lie in one segment gets weight exp(0) = 1: the bits of the row
// attended whole.
func mergeMLASegments(out []float32, segs []mlaOut, r, kvl int) {
	for rr := range r {
		m := float32(math.Inf(-1))
		for _, sg := range segs {
			if sg.l[rr] > 0 {
				m = max(m, sg.m[rr])
			}
		}
		row := out[rr*kvl : (rr+1)*kvl]
		var l float32
		first := true
		for _, sg := range segs {
			if sg.l[rr] <= 0 {
				continue
			}
			w := float32(math.Exp(float64(sg.m[rr] - m)))
			acc := sg.acc[rr*kvl : (rr+1)*kvl]
			if first {
				l = float32(sg.l[rr] * w)
				for e := range row {
					row[e] = float32(acc[e] * w)
				}
				first = false
				continue
			}
			l += float32(sg.l[rr] * w)
			for e := range row {
				row[e] += float32(acc[e] * w)
			}
		}
		inv := 1 / l
		for e := range row {
			row[e] *= inv
		}
	}
}

// mlaGroupFloats bounds the absorbed query rows MLAAttention keeps at once
// (float32 elements; 8 MiB): consecutive items are absorbed and projected
// together up to this many, at least one item (rowChunk rows) at a time.
const mlaGroupFloats = 2 << 20

// mlaGroup holds the rows of a group of items, shared by the three passes
// of MLAAttention: x the absorbed query rows [q_nope W_UK, q_pe] and olat
// the latent outputs, both [rows][heads][...] with rows counted from the
// group's first.
type mlaGroup struct {
	x, olat []float32
}

// size makes g hold rows query rows of p's dimensions.
func (g *mlaGroup) size(p kernels.MLAParams, rows int) {
	nx, no := rows*p.NumHeads*(p.KVLoraRank+p.RopeDim), rows*p.NumHeads*p.KVLoraRank
	if cap(g.x) < nx {
		g.x = make([]float32, nx)
	}
	if cap(g.olat) < no {
		g.olat = make([]float32, no)
	}
	g.x, g.olat = g.x[:nx], g.olat[:no]
}

// buildWUK returns W_UK[h] in float32 for every head h of the MLA weight
// w: [NumHeads][NopeDim][KVLoraRank], the values rowF32 reads from rows
// h*(NopeDim+VHeadDim)+[0, NopeDim) of w, in the weight's own (k-major)
// layout, which absorbing q_nope multiplies by directly
// (simd.Impl.LinearF32KMajor). Cost: one pass over W_UK (rows widened or
// dequantized) and 4*NumHeads*KVLoraRank*NopeDim bytes allocated.
func (b *Backend) buildWUK(w *Tensor, p kernels.MLAParams) []float32 {
	nh, nope, kvl, vd := p.NumHeads, p.NopeDim, p.KVLoraRank, p.VHeadDim
	wuk := make([]float32, nh*nope*kvl)
	b.run.For(nh, func(lo, hi int) {
		for h := lo; h < hi; h++ {
			for dd := range nope {
				dst := wuk[(h*nope+dd)*kvl : (h*nope+dd+1)*kvl]
				if row := b.rowF32(w, h*(nope+vd)+dd, kvl, dst); &row[0] != &dst[0] {
					copy(dst, row)
				}
			}
		}
	})
	return wuk
}

// mlaWUK returns buildWUK(w, p), built once per stored weight: BF16, F16,
// FP8 and block-quantized weights are written only by Upload (BF16, F16) or
// never after FP8Weight and QuantWeight, so their W_UK is built at their
// first MLAAttention call and kept on the backend (mlaCache), found again by
// the address of the stored values (views of the same rows share it) and the
// MLA dimensions. The values are the ones buildWUK computes, so cached and
// uncached calls give bit-identical outputs. F32 weights, which any op may
// write, are copied per call. Memory: 4*NumHeads*KVLoraRank*NopeDim
// bytes per layer's kv_b weight, held until the backend is dropped or Upload
// writes over the weight (DeepSeek-V3: 32 MiB a layer, twice the BF16 W_UK;
// the shipped tiny model: 128 KiB a layer). Safe for concurrent calls: the
// map is guarded by a mutex and each entry is built once, outside it.
func (b *Backend) mlaWUK(w *Tensor, p kernels.MLAParams) []float32 {
	key := mlaKey{dtype: w.dtype, nh: p.NumHeads, nope: p.NopeDim, vd: p.VHeadDim, kvl: p.KVLoraRank}
	var lo, hi uintptr
	switch {
	case w.dtype == kernels.BF16 || w.dtype == kernels.F16:
		if len(w.u16) > 0 {
			key.data = unsafe.Pointer(&w.u16[0])
			lo, hi = uintptr(key.data), uintptr(key.data)+2*uintptr(len(w.u16))
		}
	case w.fp8 != nil:
		if len(w.u8) > 0 {
			key.data = unsafe.Pointer(&w.u8[0])
		}
	case w.q != nil:
		if len(w.q.segs) > 0 && len(w.q.segs[0].data) > 0 {
			key.data = unsafe.Pointer(&w.q.segs[0].data[0])
		}
	}
	if key.data == nil {
		return b.buildWUK(w, p)
	}
	c := &b.mla
	c.mu.Lock()
	e := c.m[key]
	if e == nil {
		if c.m == nil {
			c.m = make(map[mlaKey]*mlaEntry)
		}
		e = &mlaEntry{lo: lo, hi: hi}
		c.m[key] = e
	}
	c.mu.Unlock()
	e.once.Do(func() { e.wuk = b.buildWUK(w, p) })
	return e.wuk
}

// mlaCache holds the W_UK that mlaWUK built, per stored MLA weight, and
// MLAAttention's scratch buffers for reuse across calls (a *mlaScratch may
// be larger than a call needs: attendMLA reads and writes only the prefixes
// that it sizes from the call's dimensions, and sets them before reading).
type mlaCache struct {
	mu      sync.Mutex
	m       map[mlaKey]*mlaEntry
	scratch sync.Pool // *mlaScratch
	groups  sync.Pool // *mlaGroup
	work    sync.Pool // *[]float32: absorbMLA's and projectMLA's rows of a head
	parts   sync.Pool // *[]float32: attendMLASegments' segment states
	// groupFloats replaces mlaGroupFloats when positive (tests: groups of
	// a few items), segmentKeys mlaSegmentKeys (tests: short segments).
	groupFloats, segmentKeys int
}

// floats returns a buffer of n float32 from the pool (contents unset) and
// the handle whose done gives it back.
func (c *mlaCache) floats(n int) ([]float32, pooledFloats) { return poolFloats(&c.work, n) }

// poolFloats returns a buffer of n float32 from p (a pool of *[]float32;
// contents unset, a new buffer when the pooled one is too small) and the
// handle whose done gives it back. The handle is a value, so that taking a
// buffer allocates nothing once the pool holds one.
func poolFloats(p *sync.Pool, n int) ([]float32, pooledFloats) {
	v, _ := p.Get().(*[]float32)
	if v == nil || cap(*v) < n {
		buf := make([]float32, n)
		v = &buf
	}
	return (*v)[:n], pooledFloats{p, v}
}

// pooledFloats is a buffer taken from a pool by poolFloats.
type pooledFloats struct {
	p *sync.Pool
	v *[]float32
}

// done gives the buffer back to its pool.
func (h pooledFloats) done() { h.p.Put(h.v) }

// mlaKey names a stored weight and the MLA dimensions its W_UK was built
// for. data is the address of the weight's first stored value (its first
// BF16/F16 element, FP8 byte or quantized block byte); as a pointer it keeps
// those values alive, so no other weight can take the address while the
// entry exists.
type mlaKey struct {
	data              unsafe.Pointer
	dtype             kernels.DType
	nh, nope, vd, kvl int
}

type mlaEntry struct {
	once   sync.Once
	lo, hi uintptr // the BF16/F16 values' address range (0, 0 for others)
	wuk    []float32
}

// forget drops the W_UK built from BF16 or F16 values that overlap t's:
// Upload calls it before writing t.
func (c *mlaCache) forget(t *Tensor) {
	if (t.dtype != kernels.BF16 && t.dtype != kernels.F16) || len(t.u16) == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(&t.u16[0]))
	hi := lo + 2*uintptr(len(t.u16))
	c.mu.Lock()
	for k, e := range c.m {
		if e.lo < hi && lo < e.hi {
			delete(c.m, k)
		}
	}
	c.mu.Unlock()
}

// mlaScratch holds attendMLA's buffers: st a tile's scores, slots the
// cache slots of a tile's keys, sm the running softmax of the item's rows;
// for a half cache, wide a tile's rows widened to float32 (read in order
// through tileRows).
type mlaScratch struct {
	st    []float32
	slots []int32
	next  []int32 // the next item's first slots (attendMLA's prefetch)
	sm    *onlineSoftmax
	wide  []float32
}

// newMLAScratch sizes buffers for items of up to rows query rows and key
// tiles of up to tile keys over a cache of type cdt.
func newMLAScratch(p kernels.MLAParams, rows, tile int, cdt kernels.DType) *mlaScratch {
	r := rows * p.NumHeads
	s := &mlaScratch{st: make([]float32, r*tile), slots: make([]int32, tile), next: make([]int32, keyTile), sm: newOnlineSoftmax(r)}
	if cdt == kernels.F16 {
		s.wide = make([]float32, tile*(p.KVLoraRank+p.RopeDim))
	}
	return s
}

// fits reports whether s holds what newMLAScratch(p, rows, tile, cdt) sizes.
func (s *mlaScratch) fits(p kernels.MLAParams, rows, tile int, cdt kernels.DType) bool {
	r := rows * p.NumHeads
	ok := len(s.st) >= r*tile && len(s.slots) >= tile && len(s.sm.m) >= r
	if cdt == kernels.F16 {
		ok = ok && len(s.wide) >= tile*(p.KVLoraRank+p.RopeDim)
	}
	return ok
}

// The three passes of MLAAttention over a group of items, rows [lo, hi)
// of q: absorbMLA (per head, every row of the group in one product),
// attendMLA (per item) and projectMLA (per head, every row of the group in
// one product). Each product's rows do not depend on the other rows it is
// given (LinearF32 and the weight kernels are batch invariant), so a row's
// bits do not depend on its group, and they are those of the item alone.
// Batching the rows of a decode batch makes each head's absorption and
// projection one product of up to the group's rows rather than one
// one-row product per sequence.

// absorbMLA writes the absorbed query rows of heads [h0, h1) for rows [lo,
// hi) of q into g.x: row (i, h) = [q_nope W_UK[h], q_pe], q_nope read in
// place and the product written in place (LinearF32KMajor over wuk, W_UK
// in float32 as buildWUK lays it out: the canonical dot products of q_nope
// and W_UK^T's rows).
func (b *Backend) absorbMLA(g *mlaGroup, p kernels.MLAParams, q, wuk []float32, lo, hi, h0, h1 int) {
	nh, nope, rope, kvl := p.NumHeads, p.NopeDim, p.RopeDim, p.KVLoraRank
	qd, width, rows := nope+rope, kvl+rope, hi-lo
	for h := h0; h < h1; h++ {
		b.k.linearF32KMajor(g.x[h*width:], nh*width, q[lo*nh*qd+h*qd:], nh*qd,
			wuk[h*nope*kvl:(h+1)*nope*kvl], rows, kvl, nope)
		for i := range rows {
			row := g.x[(i*nh+h)*width : (i*nh+h+1)*width]
			copy(row[kvl:], q[(lo+i)*nh*qd+h*qd+nope:(lo+i)*nh*qd+(h+1)*qd])
		}
	}
}

// attendMLA attends the absorbed rows of one item (g.x, the group starting
// at row lo) over the latent cache tile by tile, reading float32 cache rows
// in place (their slots gathered) and widening a half cache's rows of a
// tile first (F16Rows, exact): scores are canonical dot products of the
// absorbed query rows and the cache rows (LinearF32Gather), probabilities
// come from OnlineSoftmax, and the latent outputs accumulate the
// probability-weighted cache rows (AccumRows, in key order, no transpose
// of V) into g.olat, all of it independent of the other rows of the call.
// It covers wk's keys and heads: every key, normalized into g.olat, or one
// key segment, whose unnormalized state goes to wk.seg (mlaOut); every
// head, or some heads of a one-row item (each (row, head) pair has its own
// scores and softmax, so its bits do not depend on the others'). With
// wk.next set, the keys of next from nextK0 on are fetched into L2 during
// the last tiles.
func (b *Backend) attendMLA(wk mlaWork, pl *attnPlan, p kernels.MLAParams, cache *Tensor, g *mlaGroup, lo int, s *mlaScratch) {
	it, next, nextK0, k0, kEnd, seg := wk.it, wk.next, wk.nextK0, wk.k0, wk.k1, wk.seg
	nh, kvl := p.NumHeads, p.KVLoraRank
	width := kvl + p.RopeDim
	heads := wk.h1 - wk.h0
	r := (it.r1 - it.r0) * heads // (row, head) pairs: every head, or some of one row's
	first := (it.r0-lo)*nh + wk.h0
	x := g.x[first*width : first*width+r*width]
	acc := seg.acc
	if acc == nil {
		acc = g.olat[first*kvl : first*kvl+r*kvl]
	}
	half := cache.dtype == kernels.F16
	sm := s.sm
	sm.reset(r)
	clear(acc)
	fetched := false
	for t0 := k0; t0 < kEnd; t0 += keyTile {
		n := min(keyTile, kEnd-t0)
		slots := s.slots[:n]
		pl.slots(slots, it.seq, t0)
		kv, rows := cache.f32, slots // the tile's rows: in place, or widened
		if half {
			kv, rows = s.wide[:n*width], tileRows[:n]
			b.k.f16Rows(kv, cache.u16, slots, width, width)
		}
		scores := s.st[:r*n]
		b.k.linearF32Gather(scores, x, kv, rows, width, r, width)
		for rr := range r {
			_, last := pl.visible(it.r0 + rr/heads)
			sm.see(rr, 0, last, t0, n)
		}
		sm.update(&b.k, scores, r, n, p.Scale)
		if next != nil && t0+2*keyTile > kEnd && !fetched {
			// The next item's first key tile, into L2 while this one's
			// P.V runs from the caches (the last full tile's, so that
			// it has key steps to spread over): a decode step's latent
			// cache (4.7 MB a layer at batch 64 and 129 keys for the
			// default model in float32) comes from memory, the step's
			// weights having evicted it since the last step, and the
			// gather of one tile's rows keeps too few of its loads in
			// flight. A half cache's rows are asked for in one burst
			// (PrefetchRows over the rows' bytes), P.V reading the
			// widened tile.
			fetched = true
			_, nEnd := pl.visible(next.r1 - 1)
			ns := s.next[:min(keyTile, nEnd-nextK0)]
			pl.slots(ns, next.seq, nextK0)
			if !half {
				b.k.accumRowsPrefetch(acc, sm.alpha, scores, kv, rows, width, r, kvl, ns, width)
				continue
			}
			if width%2 == 0 {
				b.k.prefetchRows(halfWords(cache.u16), ns, width/2, width/2)
			}
		}
		b.k.accumRows(acc, sm.alpha, scores, kv, rows, width, r, kvl)
	}
	if seg.acc != nil { // a segment: its state, unnormalized
		copy(seg.m, sm.m[:r])
		copy(seg.l, sm.l[:r])
		return
	}
	for rr := range r {
		inv := 1 / sm.l[rr]
		row := acc[rr*kvl : (rr+1)*kvl]
		for e := range row {
			row[e] *= inv
		}
	}
}

// halfWords views u (IEEE-half values) as float32 words at the same
// addresses: for rows of an even width, row i's bytes are words [i*width/2,
// (i+1)*width/2), which a prefetch asks for without reading a value.
func halfWords(u []uint16) []float32 {
	if len(u) < 2 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&u[0])), len(u)/2)
}

// projectMLA writes out[i, h] = o_lat[i, h] W_UV[h]^T for heads [h0, h1)
// and rows [lo, hi) (g.olat rows (i, h) are strided by the heads).
func (b *Backend) projectMLA(g *mlaGroup, p kernels.MLAParams, w *Tensor, out []float32, lo, hi, h0, h1 int) {
	nh, nope, kvl, vd := p.NumHeads, p.NopeDim, p.KVLoraRank, p.VHeadDim
	rows := hi - lo
	buf, pooled := b.mla.floats(rows * (kvl + vd))
	defer pooled.done()
	lat, ov := buf[:rows*kvl], buf[rows*kvl:]
	for h := h0; h < h1; h++ {
		for i := range rows {
			copy(lat[i*kvl:(i+1)*kvl], g.olat[(i*nh+h)*kvl:(i*nh+h+1)*kvl])
		}
		r0, r1 := h*(nope+vd)+nope, h*(nope+vd)+nope+vd // W_UV[h]: rows of w
		switch w.dtype {
		case kernels.F32:
			b.k.linearF32(ov, lat, w.f32[r0*kvl:r1*kvl], rows, vd, kvl, 0, vd)
		case kernels.BF16:
			b.k.linearBF16(ov, lat, w.u16[r0*kvl:r1*kvl], rows, vd, kvl, 0, vd)
		case kernels.F16:
			b.k.linearF16(ov, lat, w.u16[r0*kvl:r1*kvl], rows, vd, kvl, 0, vd)
		case kernels.F8E4M3:
			b.k.linearF8(ov, lat, rowsView(w, r0, r1, kvl).f8Weights(), rows, vd, kvl, 0, vd)
		case kernels.Quant:
			b.linearQuant(ov, lat, rowsView(w, r0, r1, kvl).q, rows, vd, kvl, 0, vd)
		}
		for i := range rows {
			copy(out[(lo+i)*nh*vd+h*vd:], ov[i*vd:(i+1)*vd])
		}
	}
}

// rowsView is rows [lo, hi) of a matrix with rows of n elements.
func rowsView(t *Tensor, lo, hi, n int) *Tensor {
	if t.q != nil {
		return t.qRows(lo, hi, []int{hi - lo, n})
	}
	if t.fp8 != nil {
		return t.f8Rows(lo, hi, n, []int{hi - lo, n})
	}
	v := &Tensor{shape: []int{hi - lo, n}, dtype: t.dtype, keep: t.keep}
	if t.dtype == kernels.F32 {
		v.f32 = t.f32[lo*n : hi*n]
	} else {
		v.u16 = t.u16[lo*n : hi*n]
	}
	return v
}
