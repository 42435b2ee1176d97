package kernels

import (
	"fmt"
	"math"
)

// MXFP4 expert weights, the format gpt-oss's official checkpoints ship
// (OCP microscaling FP4: 4-bit E2M1 values in blocks of 32 that share one
// E8M0 power-of-two scale). A backend that computes with them implements
// MXFP4Weighter, and the tensors it returns (dtype MXFP4) are accepted as
// expert weights by BiasedMoEer.MoEClampedSwiGLU, checked by
// MXFP4MoEShapes; no other operation takes them. Models check for
// MXFP4Weighter and widen the weights to BF16 (which holds every MXFP4
// value exactly, see MXFP4ToF32) for backends without it.

// MXFP4BlockSize is the number of elements that share one scale.
const MXFP4BlockSize = 32

// MXFP4Weight is an MXFP4 weight in host memory: the matrix [rows, k] that
// Shape flattens to (k its last dimension, a multiple of MXFP4BlockSize).
// Row r holds k/2 bytes Blocks[r*k/2:(r+1)*k/2] and k/32 scales
// Scales[r*k/32:(r+1)*k/32]; element c of the row is
//
//	MXFP4ToF32(code, Scales[r*k/32 + c/32])
//
// with code the low nibble of Blocks[r*k/2 + c/2] for even c and its high
// nibble for odd c: the bytes of a checkpoint's *_blocks [.., rows, k/32,
// 16] and *_scales [.., rows, k/32] tensors as they are stored. The scale
// 255 (NaN in the OCP format) is not a valid weight.
type MXFP4Weight struct {
	Shape  []int  // [n, k] or [experts, n, k]
	Blocks []byte // NumElements(Shape)/2 bytes
	Scales []byte // NumElements(Shape)/32 E8M0 exponents
}

// MXFP4Weighter is implemented by backends that compute with MXFP4 expert
// weights: they keep the blocks as stored (4.25 bits a weight) and widen
// them in the expert kernels' inner loops.
type MXFP4Weighter interface {
	// MXFP4Weight copies w into backend memory and returns a weight tensor
	// of dtype MXFP4 and shape w.Shape, or an error wrapping ErrShape (a
	// shape, block or scale count that does not match) or ErrDType (a
	// scale of 255). Cost: one copy of Blocks and Scales and one pass over
	// Scales to check them.
	MXFP4Weight(w MXFP4Weight) (Tensor, error)
}

// MXFP4Blocker is implemented by tensor types that can hold an
// MXFP4Weight; HasMXFP4 reports whether this one does.
type MXFP4Blocker interface {
	HasMXFP4() bool
}

// mxfp4Values are the E2M1 values of the 16 codes (bit 3 the sign; code
// 8 is -0, which a constant cannot spell).
var mxfp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// MXFP4ToF32 is the value of the 4-bit code (low nibble of code) under the
// E8M0 scale: E2M1(code) * 2^(scale-127), rounded to float32 (exact for
// scale <= 252; larger scales overflow the biggest codes to infinities).
// BF16 holds the result exactly: F32ToBF16 of it is the widening models
// apply for backends without MXFP4Weighter.
func MXFP4ToF32(code, scale byte) float32 {
	return float32(math.Ldexp(float64(mxfp4Values[code&0x0f]), int(scale)-127))
}

// isMXFP4 reports whether t holds MXFP4 blocks.
func isMXFP4(t Tensor) bool {
	m, ok := t.(MXFP4Blocker)
	return ok && present(t) && m.HasMXFP4()
}

// shapeOnly stands for an MXFP4 weight in MoEShapes' checks: its shape,
// with BF16, the dtype it widens to.
type shapeOnly struct{ shape []int }

func (s shapeOnly) Shape() []int   { return s.shape }
func (s shapeOnly) DType() DType   { return BF16 }
func (s shapeOnly) String() string { return fmt.Sprintf("MXFP4%v", s.shape) }

// MXFP4MoEShapes is MoEShapes for an expert call whose gateUp and down may
// be MXFP4 weights (both or neither): the same checks, with MXFP4 in place
// of the float dtypes, and hidden and inter multiples of MXFP4BlockSize
// when they are.
func MXFP4MoEShapes(backend string, out, x, ids, weights, gateUp, down Tensor) (MoEDims, error) {
	const op = "moe"
	gm, dm := isMXFP4(gateUp), isMXFP4(down)
	if !gm && !dm {
		return MoEShapes(backend, out, x, ids, weights, gateUp, down)
	}
	if gm != dm {
		return MoEDims{}, fmt.Errorf("%s: %s: gate_up %v and down %v: both or neither MXFP4: %w", backend, op, gateUp, down, ErrDType)
	}
	d, err := MoEShapes(backend, out, x, ids, weights, shapeOnly{gateUp.Shape()}, shapeOnly{down.Shape()})
	if err != nil {
		return d, err
	}
	if d.Hidden%MXFP4BlockSize != 0 || d.Inter%MXFP4BlockSize != 0 {
		return d, fmt.Errorf("%s: %s: MXFP4 experts of hidden %d, inter %d: want multiples of %d: %w",
			backend, op, d.Hidden, d.Inter, MXFP4BlockSize, ErrShape)
	}
	return d, nil
}
