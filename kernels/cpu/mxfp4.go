package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

var (
	_ kernels.MXFP4Weighter = (*Backend)(nil)
	_ kernels.MXFP4Blocker  = (*Tensor)(nil)
)

// mxfp4Rows are the blocks and scales of an MXFP4 weight tensor (see
// kernels.MXFP4Weight): k/2 bytes and k/32 scales a matrix row, k the last
// dimension. Views slice both with their rows.
type mxfp4Rows struct {
	blocks []byte
	scales []byte
}

// HasMXFP4 reports whether t is an MXFP4 weight built by MXFP4Weight.
func (t *Tensor) HasMXFP4() bool { return t != nil && t.mx != nil }

// MXFP4Weight copies an MXFP4 weight into Go memory: 4.25 bits a weight,
// widened a tile of rows at a time inside MoEClampedSwiGLU's expert loops
// (bit for bit as if the weight had been widened to BF16 at load). Cost:
// one copy of the blocks (into memory advised for huge pages, weightArena)
// and scales and one pass over the scales.
func (b *Backend) MXFP4Weight(w kernels.MXFP4Weight) (kernels.Tensor, error) {
	const op = "mxfp4_weight"
	if len(w.Shape) < 2 || len(w.Shape) > 3 {
		return nil, fmt.Errorf("cpu: %s: shape %v, want [n, k] or [experts, n, k]: %w", op, w.Shape, kernels.ErrShape)
	}
	n := 1
	for _, d := range w.Shape {
		if d < 0 {
			return nil, fmt.Errorf("cpu: %s: shape %v: %w", op, w.Shape, kernels.ErrShape)
		}
		n *= d
	}
	k := w.Shape[len(w.Shape)-1]
	if k <= 0 || k%kernels.MXFP4BlockSize != 0 {
		return nil, fmt.Errorf("cpu: %s: shape %v: last dimension not a positive multiple of %d: %w", op, w.Shape, kernels.MXFP4BlockSize, kernels.ErrShape)
	}
	if len(w.Blocks) != n/2 || len(w.Scales) != n/kernels.MXFP4BlockSize {
		return nil, fmt.Errorf("cpu: %s: %d block bytes and %d scales for shape %v, want %d and %d: %w",
			op, len(w.Blocks), len(w.Scales), w.Shape, n/2, n/kernels.MXFP4BlockSize, kernels.ErrShape)
	}
	for i, s := range w.Scales {
		if s == 0xff {
			return nil, fmt.Errorf("cpu: %s: scale %d is the E8M0 NaN (0xff): %w", op, i, kernels.ErrDType)
		}
	}
	blocks, keep := b.weights.bytes(len(w.Blocks))
	copy(blocks, w.Blocks)
	return &Tensor{shape: append([]int(nil), w.Shape...), dtype: kernels.MXFP4, keep: keep,
		mx: &mxfp4Rows{blocks: blocks, scales: append([]byte(nil), w.Scales...)}}, nil
}

// mxRows is the view of matrix rows [lo, hi) of an MXFP4 weight, shaped
// shape.
func (t *Tensor) mxRows(lo, hi int, shape []int) *Tensor {
	k := t.shape[len(t.shape)-1]
	bk, sk := k/2, k/kernels.MXFP4BlockSize
	return &Tensor{shape: shape, dtype: kernels.MXFP4, keep: t.keep, mx: &mxfp4Rows{
		blocks: t.mx.blocks[lo*bk : hi*bk : hi*bk], scales: t.mx.scales[lo*sk : hi*sk : hi*sk]}}
}

// mxExpert is expert e of a 3-D MXFP4 weight as a matrix.
func mxExpert(t *Tensor, e int) *Tensor {
	n := t.shape[1]
	return t.mxRows(e*n, (e+1)*n, t.shape[1:])
}

// widenMXFP4 is the Go path of simd's WidenMXFP4: the BF16 bits of the
// MXFP4 elements of blocks and scales into dst[:32*len(scales)] (see
// simd.MXFP4ToBF16), the widening models apply for backends without MXFP4
// kernels.
func widenMXFP4(dst []uint16, blocks, scales []byte) {
	simdGo.WidenMXFP4(dst, blocks, scales)
}

