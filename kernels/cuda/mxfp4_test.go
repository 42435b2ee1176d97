package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
)

// These tests need no GPU: MXFP4Weight's checks run before any upload, and
// the views and refusals of MXFP4 tensors are host-side.

// mxfp4Weight is a valid MXFP4 weight of shape (codes and scales zero).
func mxfp4Weight(shape ...int) kernels.MXFP4Weight {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return kernels.MXFP4Weight{Shape: shape, Blocks: make([]byte, n/2), Scales: make([]byte, n/kernels.MXFP4BlockSize)}
}

// fakeMXFP4 is an MXFP4 tensor of this backend at made-up device addresses
// (codes at 0x10000, scales at 0x90000), for host-side checks only.
func fakeMXFP4(shape ...int) *Tensor {
	return &Tensor{shape: shape, dtype: kernels.MXFP4, buf: &buffer{ptr: 0x10000}, mx: &mxfp4Scales{scales: &buffer{ptr: 0x90000}}}
}

// TestCheckMXFP4Weight: MXFP4Weight refuses what the CPU backend's does,
// with the same error but for the backend's name.
func TestCheckMXFP4Weight(t *testing.T) {
	host := cpu.New(cpu.Options{Threads: 1})
	defer host.Close()
	nan := mxfp4Weight(2, 3, 64)
	nan.Scales[5] = 0xff
	for _, c := range []struct {
		name string
		w    kernels.MXFP4Weight
		want error // nil: accepted
	}{
		{"ok", mxfp4Weight(2, 3, 64), nil},
		{"matrix", mxfp4Weight(3, 32), nil},
		{"1-D", kernels.MXFP4Weight{Shape: []int{64}, Blocks: make([]byte, 32), Scales: make([]byte, 2)}, kernels.ErrShape},
		{"4-D", kernels.MXFP4Weight{Shape: []int{1, 2, 3, 64}, Blocks: make([]byte, 192), Scales: make([]byte, 12)}, kernels.ErrShape},
		{"negative", kernels.MXFP4Weight{Shape: []int{-2, 64}}, kernels.ErrShape},
		{"k not a multiple of 32", kernels.MXFP4Weight{Shape: []int{2, 48}, Blocks: make([]byte, 48), Scales: make([]byte, 3)}, kernels.ErrShape},
		{"k zero", kernels.MXFP4Weight{Shape: []int{2, 0}}, kernels.ErrShape},
		{"short blocks", kernels.MXFP4Weight{Shape: []int{2, 3, 64}, Blocks: make([]byte, 191), Scales: make([]byte, 12)}, kernels.ErrShape},
		{"long scales", kernels.MXFP4Weight{Shape: []int{2, 3, 64}, Blocks: make([]byte, 192), Scales: make([]byte, 13)}, kernels.ErrShape},
		{"NaN scale", nan, kernels.ErrDType},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkMXFP4Weight(c.w)
			_, hostErr := host.MXFP4Weight(c.w)
			if c.want == nil {
				if err != nil || hostErr != nil {
					t.Fatalf("cuda: %v, cpu: %v; want both to accept", err, hostErr)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("%v, want an error wrapping %v", err, c.want)
			}
			if hostErr == nil || strings.TrimPrefix(err.Error(), "cuda: ") != strings.TrimPrefix(hostErr.Error(), "cpu: ") {
				t.Errorf("cuda refuses with %q, cpu with %q", err, hostErr)
			}
		})
	}
}

