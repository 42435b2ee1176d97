package cpu

import (
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// RoPE rotates the rotary part of every head of x in place.
func (b *Backend) RoPE(x, positions, cos, sin kernels.Tensor, p kernels.RoPEParams) error {
	const op = "rope"
	if err := b.checkOpen(op); err != nil {
		return err
	}
	xs, err := asCPU(op, "x", x)
	if err != nil {
		return err
	}
	ps, err := asCPU(op, "positions", positions)
	if err != nil {
		return err
	}
	cs, err := asCPU(op, "cos", cos)
	if err != nil {
		return err
	}
	ss, err := asCPU(op, "sin", sin)
	if err != nil {
		return err
	}
	t, maxPos, err := kernels.RoPEShapes("cpu", xs, ps, cs, ss, p)
	if err != nil {
		return err
	}
	width, half := p.NumHeads*p.HeadSize, p.RotaryDim/2
	for i, pos := range ps.i32 {
		if pos < 0 || int(pos) >= maxPos {
			return fmt.Errorf("cpu: %s: positions[%d] = %d, table has %d: %w", op, i, pos, maxPos, kernels.ErrOutOfRange)
		}
	}
	b.forRows(t, width, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			pos := int(ps.i32[i])
			c := cs.f32[pos*half : (pos+1)*half]
			s := ss.f32[pos*half : (pos+1)*half]
			row := xs.f32[i*width : (i+1)*width]
			for h := range p.NumHeads {
				v := row[h*p.HeadSize+p.Offset : h*p.HeadSize+p.Offset+p.RotaryDim]
				if p.Interleaved {
					for j := range half {
						x0, x1 := v[2*j], v[2*j+1]
						v[2*j] = x0*c[j] - x1*s[j]
						v[2*j+1] = x1*c[j] + x0*s[j]
					}
				} else {
					for j := range half {
						x0, x1 := v[j], v[j+half]
						v[j] = x0*c[j] - x1*s[j]
						v[j+half] = x1*c[j] + x0*s[j]
					}
				}
			}
		}
	})
	return nil
}
