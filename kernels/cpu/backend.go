// Package cpu is the CPU backend of kernels.Ops: f32 compute, weights kept in
// their stored dtype (F32, BF16, F16, FP8 E4M3 with block scales, see
// Backend.FP8Weight, or llama.cpp's block-quantized formats, see
// Backend.QuantWeight) and converted per row tile inside the kernels, work
// spread over a persistent worker pool.
//
// Every kernel is batch-invariant by construction: each output element is
// produced by exactly one worker, from its own input row, by the same
// function in the same reduction order whatever the number of rows in the
// call or the way the rows and columns are cut into chunks. A row computed
// alone and inside a crowded batch is bit-identical.
//
// Tensors live in ordinary Go memory ([]float32 for F32, []uint16 for BF16
// and F16 bit patterns, []int32 for I32); views share it.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// littleEndian reports whether host memory is little-endian, the byte order
// of Upload and Download.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Options configure a Backend.
type Options struct {
	// Threads is the number of workers, the caller included; <= 0 means
	// runtime.NumCPU().
	Threads int
	// PureGo forces the portable Go inner loops even where vectorized ones
	// are available (for reference runs and tests).
	PureGo bool
	// SIMD names the inner loops: "" or "auto" the fastest this CPU runs,
	// or "go", "avx2", "avx512" (see simd.Pick); a name the CPU lacks
	// falls back to the fastest (callers that must refuse it check with
	// simd.Pick first). PureGo wins over it.
	SIMD string
	// KVCacheDType kernels.F16 keeps GQA models' K and V caches and MLA
	// models' latent caches in IEEE half, kernels.F8E4M3 GQA models' K and
	// V in 8-bit E4M3 (see Backend.KVCacheDType and MLACacheLayout); 0
	// (auto) keeps them in float32.
	KVCacheDType kernels.DType
	// Activations says which products round their activations as
	// llama.cpp's CPU backend does (see ActRounding); the zero value keeps
	// every activation in float32.
	Activations ActRounding
}

// ActRounding is how activations enter products with weights that are not
// float32 (Options.Activations).
type ActRounding uint8

const (
	// ActFloat32 keeps activations in float32: the exact product with the
	// stored weights, whatever their format.
	ActFloat32 ActRounding = iota
	// ActLlamaCppQuantized rounds the activations meeting GGUF
	// block-quantized weights as llama.cpp's CPU backend does: each row to
	// 8-bit blocks (Q8_0 for Q8_0/Q4_0 weights, Q8_K for K-quants),
	// multiplied with integer dot products (simd.LinearQuantLlama), the
	// arithmetic llama.cpp and vLLM's GGUF kernels use for these formats.
	// BF16, F16, F8E4M3 and MXFP4 weights keep float32 activations.
	ActLlamaCppQuantized
	// ActLlamaCpp also rounds activations meeting BF16 or F16 weights to
	// the weights' type (simd.Linear16Llama), and those meeting MXFP4
	// weights to BF16, so that greedy tokens follow llama.cpp's wherever
	// float32 activations would break its near-ties differently.
	ActLlamaCpp
	// ActBF16 rounds the activations meeting BF16 weights to bfloat16 and
	// multiplies them in pairs as AVX512_BF16's VDPBF16PS does
	// (simd.LinearBF16Pairs): twice the multiply-adds an instruction of a
	// float32 product where the CPU has it; the same bits from float32
	// FMAs on the AVX2 path and from a far slower loop on the pure-Go one. GGUF block-quantized weights are rounded as
	// under ActLlamaCppQuantized; F16, F8E4M3 and MXFP4 weights keep
	// float32 activations.
	ActBF16
)

// roundsFor reports whether activations meeting weights of type dt are
// rounded under r.
func (r ActRounding) roundsFor(dt kernels.DType) bool {
	switch dt {
	case kernels.Quant:
		return r >= ActLlamaCppQuantized
	case kernels.BF16:
		return r == ActLlamaCpp || r == ActBF16
	case kernels.F16, kernels.MXFP4:
		return r == ActLlamaCpp
	}
	return false
}

// Backend implements kernels.Ops on the host CPU. It is safe for concurrent
// use by several goroutines as long as they do not write the same tensors.
type Backend struct {
	threads int
	run     runner
	k       kernelSet
	kvCache kernels.DType // Options.KVCacheDType
	acts    ActRounding   // Options.Activations
	closed  atomic.Bool
	peak    peakOnce
	mla     mlaCache    // MLAAttention's W_UK per weight (see mlaWUK)
	gqa     sync.Pool   // *gqaScratch: Attention's buffers, reused across calls (see gqaScratchFor)
	weights weightArena // the bytes of QuantWeight's, FP8Weight's and MXFP4Weight's weights and AllocWeight's elements
	moe     sync.Pool   // *[]float32: the MoE ops' expert outputs and per-expert rows, reused across calls
}

