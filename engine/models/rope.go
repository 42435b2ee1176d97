package models

import (
	"fmt"
	"math"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// ropeTables holds the cos and sin tables of a model, [max_positions, rotary_dim/2]
// in backend memory, with the rope type's attention factor folded in.
type ropeTables struct {
	cos, sin  kernels.Tensor
	rotaryDim int
}

// yarnMscale is DeepSeek's yarn_get_mscale.
func yarnMscale(scale, mscale float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*mscale*math.Log(scale) + 1
}

// baseInvFreq is 1/base^(2i/dim), with the exponent rounded to float32 as the
// reference computes it.
func baseInvFreq(base float64, dim int) []float64 {
	inv := make([]float64, dim/2)
	for i := range inv {
		e := float32(2*i) / float32(dim)
		inv[i] = 1 / math.Pow(base, float64(e))
	}
	return inv
}

// ropeInvFreq returns, for the rope type of r, the inverse frequencies of row
// pos (they depend on pos only for "dynamic") and the cos/sin scale.
// maxPosEmb is config max_position_embeddings.
func ropeInvFreq(r weights.Rope, dim, maxPosEmb int) (func(pos int) []float64, float64, error) {
	inv := baseInvFreq(r.Theta, dim)
	fixed := func(int) []float64 { return inv }
	switch r.Type {
	case "default", "":
		return fixed, 1, nil
	case "linear":
		for i := range inv {
			inv[i] /= r.Factor
		}
		return fixed, 1, nil
	case "dynamic":
		// The reference recomputes the base from the longest sequence seen so
		// far, which makes a token's angles depend on its batch. Here row pos
		// uses the base for seq_len = max(pos+1, max_position_embeddings): the
		// angles the reference gives when decoding token by token, identical to
		// the plain table below max_position_embeddings, and batch-invariant.
		cache := map[int][]float64{}
		return func(pos int) []float64 {
			seqLen := max(pos+1, maxPosEmb)
			if seqLen == maxPosEmb {
				return inv
			}
			if v, ok := cache[seqLen]; ok {
				return v
			}
			base := r.Theta * math.Pow(r.Factor*float64(seqLen)/float64(maxPosEmb)-(r.Factor-1), float64(dim)/float64(dim-2))
			v := baseInvFreq(base, dim)
			cache[seqLen] = v
			return v
		}, 1, nil
	case "llama3":
		oldCtx := float64(r.OriginalMaxPositionEmbeddings)
		lowWave, highWave := oldCtx/r.LowFreqFactor, oldCtx/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / r.Factor
			default:
				smooth := (oldCtx/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				inv[i] = (1-smooth)*f/r.Factor + smooth*f
			}
		}
		return fixed, 1, nil
	case "yarn":
		factor := r.Factor
		orig := r.OriginalMaxPositionEmbeddings
		if orig <= 0 {
			orig = maxPosEmb
		} else if factor == 1 && maxPosEmb > orig {
			factor = float64(maxPosEmb) / float64(orig)
		}
		att := r.AttentionFactor
		if att <= 0 {
			if r.Mscale != 0 && r.MscaleAllDim != 0 {
				att = yarnMscale(factor, r.Mscale) / yarnMscale(factor, r.MscaleAllDim)
			} else {
				att = yarnMscale(factor, 1)
			}
		}
		corrDim := func(rot float64) float64 {
			return float64(dim) * math.Log(float64(orig)/(rot*2*math.Pi)) / (2 * math.Log(r.Theta))
		}
		low, high := corrDim(r.BetaFast), corrDim(r.BetaSlow)
		if r.Truncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low, high = max(low, 0), min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i, f := range inv {
			ramp := min(max((float64(i)-low)/(high-low), 0), 1)
			extrap := 1 - ramp
			inv[i] = f/factor*(1-extrap) + f*extrap
		}
		return fixed, att, nil
	}
	return nil, 0, fmt.Errorf("models: rope type %q: %w", r.Type, ErrConfig)
}

// newRopeTables builds the tables for positions [0, maxPos) on the host and
// uploads them. Angles are float32(inv_freq) * float32(pos) rounded to
// float32, as the reference computes them.
func newRopeTables(ops kernels.Ops, r weights.Rope, dim, maxPosEmb, maxPos int) (*ropeTables, error) {
	if dim <= 0 || dim%2 != 0 || maxPos <= 0 {
		return nil, fmt.Errorf("models: rope over %d dims, %d positions: %w", dim, maxPos, ErrConfig)
	}
	invAt, att, err := ropeInvFreq(r, dim, maxPosEmb)
	if err != nil {
		return nil, err
	}
	half := dim / 2
	cos, sin := make([]float32, maxPos*half), make([]float32, maxPos*half)
	inv32 := make([]float32, half)
	var last []float64
	for p := range maxPos {
		if inv := invAt(p); &inv[0] != lastPtr(last) {
			for i, f := range inv {
				inv32[i] = float32(f)
			}
			last = inv
		}
		for i, f := range inv32 {
			a := float64(f * float32(p))
			cos[p*half+i] = float32(math.Cos(a)) * float32(att)
			sin[p*half+i] = float32(math.Sin(a)) * float32(att)
		}
	}
	t := &ropeTables{rotaryDim: dim}
	if t.cos, err = kernels.FromF32(ops, cos, maxPos, half); err != nil {
		return nil, err
	}
	if t.sin, err = kernels.FromF32(ops, sin, maxPos, half); err != nil {
		return nil, err
	}
	return t, nil
}

func lastPtr(s []float64) *float64 {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}
