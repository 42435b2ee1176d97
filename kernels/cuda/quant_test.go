package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// randQuantWeight quantizes random rows (uniform in [-scale, scale)) into
// the parts' formats (rows[i] rows of types[i]) with ggml's reference
// quantizers and returns the weight with its dequantized float32 values.
func randQuantWeight(r *rand.Rand, shape []int, types []kernels.QuantType, rows []int, scale float32) (kernels.QuantWeight, []float32) {
	k := shape[len(shape)-1]
	w := kernels.QuantWeight{Shape: shape}
	var deq []float32
	for i, typ := range types {
		q := simd.QuantType(typ)
		rb, err := q.RowBytes(k)
		if err != nil {
			panic(err)
		}
		data := make([]byte, rows[i]*rb)
		q.Quantize(data, randVals(r, rows[i]*k, scale))
		vals := make([]float32, rows[i]*k)
		q.Dequantize(vals, data)
		deq = append(deq, vals...)
		w.Parts = append(w.Parts, kernels.QuantPart{Type: typ, Rows: rows[i], Data: data})
	}
	return w, deq
}

// deviceRowF32 dequantizes row r of a packed weight the way quant.cu's
// di_qdeq32 reads the device layout (the table entry, then each 32-weight
// unit from its block and the tail of d values), in float32 with the
// roundings of dequantize_row_*.
func deviceRowF32(data, table []byte, r, k int) []float32 {
	desc := binary.LittleEndian.Uint64(table[8*r:])
	typ := kernels.QuantType(desc >> 56)
	row := data[desc&(1<<56-1):]
	half := func(b []byte) float32 { return kernels.F16ToF32(binary.LittleEndian.Uint16(b)) }
	f := quantFormats[typ]
	nb := k / f.block
	y := make([]float32, k)
	scaleMin := func(j int, q []byte) (float32, float32) {
		if j < 4 {
			return float32(q[j] & 63), float32(q[j+4] & 63)
		}
		return float32(q[j+4]&0xf | (q[j-4]>>6)<<4), float32(q[j+4]>>4 | (q[j]>>6)<<4)
	}
	for u := range k / 32 {
		out := y[32*u : 32*u+32]
		switch typ {
		case kernels.QuantQ8_0:
			d := half(row[32*nb+2*u:])
			for l := range 32 {
				out[l] = float32(int8(row[32*u+l])) * d
			}
		case kernels.QuantQ4_0:
			d := half(row[16*nb+2*u:])
			for l := range 16 {
				q := row[16*u+l]
				out[l] = float32(int(q&0xf)-8) * d
				out[l+16] = float32(int(q>>4)-8) * d
			}
		case kernels.QuantQ4_K, kernels.QuantQ5_K:
			q5 := typ == kernels.QuantQ5_K
			s, c, hi := u&7, (u&7)>>1, u&1
			blk := row[(u>>3)*f.bytes:]
			sc, m := scaleMin(s, blk[4:16])
			d1, m1 := half(blk)*sc, half(blk[2:])*m
			qs := blk[16+32*c:]
			if q5 {
				qs = blk[48+32*c:]
			}
			for l := range 32 {
				v := qs[l] & 0xf
				if hi == 1 {
					v = qs[l] >> 4
				}
				if q5 && (blk[16+l]>>s)&1 != 0 {
					v += 16
				}
				out[l] = d1*float32(v) - m1
			}
		case kernels.QuantQ6_K:
			b, s := u>>3, u&7
			n, g := s>>2, s&3
			body := row[208*b:]
			d := half(row[208*nb+2*b:])
			for l := range 32 {
				lb := body[64*n+l]
				if g&1 == 1 {
					lb = body[64*n+l+32]
				}
				lo4 := lb & 0xf
				if g&2 != 0 {
					lo4 = lb >> 4
				}
				q := int(lo4 | ((body[128+32*n+l]>>(2*g))&3)<<4)
				out[l] = d * float32(int8(body[192+8*n+l/16+2*g])) * float32(q-32)
			}
		}
	}
	return y
}