var _ kernels.Ops = (*Backend)(nil)

// New starts a backend and its worker pool; Close stops it.
func New(opts Options) *Backend {
	n := opts.Threads
	if n <= 0 {
		n = runtime.NumCPU()
	}
	return &Backend{threads: n, run: newRunner(n), k: selectKernels(opts.PureGo, opts.SIMD), kvCache: opts.KVCacheDType,
		acts: opts.Activations}
}

var _ kernels.KVCacheDTyper = (*Backend)(nil)

// KVCacheDType is F16 or F8E4M3 when Options.KVCacheDType asks for it
// (whatever the weights), else F32, the activation type. IEEE half (half
// of float32's bytes, llama.cpp's default cache type: 10 mantissa bits,
// values beyond +-65504 become infinities) and E4M3 (a quarter: 3
// mantissa bits, saturated at +-448) are rounded to nearest even by
// WriteCache and widened exactly by Attention, so it computes what it
// computes over a float32 cache holding the rounded values.
func (b *Backend) KVCacheDType(kernels.DType) kernels.DType {
	switch b.kvCache {
	case kernels.F16, kernels.F8E4M3:
		return b.kvCache
	}
	return kernels.F32
}

// Name reports the backend, its inner-loop path and its thread count.
func (b *Backend) Name() string {
	return fmt.Sprintf("cpu(%s, %d threads)", b.k.name, b.threads)
}

// ActivationDType is F32: all CPU compute is in float32.
func (b *Backend) ActivationDType() kernels.DType { return kernels.F32 }

// Close stops the worker pool. Tensors stay readable (they are Go memory) but
// no kernel may run afterwards.
func (b *Backend) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.run.Close()
	}
	return nil
}

// Sync is a no-op: CPU kernels finish before they return.
func (b *Backend) Sync() error { return nil }

// Tensor is the CPU backend's tensor: a shape, a dtype and one of three
// backing slices. Views share the slice.
type Tensor struct {
	shape []int
	dtype kernels.DType
	f32   []float32
	u16   []uint16
	i32   []int32
	u8    []uint8    // F8E4M3
	fp8   *fp8Scales // F8E4M3 weights: their block scales (nil for caches)
	q     *quantRows // Quant weights: their blocks
	mx    *mxfp4Rows // MXFP4 weights: their blocks and scales
	// keep is the off-heap mapping the elements live in (nil for Go
	// memory): held so that the memory stays mapped while any tensor
	// viewing it is reachable. Every view copies it.
	keep *mapping
}

// Shape returns the dimensions; the caller must not modify them.
func (t *Tensor) Shape() []int { return t.shape }

// DType returns the element type.
func (t *Tensor) DType() kernels.DType { return t.dtype }

// F32 returns the backing slice of an F32 tensor (nil otherwise). It aliases
// the tensor: for tests and host-side tools of this backend only.
func (t *Tensor) F32() []float32 { return t.f32 }

// I32 returns the backing slice of an I32 tensor (nil otherwise); see F32.
func (t *Tensor) I32() []int32 { return t.i32 }

func (t *Tensor) numel() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// rowLen is the number of elements per index of dimension 0.
func (t *Tensor) rowLen() int {
	n := 1
	for _, d := range t.shape[1:] {
		n *= d
	}
	return n
}

func (t *Tensor) String() string { return fmt.Sprintf("%v%v", t.dtype, t.shape) }

// Alloc returns a zeroed tensor.
func (b *Backend) Alloc(dtype kernels.DType, shape ...int) (kernels.Tensor, error) {
	return allocTensor(nil, dtype, shape)
}

var _ kernels.WeightAllocator = (*Backend)(nil)

// AllocWeight returns a zeroed tensor for a loaded weight
// (kernels.WeightAllocator): from 64 KiB on, carved from the huge-page
// chunks of QuantWeight's blocks (weightArena), so that decode streams
// BF16, F16 and F32 matrices without a TLB miss and a prefetcher stop every
// 4 KiB (BenchmarkDecodeStep, BF16 weights, 2 cores of an AMD EPYC VM:
// 6.3 ms a step against 7.1, medians of 12 alternating runs). Cost:
// Alloc's; the arena never reuses memory (a chunk is freed once nothing
// carved from it is referenced).
func (b *Backend) AllocWeight(dtype kernels.DType, shape ...int) (kernels.Tensor, error) {
	return allocTensor(&b.weights, dtype, shape)
}

