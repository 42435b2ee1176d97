package cuda

/*
#include "api.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels"
)

var (
	_ kernels.MXFP4Weighter = (*Backend)(nil)
	_ kernels.MXFP4Blocker  = (*Tensor)(nil)
)

// mxfp4Scales are the E8M0 scales of an MXFP4 weight tensor on the device
// (kernels.MXFP4Weight's Scales, k/32 bytes a matrix row of k columns);
// the tensor's buf and off hold its codes (k/2 bytes a row, each row's in
// the device layout of mxfp4.cuh). Views share both buffers and start at
// their own first matrix row.
type mxfp4Scales struct {
	scales *buffer
	off    uint64 // the view's first scale byte
}

// HasMXFP4 reports whether t is an MXFP4 weight built by MXFP4Weight.
func (t *Tensor) HasMXFP4() bool { return t != nil && t.mx != nil }

// MXFP4Weight implements kernels.MXFP4Weighter: the codes and the scales
// are copied to the device (4.25 bits a weight; the codes of each row
// rearranged into the layout the kernels read, mxfp4.cuh), and
// MoEClampedSwiGLU widens them to BF16 in its kernels' registers, giving
// the bits of the same call with the weights widened to BF16 at load. No
// other operation takes the result: they refuse its dtype (ErrDType), as
// the CPU backend's do. Rows keeps a view an MXFP4 weight of those rows;
// Reshape may not change the rows' length. The error wraps ErrShape for a
// shape, code or scale count that does not match, ErrDType for a scale of
// 255. Cost: two uploads, one pass over the scales and one over the codes
// on the host (the latter on every core, in chunks of mxfp4UploadChunk
// bytes).
func (b *Backend) MXFP4Weight(w kernels.MXFP4Weight) (kernels.Tensor, error) {
	const op = "mxfp4_weight"
	if err := checkMXFP4Weight(w); err != nil {
		return nil, err
	}
	blocks, err := b.uploadMXFP4Codes(op, w.Blocks, w.Shape[len(w.Shape)-1])
	if err != nil {
		return nil, err
	}
	scales, err := b.uploadBuffer(op, w.Scales)
	if err != nil {
		return nil, err
	}
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.MXFP4, buf: blocks, mx: &mxfp4Scales{scales: scales}}, nil
}

// checkMXFP4Weight checks w against kernels.MXFP4Weight's contract, with
// the CPU backend's errors: [n, k] or [experts, n, k], k a positive
// multiple of 32, NumElements/2 code bytes and NumElements/32 scales, no
// scale of 255.
func checkMXFP4Weight(w kernels.MXFP4Weight) error {
	const op = "mxfp4_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return fmt.Errorf("cuda: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n := 1
	for _, d := range w.Shape {
		if d < 0 {
			return fmt.Errorf("cuda: %s: shape %v: %w", op, w.Shape, kernels.ErrShape)
		}
		n *= d
	}
	k := w.Shape[len(w.Shape)-1]
	if k <= 0 || k%kernels.MXFP4BlockSize != 0 {
		return fmt.Errorf("cuda: %s: shape %v: last dimension not a positive multiple of %d: %w", op, w.Shape, kernels.MXFP4BlockSize, kernels.ErrShape)
	}
	if len(w.Blocks) != n/2 || len(w.Scales) != n/kernels.MXFP4BlockSize {
		return fmt.Errorf("cuda: %s: %d block bytes and %d scales for shape %v, want %d and %d: %w",
			op, len(w.Blocks), len(w.Scales), w.Shape, n/2, n/kernels.MXFP4BlockSize, kernels.ErrShape)
	}
	for i, s := range w.Scales {
		if s == 0xff {
			return fmt.Errorf("cuda: %s: scale %d is the E8M0 NaN (0xff): %w", op, i, kernels.ErrDType)
		}
	}
	return nil
}

// mxfp4UploadChunk bounds the host bytes MXFP4Weight rearranges at a time.
const mxfp4UploadChunk = 16 << 20

// uploadMXFP4Codes allocates device memory for codes (rows of k/2 bytes, as
// kernels.MXFP4Weight holds them) and uploads them in the device layout,
// chunk by chunk.
func (b *Backend) uploadMXFP4Codes(op string, codes []byte, k int) (*buffer, error) {
	bytes := uint64(max(len(codes), 1))
	ptr, err := b.allocBytes(bytes, true)
	if err != nil {
		return nil, fmt.Errorf("cuda: %s: %d bytes: %w", op, bytes, err)
	}
	buf := &buffer{ptr: ptr, bytes: bytes}
	runtime.AddCleanup(buf, b.release, ptr)
	rowBytes := k / 2
	chunk := max(1, mxfp4UploadChunk/rowBytes) * rowBytes
	tmp := make([]byte, min(len(codes), chunk))
	for off := 0; off < len(codes); off += chunk {
		n := min(len(codes)-off, chunk)
		mxfp4DeviceRows(tmp[:n], codes[off:off+n], rowBytes)
		b.mu.Lock()
		err := b.checkOpen(op)
		if err == nil {
			err = b.status(op, C.c_upload(b.lib.api, b.ctx, C.di_dptr(ptr+uint64(off)), unsafe.Pointer(&tmp[0]), C.uint64_t(n)))
		}
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// mxfp4DeviceRows writes the rows of src (rowBytes = k/2 bytes each, as
// kernels.MXFP4Weight holds them) in the device layout (mxfp4.cuh) to dst,
// the rows shared out among GOMAXPROCS goroutines.
func mxfp4DeviceRows(dst, src []byte, rowBytes int) {
	rows := len(src) / rowBytes
	workers := min(runtime.GOMAXPROCS(0), max(1, rows/64))
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := rows*w/workers, rows*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := lo; r < hi; r++ {
				mxfp4DeviceRow(dst[r*rowBytes:(r+1)*rowBytes], src[r*rowBytes:(r+1)*rowBytes])
			}
		}()
	}
	wg.Wait()
}

// mxfp4DevicePlace is where block b (of nb in the row) and word q (columns
// 8q .. 8q + 7 of the block) lie in a row of the device layout: in a full
// segment of 16 blocks, byte 64 (lb % 4) + 16 q + 4 pi(lb / 4) of it (lb
// the block within the segment, pi = 0, 2, 1, 3), in the tail (the last nb
// % 16 blocks), 16 lb + 4 q.
func mxfp4DevicePlace(b, q, nb int) int {
	nfull := nb / 16
	if seg := b / 16; seg < nfull {
		lb := b % 16
		return 256*seg + 64*(lb%4) + 16*q + 4*[4]int{0, 2, 1, 3}[lb/4]
	}
	return 256*nfull + 16*(b-16*nfull) + 4*q
}

// mxfp4DeviceRow writes one row (k/2 bytes) in the device layout: each
// 4-byte word of 8 codes at mxfp4DevicePlace, its bits rearranged by
// mxfp4WordBits.
func mxfp4DeviceRow(dst, src []byte) {
	nb := len(src) / 16
	t := &mxfp4WordBits
	for b := range nb {
		for q := range 4 {
			s := src[16*b+4*q : 16*b+4*q+4]
			binary.LittleEndian.PutUint32(dst[mxfp4DevicePlace(b, q, nb):], t[0][s[0]]|t[1][s[1]]|t[2][s[2]]|t[3][s[3]])
		}
	}
}

// mxfp4DeviceBit[i] is the bit of a device word (mxfp4.cuh) that holds bit
// i of a word of 8 codes as stored (code e in bits 4e .. 4e + 3: magnitude
// bits m, e0, e1 and the sign): the kernels' pair e / 2 is a right rotation
// of the word by 0, 4, 10 or 14 bits (6 for the e1 bits of pair 3) masked
// to the sign at bit 15 and the magnitude bits at 6, 7, 8 of each half
// (element e in half e % 2).
var mxfp4DeviceBit = func() (d [32]int) {
	for i := range d {
		e, bit := i/4, i%4
		p := 16*(e%2) + 6 + bit // magnitude bits m, e0, e1 at 6, 7, 8
		if bit == 3 {
			p = 16*(e%2) + 15 // the sign
		}
		r := [4]int{0, 4, 10, 14}[e/2]
		if e/2 == 3 && bit == 2 {
			r = 6
		}
		d[i] = (p + r) % 32
	}
	return d
}()

// mxfp4WordBits[j][v] is the device word's share of byte j (of 4) of a
// stored word when that byte is v (mxfp4DeviceBit).
var mxfp4WordBits = func() (t [4][256]uint32) {
	for j := range t {
		for v := range t[j] {
			for bit := range 8 {
				if v>>bit&1 == 1 {
					t[j][v] |= 1 << mxfp4DeviceBit[8*j+bit]
				}
			}
		}
	}
	return t
}()

// mxRows is the view of t's matrix rows from row lo on, shaped shape: its
// codes k/2 bytes and its scales k/32 bytes a row further.
func (t *Tensor) mxRows(lo int, shape []int) *Tensor {
	k := uint64(t.shape[len(t.shape)-1])
	return &Tensor{shape: shape, dtype: kernels.MXFP4, buf: t.buf, off: t.off + uint64(lo)*k/2,
		mx: &mxfp4Scales{scales: t.mx.scales, off: t.mx.off + uint64(lo)*k/kernels.MXFP4BlockSize}}
}

// mxScales is the device address of t's first scale.
func (t *Tensor) mxScales() C.di_dptr { return C.di_dptr(t.mx.scales.ptr + t.mx.off) }

// moeClampedSwiGLUMXFP4 is MoEClampedSwiGLU over MXFP4 experts (both
// checked by kernels.MXFP4MoEShapes): di_api.moe_clamped_swiglu_mxfp4.
func (b *Backend) moeClampedSwiGLUMXFP4(o, xs, is, ws, gu, gub, dn, dnb *Tensor, d kernels.MoEDims, p kernels.ClampedSwiGLU) error {
	const op = "moe_clamped_swiglu"
	return b.launch(op, func() C.int {
		return C.c_moe_clamped_swiglu_mxfp4(b.lib.api, b.ctx, o.ptr(), xs.ptr(), is.ptr(), ws.ptr(), gu.ptr(), gu.mxScales(), gub.ptr(),
			dn.ptr(), dn.mxScales(), dnb.ptr(), C.int(d.T), C.int(d.TopK), C.int(d.Hidden), C.int(d.Inter), C.int(d.NumExperts),
			C.float(p.Limit), C.float(p.Alpha))
	}, o, xs, is, ws, gu, gub, dn, dnb)
}
