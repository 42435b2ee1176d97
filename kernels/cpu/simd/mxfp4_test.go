package simd

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMXFP4Table: every (scale, code) entry is code * 2^(scale-127) as a
// BF16 value, computed here in float64 and checked to be exact where it is
// finite: the 8 KiB table the SIMD paths look codes up in.
func TestMXFP4Table(t *testing.T) {
	e2m1 := [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for s := range 256 {
		for c := range 16 {
			v := e2m1[c&7] * math.Pow(2, float64(s-127))
			if c&8 != 0 {
				v = -v
			}
			got := MXFP4ToBF16(byte(c), byte(s))
			g := float64(bf16ToF32(got))
			switch {
			case math.Abs(v) > math.MaxFloat32:
				if !math.IsInf(g, int(math.Copysign(1, v))) {
					t.Fatalf("scale %d code %#x: %#04x (%g), want infinity of %g", s, c, got, g, v)
				}
			case g != v || math.Signbit(g) != (c&8 != 0):
				t.Fatalf("scale %d code %#x: %#04x (%g), want %g", s, c, got, g, v)
			}
		}
	}
}

// TestWidenMXFP4AllCodesAllScales: every path widens every byte (both
// nibbles) under every scale, 255 included, to MXFP4ToBF16's bits; blocks
// of one scale and blocks whose scales all differ, at odd block counts.
func TestWidenMXFP4AllCodesAllScales(t *testing.T) {
	blocks := make([]byte, 256) // every byte once: 16 blocks
	for i := range blocks {
		blocks[i] = byte(i)
	}
	check := func(t *testing.T, p *Impl, blocks, scales []byte) {
		t.Helper()
		dst := make([]uint16, 32*len(scales)+1)
		dst[len(dst)-1] = 0xdead
		p.WidenMXFP4(dst[:32*len(scales)], blocks, scales)
		for i, got := range dst[:32*len(scales)] {
			b := blocks[i/2]
			if want := MXFP4ToBF16(b>>(4*(i%2)), scales[i/32]); got != want {
				t.Fatalf("%s: element %d (byte %#02x, scale %d): %#04x, want %#04x", p.Name(), i, b, scales[i/32], got, want)
			}
		}
		if dst[len(dst)-1] != 0xdead {
			t.Fatalf("%s: wrote past 32*len(scales)", p.Name())
		}
	}
	for _, p := range Impls() {
		t.Run(p.Name(), func(t *testing.T) {
			for s := range 256 {
				scales := make([]byte, 16)
				for i := range scales {
					scales[i] = byte(s)
				}
				check(t, p, blocks, scales)
			}
			// Each block its own scale, and every odd count of blocks.
			r := rand.New(rand.NewPCG(3, 4))
			many := make([]byte, 16*256)
			scales := make([]byte, 256)
			for i := range scales {
				scales[i] = byte(i)
			}
			for i := range many {
				many[i] = byte(r.IntN(256))
			}
			for _, nb := range []int{1, 2, 3, 7, 255, 256} {
				check(t, p, many[:16*nb], scales[:nb])
			}
		})
	}
}

func TestWidenMXFP4Panics(t *testing.T) {
	for _, c := range []struct {
		name              string
		dst, blocks, scls int
	}{
		{"short blocks", 64, 31, 2}, {"short dst", 63, 32, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			WidenMXFP4(make([]uint16, c.dst), make([]byte, c.blocks), make([]byte, c.scls))
		})
	}
}

// TestGemvMXFP4MatchesWidened: every path's GemvMXFP4 gives the bits of
// LinearBF16 (each path's, all equal) over the rows widened by the Go
// WidenMXFP4, for row counts that are and are not multiples of the fused
// kernel's 8, every scale among the rows (255 included, whose infinities
// give infinities or NaNs in both), and x with mixed signs and magnitudes.
func TestGemvMXFP4MatchesWidened(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct{ n, k int }{{1, 32}, {3, 64}, {8, 96}, {13, 2880}, {17, 160}} {
		blocks, scales := make([]byte, c.n*c.k/2), make([]byte, c.n*c.k/32)
		for i := range blocks {
			blocks[i] = byte(r.IntN(256))
		}
		for i := range scales {
			scales[i] = byte(118 + r.IntN(18))
			if r.IntN(8) == 0 {
				scales[i] = byte(r.IntN(256))
			}
		}
		x := make([]float32, c.k)
		for i := range x {
			x[i] = float32(r.NormFloat64()) * float32(math.Ldexp(1, r.IntN(9)-4))
		}
		wide := make([]uint16, c.n*c.k)
		goImpl.WidenMXFP4(wide, blocks, scales)
		want := make([]float32, c.n)
		goImpl.LinearBF16(want, x, wide, 1, c.n, c.k, 0, c.n)
		for _, p := range Impls() {
			got := make([]float32, c.n+1)
			got[c.n] = 42
			p.GemvMXFP4(got[:c.n], x, blocks, scales, c.n, c.k)
			for j := range c.n {
				g, w := got[j], want[j]
				if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
					t.Fatalf("%s n=%d k=%d: out[%d] = %g (%#08x), want %g (%#08x)", p.Name(), c.n, c.k, j, g, math.Float32bits(g), w, math.Float32bits(w))
				}
			}
			if got[c.n] != 42 {
				t.Fatalf("%s n=%d k=%d: wrote past out[n-1]", p.Name(), c.n, c.k)
			}
		}
	}
}