// AllocCache returns a zeroed tensor for a KV cache or state slots
// (kernels.CacheAllocator): from 64 KiB on, mapped outside Go's heap and
// advised for huge pages, so that a cache of hundreds of MB neither lets
// the collector wait for as much garbage (every byte of it on pages that
// fault in fresh) nor is scanned. Unmapped once no tensor viewing it is
// reachable. Cost: one mmap a tensor.
func (b *Backend) AllocCache(dtype kernels.DType, shape ...int) (kernels.Tensor, error) {
	return allocTensor(cacheArena{}, dtype, shape)
}

// cacheArena maps each piece it is asked for (arenaSlice asks from
// arenaMinPiece bytes on) on its own (mapOffHeap), falling back to Go
// memory.
type cacheArena struct{}

func (cacheArena) bytes(n int) ([]byte, *mapping) {
	if p, m := mapOffHeap(n); m != nil {
		return p, m
	}
	return make([]byte, n), nil
}

// byteSource hands out zeroed bytes and the mapping to keep with them.
type byteSource interface {
	bytes(n int) ([]byte, *mapping)
}

// allocTensor is Alloc with the elements from src when it is not nil
// (arenaSlice).
func allocTensor(src byteSource, dtype kernels.DType, shape []int) (kernels.Tensor, error) {
	n, err := kernels.AllocShapes("cpu", dtype, shape)
	if err != nil {
		return nil, err
	}
	t := &Tensor{shape: append([]int(nil), shape...), dtype: dtype}
	switch dtype {
	case kernels.F32:
		t.f32, t.keep = arenaSlice[float32](src, n)
	case kernels.BF16, kernels.F16:
		t.u16, t.keep = arenaSlice[uint16](src, n)
	case kernels.I32:
		t.i32, t.keep = arenaSlice[int32](src, n)
	case kernels.F8E4M3:
		t.u8, t.keep = arenaSlice[uint8](src, n)
	default:
		return nil, fmt.Errorf("cpu: alloc %v%v: %w", dtype, shape, kernels.ErrDType)
	}
	return t, nil
}

