package cuda

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// newGPU opens the CUDA backend. Where no library or device exists and
// DEEPINFER_CUDA_LIB is unset, the test is skipped (the GPU tests run on a
// GPU machine, with the variable set); with the variable set, any failure is
// a test failure.
func newGPU(t testing.TB, mode GEMMMode) *Backend {
	t.Helper()
	return newGPUOpts(t, Options{GEMM: mode})
}

// newGPUOpts is newGPU with any options, to which the test environment's
// DEEPINFER_CUDA_* switches are added (optionsFromTestEnv: for benchmarks
// that tools/gpu/check.sh runs under several settings).
func newGPUOpts(t testing.TB, opts Options) *Backend {
	t.Helper()
	opts, err := optionsFromTestEnv(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(opts)
	if err != nil {
		if os.Getenv(LibraryEnv) == "" && (errors.Is(err, ErrNoLibrary) || errors.Is(err, ErrNoDevice)) {
			t.Skipf("GPU test skipped: %v (set %s to run it on a GPU machine)", err, LibraryEnv)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// pair runs the same operations on the CPU backend (the reference) and on
// the CUDA backend, with the same inputs.
type pair struct {
	t *testing.T
	c *cpu.Backend
	g *Backend
	r *rand.Rand
}

func newPair(t *testing.T, mode GEMMMode) *pair {
	t.Helper()
	return newPairOpts(t, Options{GEMM: mode})
}

// newPairOpts is newPair with any options for the CUDA backend.
func newPairOpts(t *testing.T, opts Options) *pair {
	t.Helper()
	g := newGPUOpts(t, opts)
	c := cpu.New(cpu.Options{Threads: 4})
	t.Cleanup(func() { c.Close() })
	return &pair{t: t, c: c, g: g, r: rand.New(rand.NewPCG(uint64(len(t.Name())), 7))}
}

// dual is one tensor on each backend.
type dual struct{ c, g kernels.Tensor }

func randVals(r *rand.Rand, n int, scale float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = (r.Float32()*2 - 1) * scale
	}
	return xs
}

// hostBytes encodes xs in dt (rounding for 16-bit types).
func hostBytes(dt kernels.DType, xs []float32) []byte {
	switch dt {
	case kernels.BF16, kernels.F16:
		u := make([]uint16, len(xs))
		for i, x := range xs {
			if dt == kernels.BF16 {
				u[i] = kernels.F32ToBF16(x)
			} else {
				u[i] = kernels.F32ToF16(x)
			}
		}
		return kernels.U16Bytes(u)
	case kernels.F8E4M3:
		b := make([]byte, len(xs))
		for i, x := range xs {
			b[i] = kernels.F32ToF8E4M3(x)
		}
		return b
	}
	return kernels.F32Bytes(xs)
}

func upload(t testing.TB, ops kernels.Ops, dt kernels.DType, raw []byte, srcDT kernels.DType, shape ...int) kernels.Tensor {
	t.Helper()
	ten, err := ops.Alloc(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.Upload(ten, raw, srcDT); err != nil {
		t.Fatal(err)
	}
	return ten
}

// put uploads xs (rounded to dt) to both backends.
func (p *pair) put(dt kernels.DType, xs []float32, shape ...int) dual {
	raw := hostBytes(dt, xs)
	return dual{upload(p.t, p.c, dt, raw, dt, shape...), upload(p.t, p.g, dt, raw, dt, shape...)}
}

// rand uploads uniform values in [-scale, scale).
func (p *pair) rand(dt kernels.DType, scale float32, shape ...int) dual {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return p.put(dt, randVals(p.r, n, scale), shape...)
}

// positionsAndSlots draws tokens rope positions below maxPos and distinct
// cache slots below numSlots (every skipEvery-th token's, from the second,
// -1: not written; 0: none), as I32 tensors on both backends.
func (p *pair) positionsAndSlots(tokens, maxPos, numSlots, skipEvery int) (positions, slots dual) {
	pos, sl := make([]int32, tokens), make([]int32, tokens)
	perm := p.r.Perm(numSlots)
	for i := range pos {
		pos[i] = int32(p.r.IntN(maxPos))
		sl[i] = int32(perm[i])
		if skipEvery > 0 && i%skipEvery == 1 {
			sl[i] = -1
		}
	}
	return p.ints(pos, tokens), p.ints(sl, tokens)
}

func (p *pair) ints(xs []int32, shape ...int) dual {
	raw := kernels.I32Bytes(xs)
	return dual{upload(p.t, p.c, kernels.I32, raw, kernels.I32, shape...), upload(p.t, p.g, kernels.I32, raw, kernels.I32, shape...)}
}

func (p *pair) zeros(dt kernels.DType, shape ...int) dual {
	c, err := p.c.Alloc(dt, shape...)
	if err != nil {
		p.t.Fatal(err)
	}
	g, err := p.g.Alloc(dt, shape...)
	if err != nil {
		p.t.Fatal(err)
	}
	return dual{c, g}
}

// poison fills a GPU tensor with NaN so that unwritten outputs show.
func (p *pair) poison(d dual) {
	n := kernels.NumElements(d.g)
	nan := make([]float32, n)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	if err := p.g.Upload(d.g, kernels.F32Bytes(nan), kernels.F32); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pair) f32(ops kernels.Ops, ten kernels.Tensor) []float32 {
	p.t.Helper()
	v, err := kernels.ToF32(ops, ten)
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

// raw downloads ten's bytes as stored (any dtype).
func (p *pair) raw(ops kernels.Ops, ten kernels.Tensor) []byte {
	p.t.Helper()
	buf := make([]byte, kernels.NumElements(ten)*ten.DType().Size())
	if err := ops.Download(buf, ten); err != nil {
		p.t.Fatal(err)
	}
	return buf
}

func (p *pair) i32(ops kernels.Ops, ten kernels.Tensor) []int32 {
	p.t.Helper()
	v, err := kernels.ToI32(ops, ten)
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

// maxRelErr is max|got-want| / max|want| (NaN when got has a NaN).
func maxRelErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.NaN()
		}
		num = math.Max(num, d)
		den = math.Max(den, math.Abs(float64(want[i])))
	}
	if den == 0 {
		return num
	}
	return num / den
}

// check compares the GPU result with the CPU one: within tol, or
// bit-identical when tol is 0.
func (p *pair) check(what string, d dual, tol float64) float64 {
	p.t.Helper()
	want, got := p.f32(p.c, d.c), p.f32(p.g, d.g)
	if len(got) != len(want) {
		p.t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	if tol == 0 {
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				p.t.Errorf("%s: element %d is %v, want bit-identical %v", what, i, got[i], want[i])
				return math.Inf(1)
			}
		}
		return 0
	}
	e := maxRelErr(got, want)
	if e > tol || math.IsNaN(e) {
		p.t.Errorf("%s: max relative error %.3g > %.3g", what, e, tol)
	}
	return e
}

// pagedBatch is attention metadata for sequences of (q_len, k_len) over a
// shuffled block pool, on both backends.
type pagedBatch struct {
	cpuMeta, gpuMeta kernels.AttentionMetadata
	cu, slots        []int32 // host copies of the query offsets and the slot mapping
	numTokens        int
}

func (p *pair) pagedBatch(blockSize, numBlocks int, seqs [][2]int) pagedBatch {
	perm := p.r.Perm(numBlocks)
	cu := []int32{0}
	var seqlensK, slots []int32
	var tables [][]int32
	maxBlocks := 1
	next := 0
	for _, s := range seqs {
		q, k := s[0], s[1]
		nb := (k + blockSize - 1) / blockSize
		table := make([]int32, nb)
		for i := range table {
			table[i] = int32(perm[next])
			next++
		}
		tables = append(tables, table)
		maxBlocks = max(maxBlocks, nb)
		for j := range q {
			pos := k - q + j
			slots = append(slots, table[pos/blockSize]*int32(blockSize)+int32(pos%blockSize))
		}
		cu = append(cu, cu[len(cu)-1]+int32(q))
		seqlensK = append(seqlensK, int32(k))
	}
	flat := make([]int32, len(seqs)*maxBlocks)
	for i := range flat {
		flat[i] = -1
	}
	for s, tb := range tables {
		copy(flat[s*maxBlocks:], tb)
	}
	t := int(cu[len(cu)-1])
	cuT, skT, btT, smT := p.ints(cu, len(cu)), p.ints(seqlensK, len(seqs)), p.ints(flat, len(seqs), maxBlocks), p.ints(slots, t)
	meta := func(pick func(dual) kernels.Tensor) kernels.AttentionMetadata {
		return kernels.AttentionMetadata{NumSeqs: len(seqs), NumTokens: t, BlockSize: blockSize,
			CuSeqlensQ: pick(cuT), SeqlensK: pick(skT), BlockTables: pick(btT), SlotMapping: pick(smT)}
	}
	return pagedBatch{
		cpuMeta:   meta(func(d dual) kernels.Tensor { return d.c }),
		gpuMeta:   meta(func(d dual) kernels.Tensor { return d.g }),
		cu:        cu,
		slots:     slots,
		numTokens: t,
	}
}