// TestMXFP4Views: rows of an MXFP4 weight are MXFP4 weights of those rows
// (codes k/2 and scales k/32 bytes a row further), reshapes keep the rows'
// length or fail, and neither loses the scales.
func TestMXFP4Views(t *testing.T) {
	dev := &Backend{} // never opened: views do no device work
	w := fakeMXFP4(4, 6, 64)
	v, err := dev.Rows(w, 1, 3) // experts 1 and 2: from matrix row 6
	if err != nil {
		t.Fatal(err)
	}
	vt := v.(*Tensor)
	if !vt.HasMXFP4() || vt.dtype != kernels.MXFP4 || vt.off != 6*32 || vt.mx.off != 6*2 || vt.ptr() != 0x10000+6*32 ||
		vt.mxScales() != 0x90000+6*2 || len(vt.shape) != 3 || vt.shape[0] != 2 || vt.shape[1] != 6 {
		t.Fatalf("rows 1..3: %v at codes +%d, scales +%d", vt, vt.off, vt.mx.off)
	}
	m, err := dev.Reshape(v, 12, 64)
	if err != nil {
		t.Fatal(err)
	}
	r, err := dev.Rows(m, 5, 7) // matrix rows 6+5 .. 6+7
	if err != nil {
		t.Fatal(err)
	}
	rt := r.(*Tensor)
	if !rt.HasMXFP4() || rt.off != 11*32 || rt.mx.off != 11*2 {
		t.Fatalf("rows 5..7 of the reshaped view: codes +%d, scales +%d; want +%d, +%d", rt.off, rt.mx.off, 11*32, 11*2)
	}
	if _, err := dev.Reshape(w, 4, 12, 32); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("reshape changing the rows' length: %v, want ErrShape", err)
	}
	if (&Tensor{dtype: kernels.BF16}).HasMXFP4() || (*Tensor)(nil).HasMXFP4() {
		t.Error("HasMXFP4 true for a tensor that is not an MXFP4 weight")
	}
}