// Upload copies little-endian host bytes into dst (see kernels.Ops).
func (b *Backend) Upload(dst kernels.Tensor, src []byte, srcDType kernels.DType) error {
	d, err := asCPU("upload", "dst", dst)
	if err != nil {
		return err
	}
	n, _, err := kernels.UploadShapes("cpu", d, len(src), srcDType)
	if err != nil {
		return err
	}
	b.mla.forget(d) // a BF16/F16 MLA weight's W_UK is rebuilt from the new values
	if srcDType == kernels.F8E4M3 && d.dtype == kernels.F8E4M3 {
		copy(d.u8[:n], src)
		return nil
	}
	if srcDType == d.dtype && n > 0 && littleEndian && uintptr(unsafe.Pointer(&src[0]))%uintptr(srcDType.Size()) == 0 {
		// Same dtype, aligned little-endian bytes: one memmove.
		switch d.dtype {
		case kernels.F32:
			copy(d.f32[:n], unsafe.Slice((*float32)(unsafe.Pointer(&src[0])), n))
		case kernels.BF16, kernels.F16:
			copy(d.u16[:n], unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), n))
		case kernels.I32:
			copy(d.i32[:n], unsafe.Slice((*int32)(unsafe.Pointer(&src[0])), n))
		}
		return nil
	}
	switch {
	case d.dtype == kernels.F32 && srcDType == kernels.F32:
		for i := range n {
			d.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case d.dtype == kernels.F32 && srcDType == kernels.BF16:
		for i := range n {
			d.f32[i] = kernels.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case d.dtype == kernels.F32 && srcDType == kernels.F16:
		for i := range n {
			d.f32[i] = kernels.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case (d.dtype == kernels.BF16 || d.dtype == kernels.F16) && srcDType == d.dtype:
		for i := range n {
			d.u16[i] = binary.LittleEndian.Uint16(src[2*i:])
		}
	case d.dtype == kernels.I32 && srcDType == kernels.I32:
		for i := range n {
			d.i32[i] = int32(binary.LittleEndian.Uint32(src[4*i:]))
		}
	default:
		return fmt.Errorf("cpu: upload %v into %v: %w", srcDType, d, kernels.ErrDType)
	}
	return nil
}

// Download copies src to host bytes of its own dtype.
func (b *Backend) Download(dst []byte, src kernels.Tensor) error {
	s, err := asCPU("download", "src", src)
	if err != nil {
		return err
	}
	if _, err := kernels.DownloadShapes("cpu", len(dst), s); err != nil {
		return err
	}
	n := s.numel()
	if s.dtype == kernels.F8E4M3 {
		copy(dst, s.u8[:n])
		return nil
	}
	if littleEndian && n > 0 {
		// The host layout is the wire layout: one memmove.
		var raw unsafe.Pointer
		switch s.dtype {
		case kernels.F32:
			raw = unsafe.Pointer(&s.f32[0])
		case kernels.BF16, kernels.F16:
			raw = unsafe.Pointer(&s.u16[0])
		case kernels.I32:
			raw = unsafe.Pointer(&s.i32[0])
		}
		if raw != nil {
			copy(dst, unsafe.Slice((*byte)(raw), len(dst)))
			return nil
		}
	}
	switch s.dtype {
	case kernels.F32:
		for i, x := range s.f32[:n] {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
		}
	case kernels.BF16, kernels.F16:
		for i, x := range s.u16[:n] {
			binary.LittleEndian.PutUint16(dst[2*i:], x)
		}
	case kernels.I32:
		for i, x := range s.i32[:n] {
			binary.LittleEndian.PutUint32(dst[4*i:], uint32(x))
		}
	}
	return nil
}

// Rows returns the view of rows [lo, hi) of dimension 0.
func (b *Backend) Rows(t kernels.Tensor, lo, hi int) (kernels.Tensor, error) {
	s, err := asCPU("rows", "t", t)
	if err != nil {
		return nil, err
	}
	if err := kernels.RowsShapes("cpu", s, lo, hi); err != nil {
		return nil, err
	}
	r := s.rowLen()
	if s.q != nil {
		k := max(s.shape[len(s.shape)-1], 1)
		return s.qRows(lo*r/k, hi*r/k, append([]int{hi - lo}, s.shape[1:]...)), nil
	}
	if s.fp8 != nil {
		k := s.shape[len(s.shape)-1]
		if k == 0 {
			k = 1
		}
		return s.f8Rows(lo*r/k, hi*r/k, k, append([]int{hi - lo}, s.shape[1:]...)), nil
	}
	if s.mx != nil {
		k := s.shape[len(s.shape)-1]
		return s.mxRows(lo*r/k, hi*r/k, append([]int{hi - lo}, s.shape[1:]...)), nil
	}
	v := &Tensor{shape: append([]int{hi - lo}, s.shape[1:]...), dtype: s.dtype, keep: s.keep}
	switch s.dtype {
	case kernels.F32:
		v.f32 = s.f32[lo*r : hi*r : hi*r]
	case kernels.BF16, kernels.F16:
		v.u16 = s.u16[lo*r : hi*r : hi*r]
	case kernels.I32:
		v.i32 = s.i32[lo*r : hi*r : hi*r]
	case kernels.F8E4M3:
		v.u8 = s.u8[lo*r : hi*r : hi*r]
	}
	return v, nil
}

// Reshape returns a view with a new shape and the same number of elements.
func (b *Backend) Reshape(t kernels.Tensor, shape ...int) (kernels.Tensor, error) {
	s, err := asCPU("reshape", "t", t)
	if err != nil {
		return nil, err
	}
	if err := kernels.ReshapeShapes("cpu", s, shape); err != nil {
		return nil, err
	}
	if (s.fp8 != nil || s.q != nil || s.mx != nil) && (len(shape) == 0 || shape[len(shape)-1] != s.shape[len(s.shape)-1]) {
		return nil, fmt.Errorf("cpu: reshape: %v weight %v to %v changes its rows (last dimension): %w", s.dtype, s, shape, kernels.ErrShape)
	}
	v := *s
	v.shape = append([]int(nil), shape...)
	return &v, nil
}

// asCPU checks that t is a non-nil tensor of this backend.
func asCPU(op, name string, t kernels.Tensor) (*Tensor, error) {
	return kernels.As[*Tensor]("cpu", op, name, t)
}

// optCPU is asCPU for optional arguments: nil stays nil.
func optCPU(op, name string, t kernels.Tensor) (*Tensor, error) {
	return kernels.Opt[*Tensor]("cpu", op, name, t)
}

func (b *Backend) checkOpen(op string) error {
	if b.closed.Load() {
		return fmt.Errorf("cpu: %s: %w", op, kernels.ErrClosed)
	}
	return nil
}

// rowF32 returns row i of a float tensor of row length n as float32: F32 rows
// alias the tensor, BF16 and F16 rows are converted into buf (len >= n).
func (b *Backend) rowF32(t *Tensor, i, n int, buf []float32) []float32 {
	switch t.dtype {
	case kernels.F32:
		return t.f32[i*n : (i+1)*n]
	case kernels.BF16:
		b.k.bf16ToF32(buf[:n], t.u16[i*n:(i+1)*n])
	case kernels.F16:
		b.k.f16ToF32(buf[:n], t.u16[i*n:(i+1)*n])
	case kernels.F8E4M3:
		// Row i of n elements: matrix row i when n is the last dimension
		// (Embedding, MLAAttention's W_UK).
		t.f8Weights().RowF32(buf[:n], i, n)
	case kernels.Quant:
		// Matrix row i (n is the last dimension), dequantized.
		return t.quantRowF32(buf, i)
	}
	return buf[:n]
}