// TestPackQuantLayout: the device layout holds every weight where quant.cu
// reads it: dequantized through it, each row of every format (and of
// fused weights mixing formats) is bit for bit ggml's dequantization, and
// every row starts 16-byte aligned.
func TestPackQuantLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		types []kernels.QuantType
		rows  []int
		k     int
	}{
		{[]kernels.QuantType{kernels.QuantQ8_0}, []int{5}, 96},
		{[]kernels.QuantType{kernels.QuantQ4_0}, []int{7}, 160},
		{[]kernels.QuantType{kernels.QuantQ4_K}, []int{3}, 512},
		{[]kernels.QuantType{kernels.QuantQ5_K}, []int{3}, 256},
		{[]kernels.QuantType{kernels.QuantQ6_K}, []int{4}, 768},
		{[]kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K, kernels.QuantQ4_K}, []int{3, 2, 1}, 256},
		{[]kernels.QuantType{kernels.QuantQ8_0, kernels.QuantQ5_K, kernels.QuantQ4_0}, []int{2, 2, 2}, 256},
	} {
		n := 0
		for _, rr := range c.rows {
			n += rr
		}
		w, deq := randQuantWeight(r, []int{n, c.k}, c.types, c.rows, 1)
		data, table, segs, err := packQuant(w)
		if err != nil {
			t.Fatal(err)
		}
		if len(segs) == 0 || segs[len(segs)-1].hi != n {
			t.Fatalf("%v: segments %v do not cover %d rows", c.types, segs, n)
		}
		for row := range n {
			if off := binary.LittleEndian.Uint64(table[8*row:]) & (1<<56 - 1); off%16 != 0 {
				t.Fatalf("%v: row %d at byte %d, not 16-byte aligned", c.types, row, off)
			}
			got := deviceRowF32(data, table, row, c.k)
			for j, v := range got {
				if want := deq[row*c.k+j]; math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("%v k=%d: row %d weight %d is %v through the device layout, ggml gives %v", c.types, c.k, row, j, v, want)
				}
			}
		}
	}
}

// TestPackQuantChecks: QuantWeight's checks (which run before any device
// work) accept and refuse what the CPU backend's do, with the same
// sentinel errors.
func TestPackQuantChecks(t *testing.T) {
	host := cpu.New(cpu.Options{Threads: 1})
	defer host.Close()
	r := rand.New(rand.NewPCG(3, 4))
	good, _ := randQuantWeight(r, []int{3, 256}, []kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ6_K}, []int{2, 1}, 1)
	q8, _ := randQuantWeight(r, []int{2, 64}, []kernels.QuantType{kernels.QuantQ8_0}, []int{2}, 1)
	for _, tc := range []struct {
		name string
		w    kernels.QuantWeight
		want error
	}{
		{"fused", good, nil},
		{"experts", kernels.QuantWeight{Shape: []int{3, 1, 256}, Parts: good.Parts}, nil},
		{"q8_0 k 64", q8, nil},
		{"one dimension", kernels.QuantWeight{Shape: []int{768}, Parts: good.Parts}, kernels.ErrShape},
		{"four dimensions", kernels.QuantWeight{Shape: []int{1, 1, 3, 256}, Parts: good.Parts}, kernels.ErrShape},
		{"negative dimension", kernels.QuantWeight{Shape: []int{-3, 256}, Parts: good.Parts}, kernels.ErrShape},
		{"rows short", kernels.QuantWeight{Shape: []int{4, 256}, Parts: good.Parts}, kernels.ErrShape},
		{"rows over", kernels.QuantWeight{Shape: []int{2, 256}, Parts: good.Parts}, kernels.ErrShape},
		{"bytes short", kernels.QuantWeight{Shape: []int{2, 256}, Parts: []kernels.QuantPart{
			{Type: kernels.QuantQ4_K, Rows: 2, Data: good.Parts[0].Data[:287]}}}, kernels.ErrShape},
		{"k not whole blocks", kernels.QuantWeight{Shape: []int{2, 64}, Parts: []kernels.QuantPart{
			{Type: kernels.QuantQ4_K, Rows: 2, Data: make([]byte, 72)}}}, kernels.ErrShape},
		{"negative rows", kernels.QuantWeight{Shape: []int{0, 64}, Parts: []kernels.QuantPart{
			{Type: kernels.QuantQ8_0, Rows: -1, Data: nil}}}, kernels.ErrShape},
		{"F16 is not a block format", kernels.QuantWeight{Shape: []int{2, 64}, Parts: []kernels.QuantPart{
			{Type: 1, Rows: 2, Data: make([]byte, 256)}}}, kernels.ErrDType},
		{"Q2_K", kernels.QuantWeight{Shape: []int{1, 256}, Parts: []kernels.QuantPart{
			{Type: 10, Rows: 1, Data: make([]byte, 84)}}}, kernels.ErrDType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := packQuant(tc.w)
			_, cerr := host.QuantWeight(tc.w)
			if tc.want == nil {
				if err != nil || cerr != nil {
					t.Fatalf("cuda: %v, cpu: %v; want both accepted", err, cerr)
				}
				return
			}
			if !errors.Is(err, tc.want) || !errors.Is(cerr, tc.want) {
				t.Fatalf("cuda: %v, cpu: %v; want both wrapping %v", err, cerr, tc.want)
			}
		})
	}
}