// TestMXFP4RefusedAsOnCPU: only MoEClampedSwiGLU takes MXFP4 weights, and
// only both together and of matching shapes; every other operation that is
// handed one refuses it with ErrDType (Upload, which takes bytes of a
// dtype's size, with ErrShape), with the CPU backend's error where both
// have the operation. No call reaches the device.
func TestMXFP4RefusedAsOnCPU(t *testing.T) {
	host := cpu.New(cpu.Options{Threads: 1})
	defer host.Close()
	hostMX := func(shape ...int) kernels.Tensor {
		w, err := host.MXFP4Weight(mxfp4Weight(shape...))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	hostTensor := func(d kernels.DType, shape ...int) kernels.Tensor {
		x, err := host.Alloc(d, shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	devMX := func(shape ...int) kernels.Tensor { return fakeMXFP4(shape...) }
	type mk = func(kernels.DType, ...int) kernels.Tensor
	type mkMX = func(...int) kernels.Tensor
	const f32, bf16, i32 = kernels.F32, kernels.BF16, kernels.I32
	act := kernels.ClampedSwiGLU{Limit: 7, Alpha: 1.702}
	swiglu := func(ops kernels.Ops, n mk, gu, dn kernels.Tensor) error {
		return ops.(kernels.BiasedMoEer).MoEClampedSwiGLU(n(f32, 1, 64), n(f32, 1, 64), n(i32, 1, 1), n(f32, 1, 1), gu,
			n(f32, 2, 128), dn, n(f32, 2, 64), act)
	}
	for _, tc := range []struct {
		name string
		want error
		call func(ops kernels.Ops, n mk, mx mkMX) error
	}{
		{"linear", kernels.ErrDType, func(ops kernels.Ops, n mk, mx mkMX) error {
			return ops.Linear(n(f32, 1, 64), n(f32, 1, 64), mx(64, 64), nil)
		}},
		{"embedding", kernels.ErrDType, func(ops kernels.Ops, n mk, mx mkMX) error { return ops.Embedding(n(f32, 1, 64), mx(8, 64), n(i32, 1)) }},
		{"moe", kernels.ErrDType, func(ops kernels.Ops, n mk, mx mkMX) error {
			return ops.MoE(n(f32, 1, 64), n(f32, 1, 64), n(i32, 1, 1), n(f32, 1, 1), mx(2, 128, 64), mx(2, 64, 64))
		}},
		{"MXFP4 gate_up, BF16 down", kernels.ErrDType, func(ops kernels.Ops, n mk, mx mkMX) error {
			return swiglu(ops, n, mx(2, 128, 64), n(bf16, 2, 64, 64))
		}},
		{"BF16 gate_up, MXFP4 down", kernels.ErrDType, func(ops kernels.Ops, n mk, mx mkMX) error {
			return swiglu(ops, n, n(bf16, 2, 128, 64), mx(2, 64, 64))
		}},
		{"MXFP4 experts of the wrong shape", kernels.ErrShape, func(ops kernels.Ops, n mk, mx mkMX) error {
			return swiglu(ops, n, mx(2, 128, 64), mx(2, 64, 96))
		}},
		{"upload", kernels.ErrShape, func(ops kernels.Ops, n mk, mx mkMX) error {
			return ops.Upload(mx(2, 64), make([]byte, 64), kernels.MXFP4)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.call(host, hostTensor, hostMX)
			got := tc.call(&Backend{}, newTensor, devMX)
			if !errors.Is(want, tc.want) || !errors.Is(got, tc.want) {
				t.Fatalf("cpu: %v, cuda: %v; want both to refuse with %v", want, got, tc.want)
			}
			if w, g := strings.TrimPrefix(want.Error(), "cpu: "), strings.TrimPrefix(got.Error(), "cuda: "); w != g {
				t.Errorf("cuda refuses with %q, cpu with %q", got, want)
			}
		})
	}
	dev := &Backend{}
	if _, err := dev.Alloc(kernels.MXFP4, 2, 64); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("Alloc of MXFP4: %v, want ErrDType", err)
	}
	if err := dev.CopyRect(fakeMXFP4(2, 64), fakeMXFP4(2, 64)); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("CopyRect of MXFP4 weights: %v, want ErrDType", err)
	}
}

// mxfp4KernelPairs models di_mx_bits (mxfp4.cuh): the four BF16 pairs of a
// device word before scaling.
func mxfp4KernelPairs(w uint32) [4]uint32 {
	const m = 0x81C081C0
	return [4]uint32{w & m, bits.RotateLeft32(w, -4) & m, bits.RotateLeft32(w, -10) & m,
		bits.RotateLeft32(w, -14)&0x80C080C0 | (w>>6)&0x01000100}
}

// mxfp4KernelMul models di_bf16x2_mul on one half: the BF16 product of a and
// b (the widening's products are exact, or overflow to infinity).
func mxfp4KernelMul(a, b uint16) uint16 {
	f := func(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }
	return kernels.F32ToBF16(float32(f(a) * f(b)))
}

// mxfp4KernelWiden models di_mx_widen: element e of a device word under
// scale s, as BF16 bits (both forms: one multiply by di_mx_pow(s) for s <=
// 128, two for BIG).
func mxfp4KernelWiden(w uint32, e int, s uint32, big bool) uint16 {
	half := uint16(mxfp4KernelPairs(w)[e/2] >> (16 * (e % 2)))
	if !big {
		return mxfp4KernelMul(half, uint16(s*0x00800080+0x3F003F00))
	}
	p, q := uint16(min(s, 128)*0x00800080+0x3F003F00), uint16((max(s, 128)-1)*0x00800080)
	return mxfp4KernelMul(mxfp4KernelMul(half, p), q)
}

// TestMXFP4DeviceWidening: a code placed by MXFP4Weight's rearrangement
// (mxfp4DeviceBit) and widened as the kernels widen it gives the BF16
// widening of kernels.F32ToBF16(kernels.MXFP4ToF32) for every code, place
// in the word and scale (one multiply up to scale 128, two above, and the
// two-multiply form at every scale, as a block with a big scale elsewhere
// takes it).
func TestMXFP4DeviceWidening(t *testing.T) {
	seen := map[int]bool{}
	for _, d := range mxfp4DeviceBit {
		seen[d] = true
	}
	if len(seen) != 32 {
		t.Fatalf("mxfp4DeviceBit is not a permutation: %v", mxfp4DeviceBit)
	}
	for e := range 8 {
		for code := range 16 {
			var stored [4]byte
			stored[e/2] = byte(code << (4 * (e % 2)))
			w := mxfp4WordBits[0][stored[0]] | mxfp4WordBits[1][stored[1]] | mxfp4WordBits[2][stored[2]] | mxfp4WordBits[3][stored[3]]
			for s := range 255 {
				want := kernels.F32ToBF16(kernels.MXFP4ToF32(byte(code), byte(s)))
				if s <= 128 {
					if got := mxfp4KernelWiden(w, e, uint32(s), false); got != want {
						t.Fatalf("element %d, code %#x, scale %d: %#04x, want %#04x", e, code, s, got, want)
					}
				}
				if got := mxfp4KernelWiden(w, e, uint32(s), true); got != want {
					t.Fatalf("element %d, code %#x, scale %d (two multiplies): %#04x, want %#04x", e, code, s, got, want)
				}
				for o := range 8 { // the other elements of the word widen to zero
					if o != e && mxfp4KernelWiden(w, o, uint32(s), true)&0x7fff != 0 {
						t.Fatalf("element %d, code %#x: element %d is not zero", e, code, o)
					}
				}
			}
		}
	}
}

// TestMXFP4DeviceLayout: in a row rearranged by mxfp4DeviceRow, the reads
// of the kernels (modeled on di_mx_mma_k's and di_mx_gemv_k's copies and
// their word and scale picks) find the codes of the columns each lane
// multiplies, every 8-column chunk once, for rows of full 512-column
// segments, of a tail only, and of both.
func TestMXFP4DeviceLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, k := range []int{32, 64, 160, 480, 512, 544, 1120, 2880, 4096} {
		src := make([]byte, k/2)
		for i := range src {
			src[i] = byte(r.IntN(256))
		}
		dev := make([]byte, k/2)
		mxfp4DeviceRow(dev, src)
		nb := k / 32
		nfull, nt := nb/16, nb%16
		ns := nfull
		if nt > 0 {
			ns++
		}
		// check reads the device word at byte o as the chunk of columns col .. col + 7.
		covered := map[string]int{}
		check := func(path string, o, col int) {
			t.Helper()
			w := binary.LittleEndian.Uint32(dev[o:])
			for e := range 8 {
				c := col + e
				code := src[c/2] >> (4 * (c % 2)) & 0xf
				half := uint16(mxfp4KernelPairs(w)[e/2] >> (16 * (e % 2)))
				if got := byte(half>>15)<<3 | byte(half>>6&7); got != code || half&0x7e3f != 0 {
					t.Fatalf("k %d, %s: byte %d element %d is %#04x, want code %#x of column %d", k, path, o, e, half, code, c)
				}
			}
			covered[fmt.Sprint(path, col)]++
		}
		cs, rsGemv := 4*((nb+15)/16), 16*((nb+15)/16)
		for g := range ns { // segment
			for chain := range 4 { // di_mx_mma_k: warp chain, lane quarter t4
				for t4 := range 4 {
					steps := 4
					if g == nfull {
						steps = (nt - chain + 3) / 4
					}
					for si := range steps {
						o := 256*g + 64*chain + 16*t4 + 4*[4]int{0, 2, 1, 3}[si]
						if g == nfull {
							o = 256*nfull + 16*(4*si+chain) + 4*t4
						}
						col := 512*g + 128*si + 32*chain + 8*t4
						check("mma", o, col)
						if b := col / 32; (b&3)*cs+b>>2 != chain*cs+4*g+si {
							t.Fatalf("k %d: mma scale of block %d not at byte %d of its chain's word", k, b, si)
						}
					}
				}
			}
			for lane := range 32 { // di_mx_gemv_k
				for h := range 2 {
					col := 512*g + 256*h + 8*lane
					if col >= k {
						continue
					}
					o := 256*g + 64*(lane>>2&3) + 16*(lane&3) + 8*(lane>>4) + 4*h
					if g == nfull {
						o = 256*nfull + 128*h + 4*lane
					}
					check("gemv", o, col)
					b := col / 32
					if pos := b&^15 | (b&7)<<1 | b>>3&1; pos != 16*g+2*(lane>>2)+h || pos >= rsGemv {
						t.Fatalf("k %d: gemv scale of block %d at %d, lane %d reads %d", k, b, pos, lane, 16*g+2*(lane>>2)+h)
					}
				}
			}
		}
		for _, path := range []string{"mma", "gemv"} {
			for col := 0; col < k; col += 8 {
				if n := covered[fmt.Sprint(path, col)]; n != 1 {
					t.Fatalf("k %d, %s: columns %d.. read %d times", k, path, col, n)
				}
			}
		}
	}
}

// TestMXFP4DeviceRows: the rows rearranged in parallel are those
// rearranged one by one.
func TestMXFP4DeviceRows(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, rowBytes = 300, 1440
	src := make([]byte, rows*rowBytes)
	for i := range src {
		src[i] = byte(r.IntN(256))
	}
	got, want := make([]byte, len(src)), make([]byte, len(src))
	mxfp4DeviceRows(got, src, rowBytes)
	for i := range rows {
		mxfp4DeviceRow(want[i*rowBytes:(i+1)*rowBytes], src[i*rowBytes:(i+1)*rowBytes])
	}
	if !bytes.Equal(got, want) {
		t.Fatal("mxfp4DeviceRows differs from mxfp4DeviceRow row by row")
	}
}