// simdGo is the pure-Go simd implementation, always available.
var simdGo, _ = simd.Lookup("go")

// mxfp4Tile is the number of weight rows widened at a time (and the unit
// of parallel work): 16 rows of gpt-oss's 2880 columns are 90 KiB of BF16,
// which stay in the core's L2 while the tile's products read them. The
// result does not depend on it.
const mxfp4Tile = 16

// linearMXFP4 is linear for an MXFP4 weight w [n, k]: out[m, n] = x[m, k]
// w^T + bias. Each tile of rows is widened to BF16 in scratch and
// multiplied by the BF16 inner loop (or llama.cpp's, under
// Options.Activations), so every output element is the one linear
// gives for w widened to BF16 at load. The widening is the backend's simd
// path's (simd.WidenMXFP4: one VPERMW per 32 weights with AVX-512); for
// one row of float32 activations (decode) simd.GemvMXFP4 multiplies the
// blocks directly (fused with AVX-512, no scratch). Every path gives the
// same bits. Memory traffic: the MXFP4 bytes once, plus x once a tile.
func (b *Backend) linearMXFP4(out, x []float32, w *Tensor, m, n, k int, bias []float32) {
	impl, err := simd.Lookup(b.k.name)
	if err != nil { // b.k came from simd.Pick, so it is available
		impl = simdGo
	}
	tiles := (n + mxfp4Tile - 1) / mxfp4Tile
	var acts *llamaActs // x rounded once for all tiles
	if b.acts.roundsFor(kernels.MXFP4) {
		acts = newLlamaActs(x, &Tensor{dtype: kernels.BF16}, m, k, b.k, ActLlamaCpp)
	}
	bk, sk := k/2, k/kernels.MXFP4BlockSize
	body := func(lo, hi int) {
		if m == 1 && acts == nil {
			// Decode: one product over the chunk's rows (fused with
			// AVX-512, no scratch round trip).
			j0, j1 := lo*mxfp4Tile, min(hi*mxfp4Tile, n)
			o := out[j0:j1]
			impl.GemvMXFP4(o, x, w.mx.blocks[j0*bk:j1*bk], w.mx.scales[j0*sk:j1*sk], j1-j0, k)
			if bias != nil {
				for j := range o {
					o[j] += bias[j0+j]
				}
			}
			return
		}
		wt := make([]uint16, mxfp4Tile*k) // a tile widened to BF16
		var ot []float32                  // a tile's outputs when there are several rows
		if m > 1 {
			ot = make([]float32, m*mxfp4Tile)
		}
		for tile := lo; tile < hi; tile++ {
			j0, j1 := tile*mxfp4Tile, min((tile+1)*mxfp4Tile, n)
			nt := j1 - j0
			wn := wt[:nt*k]
			impl.WidenMXFP4(wn, w.mx.blocks[j0*bk:j1*bk], w.mx.scales[j0*sk:j1*sk])
			o := out[j0:j1]
			if m > 1 {
				o = ot[:m*nt]
			}
			if acts != nil {
				acts.linear(o, &Tensor{shape: []int{nt, k}, dtype: kernels.BF16, u16: wn}, m, nt, k, 0, nt)
			} else {
				b.k.linearBF16(o, x, wn, m, nt, k, 0, nt)
			}
			for i := range m {
				row := out[i*n+j0 : i*n+j1]
				if m > 1 {
					copy(row, o[i*nt:(i+1)*nt])
				}
				if bias != nil {
					for j := range row {
						row[j] += bias[j0+j]
					}
				}
			}
		}
	}
	if m*n*k < parallelLinearWork || tiles < 2 {
		body(0, tiles)
		return
	}
	b.run.For(tiles, body)
}

// expertLinear is linear with expert e of w (3-D, in its stored dtype or
// MXFP4).
func (b *Backend) expertLinear(out, x []float32, w *Tensor, e, m, n, k int, bias []float32) {
	if w.mx != nil {
		b.linearMXFP4(out, x, mxExpert(w, e), m, n, k, bias)
		return
	}
	b.linear(out, x, expert(w, e), m, n, k, bias)
}