// TestQuantViews: Rows and Reshape of a block-quantized weight (no device
// memory needed: views only move the row table) keep it a weight of the
// right rows and formats, and Reshape may not change the rows' length.
func TestQuantViews(t *testing.T) {
	var b Backend
	w := &Tensor{shape: []int{3, 4, 256}, dtype: kernels.Quant, buf: &buffer{ptr: 4096}, q: &quantRows{rows: &buffer{ptr: 8192},
		segs: []quantSeg{{0, 5, kernels.QuantQ4_K}, {5, 12, kernels.QuantQ6_K}}}}
	v, err := b.Rows(w, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	vt := v.(*Tensor)
	if !vt.HasBlocks() || vt.q.rowOff != 4 || fmt.Sprint(vt.q.segs) != fmt.Sprint([]quantSeg{{0, 1, kernels.QuantQ4_K}, {1, 4, kernels.QuantQ6_K}}) {
		t.Fatalf("rows [1, 2): row offset %d, segments %v", vt.q.rowOff, vt.q.segs)
	}
	if a := vt.quantArg(); a.rows != 8192+8*4 || a.data != 4096 {
		t.Fatalf("rows [1, 2): table at %#x, data at %#x", a.rows, a.data)
	}
	if a := vt.quantArg(); a.format != 0 {
		t.Fatalf("rows [1, 2) of two formats: format %d, want 0 (read per row)", a.format)
	}
	if v0, _ := b.Rows(w, 0, 1); int(v0.(*Tensor).quantArg().format) != int(kernels.QuantQ4_K) {
		t.Fatalf("rows [0, 1), all Q4_K: format %d, want %d", v0.(*Tensor).quantArg().format, kernels.QuantQ4_K)
	}
	flat, err := b.Reshape(v, 4, 256)
	if err != nil || !flat.(*Tensor).HasBlocks() || flat.(*Tensor).q.rowOff != 4 {
		t.Fatalf("reshape to [4, 256]: %v, %v", flat, err)
	}
	if _, err := b.Reshape(w, 3, 8, 128); !errors.Is(err, kernels.ErrShape) {
		t.Fatalf("reshape changing the rows' length: %v, want ErrShape", err)
	}
	if got := vt.quantBytes(); got != 144+3*210 {
		t.Fatalf("view bytes %d, want %d", got, 144+3*210)
	}
}

// gemvUnitDot is quant.cu's GEMV arithmetic for one column, transcribed:
// the units of the column's row read at the offsets of di_qf_*::load and
// combined as di_qf_*::dot combines them (float64 here; the test compares
// within rounding). It checks the kernels' unit geometry, which the
// device layout test does not reach.
func gemvUnitDot(data, table []byte, r, k int, x []float32) float64 {
	desc := binary.LittleEndian.Uint64(table[8*r:])
	typ := kernels.QuantType(desc >> 56)
	row := data[desc&(1<<56-1):]
	half := func(b []byte) float64 { return float64(kernels.F16ToF32(binary.LittleEndian.Uint16(b))) }
	f := quantFormats[typ]
	nb := k / f.block
	word := func(b []byte, i int) uint32 { return binary.LittleEndian.Uint32(b[4*i:]) }
	bytesOf := func(v uint32) [4]float64 {
		return [4]float64{float64(v & 0xff), float64(v >> 8 & 0xff), float64(v >> 16 & 0xff), float64(v >> 24)}
	}
	scaleMin := func(j int, q []byte) (float64, float64) {
		if j < 4 {
			return float64(q[j] & 63), float64(q[j+4] & 63)
		}
		return float64(q[j+4]&0xf | (q[j-4]>>6)<<4), float64(q[j+4]>>4 | (q[j]>>6)<<4)
	}
	var acc float64
	switch typ {
	case kernels.QuantQ8_0, kernels.QuantQ4_0:
		for u := range k / 32 {
			var q [32]float64
			if typ == kernels.QuantQ8_0 {
				for i := range 8 {
					v := bytesOf(word(row[32*u:], i) ^ 0x80808080)
					for e := range 4 {
						q[4*i+e] = v[e] - 128
					}
				}
			} else {
				for i := range 4 {
					w := word(row[16*u:], i)
					lo, hi := bytesOf(w&0x0F0F0F0F), bytesOf(w>>4&0x0F0F0F0F)
					for e := range 4 {
						q[4*i+e], q[16+4*i+e] = lo[e]-8, hi[e]-8
					}
				}
			}
			d := half(row[f.block/32*(f.bytes-2)*nb+2*u:])
			var s float64
			for l := range 32 {
				s += q[l] * float64(x[32*u+l])
			}
			acc += s * d
		}
	case kernels.QuantQ4_K, kernels.QuantQ5_K:
		q5 := typ == kernels.QuantQ5_K
		for u := range k / 32 {
			c, h := u>>1&3, u&1
			blk := row[f.bytes*(u>>3):]
			sc1, m1 := scaleMin(2*c, blk[4:16])
			sc2, m2 := scaleMin(2*c+1, blk[4:16])
			d, dmin := half(blk), half(blk[2:])
			qoff := 16 + 32*c + 16*h
			if q5 {
				qoff = 48 + 32*c + 16*h
			}
			base := 256*(u>>3) + 64*c + 16*h
			for i := range 4 {
				w := word(blk[qoff:], i)
				l5, h5 := w&0x0F0F0F0F, w>>4&0x0F0F0F0F
				if q5 {
					b := word(blk[16+16*h:], i)
					l5 |= (b >> (2 * c) & 0x01010101) << 4
					h5 |= (b >> (2*c + 1) & 0x01010101) << 4
				}
				lo, hi := bytesOf(l5), bytesOf(h5)
				for e := range 4 {
					acc += (d*sc1*lo[e] - dmin*m1) * float64(x[base+4*i+e])
					acc += (d*sc2*hi[e] - dmin*m2) * float64(x[base+32+4*i+e])
				}
			}
		}
	case kernels.QuantQ6_K:
		for u := range k / 64 {
			blk, n, lh := u>>2, u>>1&1, u&1
			body := row[208*blk:]
			d := half(row[208*nb+2*blk:])
			base := 256*blk + 128*n + 16*lh
			for g := range 4 {
				ds := d * float64(int8(body[192+8*n+lh+2*g]))
				var s float64
				for i := range 4 {
					a, b, hh := word(body[64*n+16*lh:], i), word(body[64*n+32+16*lh:], i), word(body[128+32*n+16*lh:], i)
					var v uint32
					switch g {
					case 0:
						v = a&0x0F0F0F0F | (hh&0x03030303)<<4
					case 1:
						v = b&0x0F0F0F0F | (hh>>2&0x03030303)<<4
					case 2:
						v = a>>4&0x0F0F0F0F | (hh>>4&0x03030303)<<4
					default:
						v = b>>4&0x0F0F0F0F | (hh>>6&0x03030303)<<4
					}
					q := bytesOf(v)
					for e := range 4 {
						s += (q[e] - 32) * float64(x[base+32*g+4*i+e])
					}
				}
				acc += s * ds
			}
		}
	}
	return acc
}

// TestQuantGEMVGeometry: the GEMV's units, transcribed (gemvUnitDot),
// cover every weight of a row once with its own activation: the dot
// products agree with x times ggml's dequantized row to float64 rounding.
func TestQuantGEMVGeometry(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		types []kernels.QuantType
		rows  []int
		k     int
	}{
		{[]kernels.QuantType{kernels.QuantQ8_0}, []int{3}, 96},
		{[]kernels.QuantType{kernels.QuantQ4_0}, []int{3}, 160},
		{[]kernels.QuantType{kernels.QuantQ4_K, kernels.QuantQ5_K, kernels.QuantQ6_K}, []int{2, 2, 2}, 512},
	} {
		n := 0
		for _, rr := range c.rows {
			n += rr
		}
		w, deq := randQuantWeight(r, []int{n, c.k}, c.types, c.rows, 1)
		data, table, _, err := packQuant(w)
		if err != nil {
			t.Fatal(err)
		}
		x := randVals(r, c.k, 1)
		for row := range n {
			var want, abs float64
			for j := range c.k {
				p := float64(deq[row*c.k+j]) * float64(x[j])
				want += p
				abs += math.Abs(p)
			}
			if got := gemvUnitDot(data, table, row, c.k, x); math.Abs(got-want) > 1e-6*abs {
				t.Fatalf("%v k=%d row %d: units give %v, x . dequantized row %v", c.types, c.k, row, got, want)
			}
		}
	}
}
