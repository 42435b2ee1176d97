package cuda

/*
#include "api.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var (
	_ kernels.FP8Weighter  = (*Backend)(nil)
	_ kernels.ScaledWeight = (*Tensor)(nil)
)

// fp8Path picks the kernels of an FP8 linear or MoE (enum di_fp8_path):
// the library's choice, or one path forced (tests and benchmarks).
type fp8Path int

const (
	fp8Auto fp8Path = C.DI_FP8_AUTO
	fp8GEMV fp8Path = C.DI_FP8_GEMV
	fp8GEMM fp8Path = C.DI_FP8_GEMM
	fp8LT   fp8Path = C.DI_FP8_LT
)

// fp8Scales are the block scales of an FP8 weight tensor on the device
// (kernels.FP8Weight's Scales and ScaleRow); views share the buffers and
// start at their own first matrix row.
type fp8Scales struct {
	scales, scaleRow *buffer
	rowOff           int // the view's first matrix row: its entry of scaleRow
	scaleCols        int // ceil(k / blockK)
	blockK           int
	deq              *fp8DeqCache // float32 copies for MLAAttention, shared by the weight's views
	// lt holds the scales in cuBLASLt's 128x128 block layout (ltScales),
	// nil where the weight has none; ltLD is its row length.
	lt   *buffer
	ltLD int
}

// view is f for a view starting rowOff matrix rows further (nil stays nil).
func (f *fp8Scales) view(rowOff int) *fp8Scales {
	if f == nil {
		return nil
	}
	v := *f
	v.rowOff += rowOff
	return &v
}

// HasWeightScales reports whether t is an FP8 weight built by FP8Weight.
func (t *Tensor) HasWeightScales() bool { return t != nil && t.fp8 != nil }

// fp8Arg is the ABI's description of an FP8 weight tensor.
// A view whose first row starts a 128-row block keeps the cuBLASLt scales.
func (t *Tensor) fp8Arg() C.di_fp8_weight {
	a := C.di_fp8_weight{
		data:       t.ptr(),
		scales:     C.di_dptr(t.fp8.scales.ptr),
		scale_row:  C.di_dptr(t.fp8.scaleRow.ptr + 4*uint64(t.fp8.rowOff)),
		scale_cols: C.int(t.fp8.scaleCols),
		block_k:    C.int(t.fp8.blockK),
	}
	if f := t.fp8; f.lt != nil && f.rowOff%ltBlock == 0 {
		a.lt_scales = C.di_dptr(f.lt.ptr + 4*uint64(f.rowOff/ltBlock*f.ltLD))
		a.lt_ld = C.int(f.ltLD)
	}
	return a
}

// ltBlock is the rows and columns of one cuBLASLt weight scale.
const ltBlock = 128

// ltScales lays w's scales out as cuBLASLt's 128x128 block scales: row rb
// of ceil(rows / 128) holds block (rb, kb) at kb, padded to ld =
// ceil(k / 128) rounded up to 4 columns. ok is false where w has no such
// layout: block_k other than 128, or stacked experts (3-D), or rows of one
// 128-row block on different scale rows.
func ltScales(w kernels.FP8Weight, scaleCols int) (lt []float32, ld int, ok bool) {
	if w.BlockK != ltBlock || len(w.Shape) != 2 {
		return nil, 0, false
	}
	rows := len(w.ScaleRow)
	for r, s := range w.ScaleRow {
		if s != w.ScaleRow[r-r%ltBlock] {
			return nil, 0, false
		}
	}
	ld = (scaleCols + 3) &^ 3
	blocks := (rows + ltBlock - 1) / ltBlock
	lt = make([]float32, blocks*ld)
	for rb := range blocks {
		src := int(w.ScaleRow[rb*ltBlock]) * scaleCols
		copy(lt[rb*ld:rb*ld+scaleCols], w.Scales[src:src+scaleCols])
	}
	return lt, ld, true
}

// FP8Weight implements kernels.FP8Weighter: the E4M3 bytes, the float32
// scales and the scale rows are copied to the device as they are (one byte
// a weight; Linear and MoE widen them in their kernels, see fp8.cu). The
// last dimension k must be a multiple of 16 (16-byte loads; every published
// FP8 checkpoint has k a multiple of 128), else the error wraps
// ErrUnsupported. Linear, MoE and MLAAttention take the result; Embedding
// and Logits refuse it (ErrUnsupported: models keep those as stored). Cost:
// three uploads and one pass over the bytes on the host to check them.
func (b *Backend) FP8Weight(w kernels.FP8Weight) (kernels.Tensor, error) {
	const op = "fp8_weight"
	scaleCols, err := checkFP8Weight(w)
	if err != nil {
		return nil, err
	}
	data, err := b.uploadBuffer(op, w.Data)
	if err != nil {
		return nil, err
	}
	scales, err := b.uploadBuffer(op, kernels.F32Bytes(w.Scales))
	if err != nil {
		return nil, err
	}
	scaleRow, err := b.uploadBuffer(op, kernels.I32Bytes(w.ScaleRow))
	if err != nil {
		return nil, err
	}
	f := &fp8Scales{scales: scales, scaleRow: scaleRow, scaleCols: scaleCols, blockK: w.BlockK, deq: &fp8DeqCache{}}
	if lt, ld, ok := ltScales(w, scaleCols); ok {
		if f.lt, err = b.uploadBuffer(op, kernels.F32Bytes(lt)); err != nil {
			return nil, err
		}
		f.ltLD = ld
	}
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.F8E4M3, buf: data, fp8: f}, nil
}

// checkFP8Weight checks w against kernels.FP8Weight's contract and this
// backend's limit (k a multiple of 16) and returns its scales' row length.
func checkFP8Weight(w kernels.FP8Weight) (scaleCols int, err error) {
	const op = "fp8_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return 0, fmt.Errorf("cuda: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n, err := kernels.AllocShapes("cuda", kernels.F8E4M3, w.Shape)
	if err != nil {
		return 0, err
	}
	k := w.Shape[len(w.Shape)-1]
	rows := 0
	if k > 0 {
		rows = n / k
	}
	if len(w.Data) != n || len(w.ScaleRow) != rows {
		return 0, fmt.Errorf("cuda: %s: %d bytes and %d scale rows for shape %v: %w", op, len(w.Data), len(w.ScaleRow), w.Shape, kernels.ErrShape)
	}
	if w.BlockK < 16 || w.BlockK&(w.BlockK-1) != 0 {
		return 0, fmt.Errorf("cuda: %s: block of %d columns, want a power of two >= 16: %w", op, w.BlockK, kernels.ErrShape)
	}
	if k%16 != 0 {
		return 0, fmt.Errorf("cuda: %s: last dimension %d is not a multiple of 16: %w", op, k, ErrUnsupported)
	}
	scaleCols = max(1, (k+w.BlockK-1)/w.BlockK)
	if len(w.Scales)%scaleCols != 0 || (rows > 0 && len(w.Scales) == 0) {
		return 0, fmt.Errorf("cuda: %s: %d scales, not rows of %d: %w", op, len(w.Scales), scaleCols, kernels.ErrShape)
	}
	scaleRows := len(w.Scales) / scaleCols
	for i, r := range w.ScaleRow {
		if r < 0 || int(r) >= scaleRows {
			return 0, fmt.Errorf("cuda: %s: row %d takes scale row %d of %d: %w", op, i, r, scaleRows, kernels.ErrShape)
		}
	}
	for i, s := range w.Scales {
		if !(math.Abs(float64(s)) < 0x1p100) {
			return 0, fmt.Errorf("cuda: %s: scale %d is %v, want finite and below 2^100: %w", op, i, s, kernels.ErrShape)
		}
	}
	if i := fp8NaN(w.Data); i >= 0 {
		return 0, fmt.Errorf("cuda: %s: byte %d is an E4M3 NaN (%#02x): %w", op, i, w.Data[i], kernels.ErrDType)
	}
	return scaleCols, nil
}

// fp8NaN returns the index of the first E4M3 NaN (0x7f or 0xff) in data,
// or -1. Eight bytes at a time: with x = word & 0x7f7f..., a byte of x + 0x0101...
// reaches 0x80 exactly where it was 0x7f, and never carries into the next
// byte. Cost: about a nanosecond per 8 bytes (a DeepSeek-V3 checkpoint's
// 671 GB is minutes with a byte loop).
func fp8NaN(data []byte) int {
	const low7, ones, highs = 0x7f7f7f7f7f7f7f7f, 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(data); i += 8 {
		if ((binary.LittleEndian.Uint64(data[i:])&low7)+ones)&highs != 0 {
			break
		}
	}
	for ; i < len(data); i++ {
		if data[i]&0x7f == 0x7f {
			return i
		}
	}
	return -1
}

// uploadBuffer copies src into a new device buffer (at least one byte),
// returned to the allocator's cache when it becomes unreachable.
func (b *Backend) uploadBuffer(op string, src []byte) (*buffer, error) {
	bytes := uint64(max(len(src), 1))
	ptr, err := b.allocBytes(bytes, true)
	if err != nil {
		return nil, fmt.Errorf("cuda: %s: %d bytes: %w", op, bytes, err)
	}
	buf := &buffer{ptr: ptr, bytes: bytes}
	runtime.AddCleanup(buf, b.release, ptr)
	if len(src) == 0 {
		return buf, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen(op); err != nil {
		return nil, err
	}
	return buf, b.status(op, C.c_upload(b.lib.api, b.ctx, C.di_dptr(ptr), unsafe.Pointer(&src[0]), C.uint64_t(len(src))))
}

// fp8Linear is Linear over an FP8 weight (float32 x): fp8.cu's GEMV up to
// 8 rows; above, activations quantized per row and 128 columns into
// cuBLASLt's block-scaled FP8 GEMM where the weight (view) has 128x128 block
// scales, else into fp8.cu's tensor-core GEMM; unless path forces one.
func (b *Backend) fp8Linear(name string, o, xs, ws, bs *Tensor, m, n, k int, path fp8Path) error {
	if xs.dtype != kernels.F32 {
		return fmt.Errorf("cuda: linear: x of dtype %s with FP8 weights: want F32: %w", xs.dtype, kernels.ErrDType)
	}
	wa := ws.fp8Arg()
	return b.launch(name, func() C.int {
		return C.c_fp8_linear(b.lib.api, b.ctx, o.ptr(), xs.ptr(), &wa, optPtr(bs), C.int(m), C.int(n), C.int(k), C.int(path))
	}, o, xs, ws, bs)
}

// fp8LTPeak times cuBLASLt's FP8 GEMM with one scale a tensor (its fastest
// FP8 form) at m x n x k, iters launches: the benchmarks' reference peak,
// in milliseconds a launch. Not during a capture.
func (b *Backend) fp8LTPeak(m, n, k, iters int) (float64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpen("fp8_lt_peak"); err != nil {
		return 0, err
	}
	var ms C.float
	if err := b.status("fp8_lt_peak", C.c_fp8_lt_peak(b.lib.api, b.ctx, C.int(m), C.int(n), C.int(k), C.int(iters), &ms)); err != nil {
		return 0, err
	}
	return float64(ms), nil
}

// linearFP8Path is Linear over an FP8 weight with the path forced (tests
// and benchmarks compare the GEMV and the GEMM on the same rows).
func (b *Backend) linearFP8Path(out, x, w, bias kernels.Tensor, path fp8Path) error {
	const op = "linear"
	o, xs, ws, bs, m, n, k, err := linearArgs(out, x, w, bias, kernels.F32)
	if err != nil {
		return err
	}
	if ws.fp8 == nil {
		return fmt.Errorf("cuda: linear: weight of dtype %s is not an FP8 weight: %w", ws.dtype, kernels.ErrDType)
	}
	return b.fp8Linear(op, o, xs, ws, bs, m, n, k, path)
}

// fp8MoE is MoE over FP8 expert weights (both projections FP8): see
// di_api.fp8_moe.
func (b *Backend) fp8MoE(o, xs, is, ws, gu, dn, add *Tensor, d kernels.MoEDims, path fp8Path) error {
	if gu.fp8 == nil || dn.fp8 == nil {
		return fmt.Errorf("cuda: moe: gate_up %s and down %s: both or neither FP8: %w", gu.dtype, dn.dtype, ErrUnsupported)
	}
	ga, da := gu.fp8Arg(), dn.fp8Arg()
	return b.launch("moe", b.moeAdding(o, add, func() C.int {
		return C.c_fp8_moe(b.lib.api, b.ctx, o.ptr(), xs.ptr(), is.ptr(), ws.ptr(), &ga, &da, C.int(d.T), C.int(d.TopK),
			C.int(d.Hidden), C.int(d.Inter), C.int(d.NumExperts), C.int(path))
	}), o, xs, is, ws, gu, dn, add)
}

// moeFP8Path is MoE over FP8 experts with the path forced (tests).
func (b *Backend) moeFP8Path(out, x, ids, weights, gateUp, down kernels.Tensor, path fp8Path) error {
	const op = "moe"
	var ts [6]*Tensor
	if err := asCUDAs(op, ts[:], tensorArg{"out", out}, tensorArg{"x", x}, tensorArg{"ids", ids}, tensorArg{"weights", weights},
		tensorArg{"gate_up", gateUp}, tensorArg{"down", down}); err != nil {
		return err
	}
	d, err := kernels.MoEShapes("cuda", ts[0], ts[1], ts[2], ts[3], ts[4], ts[5])
	if err != nil {
		return err
	}
	return b.fp8MoE(ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], nil, d, path)
}

// fp8Dequant returns w's values as a new tensor of w's shape and dtype dt:
// F32 (exact) or BF16 (rounded to nearest even). Cost: 4 or 2 bytes a
// weight written and the allocation.
func (b *Backend) fp8Dequant(w *Tensor, dt kernels.DType) (*Tensor, error) {
	out, _, err := b.fp8DequantProbe(w, dt, false)
	return out, err
}

// fp8DequantProbe is fp8Dequant; with probe set it also reports whether the
// values were written eagerly (eager false: a graph is being captured, so
// they are written at the graph's replays into the graphs' memory pool,
// and the tensor must not outlive the call). The probe is an upload of 4
// zero bytes to the new tensor, ahead of the dequantization that
// overwrites them: the library refuses uploads during a capture
// (ErrCapturing) before touching the stream.
func (b *Backend) fp8DequantProbe(w *Tensor, dt kernels.DType, probe bool) (out *Tensor, eager bool, err error) {
	d, err := b.Alloc(dt, w.shape...)
	if err != nil {
		return nil, false, err
	}
	out = d.(*Tensor)
	k := w.shape[len(w.shape)-1]
	rows := 0
	if k > 0 {
		rows = w.numel() / k
	}
	if probe && rows > 0 {
		var zero [4]byte
		b.mu.Lock()
		err = b.checkOpen("fp8_dequant")
		if err == nil {
			err = b.status("fp8_dequant", C.c_upload(b.lib.api, b.ctx, out.ptr(), unsafe.Pointer(&zero[0]), 4))
		}
		b.mu.Unlock()
		runtime.KeepAlive(out)
		eager = err == nil
		if errors.Is(err, ErrCapturing) {
			err = nil
		}
		if err != nil {
			return nil, false, err
		}
	}
	wa := w.fp8Arg()
	return out, eager, b.launch("fp8_dequant", func() C.int {
		return C.c_fp8_dequant(b.lib.api, b.ctx, out.ptr(), C.int(dt), &wa, C.int(rows), C.int(k))
	}, out, w)
}

// fp8DeqCache holds the dequantized values of an FP8 weight's views that
// MLAAttention has read (fp8Dequantized), one entry per view (its offset,
// first scale row and size) and dtype; the weight's fp8Scales and every
// view of it share one cache, which goes away with them.
type fp8DeqCache struct {
	mu sync.Mutex
	m  map[fp8DeqKey]*Tensor
}

type fp8DeqKey struct {
	off           uint64 // the view's byte offset in the weight's buffer
	rowOff        int    // its first scale row
	rows, k, cols int
	dt            kernels.DType
}

// fp8Dequantized returns fp8Dequant(w, dt), computed once per view of an
// FP8 weight and dtype and kept with the weight: MLAAttention's kernels
// read wkv_b in float32 (CUDA-core absorption, float32 caches) or BF16
// (tensor-core absorption, 16- and 8-bit caches), and dequantizing it at
// every call cost a kernel and a 4-byte write per weight each time (13.8 us
// a call, 27 calls a DeepSeek-V2-Lite step). The values are fp8Dequant's, so cached and uncached calls give the
// same bits. The cache relies on FP8 weights not being written after
// FP8Weight (no operation of this backend writes one; an Upload over one
// would leave the copy stale). A call while a graph is being captured
// dequantizes into the graph as before and caches nothing (the copy would
// hold its values only after the graph's replays); the first eager call
// fills the cache. Memory: 4 bytes a weight of each cached view, held until
// the weight and its views are unreachable or the backend is closed
// (float32: DeepSeek-V2-Lite's kv_b, 4096 x 512: 8 MiB a layer, 216 MiB for
// 27 layers; DeepSeek-V3's, 32768 x 512: 64 MiB a layer, 3.8 GiB for 61
// layers, four times the FP8 bytes; BF16 half that). Safe for concurrent calls: the cache's mutex
// is held while an entry is built.
func (b *Backend) fp8Dequantized(w *Tensor, dt kernels.DType) (*Tensor, error) {
	c := w.fp8.deq
	k := w.shape[len(w.shape)-1]
	if c == nil || k == 0 {
		return b.fp8Dequant(w, dt)
	}
	key := fp8DeqKey{off: w.off, rowOff: w.fp8.rowOff, rows: w.numel() / k, k: k, cols: w.fp8.scaleCols, dt: dt}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.m[key]; d != nil {
		return &Tensor{shape: append([]int(nil), w.shape...), dtype: d.dtype, buf: d.buf, off: d.off}, nil
	}
	d, eager, err := b.fp8DequantProbe(w, dt, true)
	if err != nil || !eager {
		return d, err
	}
	if c.m == nil {
		c.m = make(map[fp8DeqKey]*Tensor)
	}
	c.m[key] = d
	return d, nil
}

// fp8Refuse is the error of operations that take no FP8 weights.
func fp8Refuse(op, name string, t *Tensor) error {
	if t == nil || t.fp8 == nil {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s is an FP8 weight, which this backend's %s does not take (keep it as stored): %w", op, name, op, ErrUnsupported)
}
