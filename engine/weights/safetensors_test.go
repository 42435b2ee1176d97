package weights

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestOpenFileReadsEveryDType(t *testing.T) {
	path := filepath.Join(t.TempDir(), "all.safetensors")
	writeFile(t, path, encodeSafetensors(t, []testTensor{
		{"f32", "F32", []int{2, 2}, f32Bytes(1, -2, 3.5, 0)},
		{"bf16", "BF16", []int{3}, u16Bytes(0x3f80, 0xc000, 0x3fc0)},       // 1, -2, 1.5
		{"f16", "F16", []int{4}, u16Bytes(0x3c00, 0xc000, 0x0001, 0x7c00)}, // 1, -2, 2^-24, +Inf
		{"i32", "I32", []int{2}, i32Bytes(-7, 1<<30)},
		{"i64", "I64", []int{2}, i64Bytes(-1, 1<<40)},
		{"u8", "U8", []int{3}, []byte{0, 7, 255}},
		{"mask", "BOOL", []int{2}, []byte{1, 0}},
		{"scalar", "F32", []int{}, f32Bytes(42)},
		{"empty", "F32", []int{0, 4}, nil},
	}, map[string]string{"format": "pt"}))

	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if got, want := f.Names(), []string{"bf16", "empty", "f16", "f32", "i32", "i64", "mask", "scalar", "u8"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	if got := f.Metadata()["format"]; got != "pt" {
		t.Errorf("Metadata()[format] = %q, want pt", got)
	}
	floats := []struct {
		name  string
		dtype DType
		shape []int
		want  []float32
	}{
		{"f32", F32, []int{2, 2}, []float32{1, -2, 3.5, 0}},
		{"bf16", BF16, []int{3}, []float32{1, -2, 1.5}},
		{"f16", F16, []int{4}, []float32{1, -2, 1.0 / (1 << 24), float32(math.Inf(1))}},
		{"i32", I32, []int{2}, []float32{-7, 1 << 30}},
		{"u8", U8, []int{3}, []float32{0, 7, 255}},
		{"mask", Bool, []int{2}, []float32{1, 0}},
		{"scalar", F32, []int{}, []float32{42}},
		{"empty", F32, []int{0, 4}, []float32{}},
	}
	for _, tc := range floats {
		tensor, err := f.Tensor(tc.name)
		if err != nil {
			t.Fatalf("Tensor(%q): %v", tc.name, err)
		}
		if tensor.DType != tc.dtype || !slices.Equal(tensor.Shape, tc.shape) || tensor.Name != tc.name || tensor.File != path {
			t.Errorf("Tensor(%q) = %s %v name %q file %q, want %s %v", tc.name, tensor.DType, tensor.Shape,
				tensor.Name, tensor.File, tc.dtype, tc.shape)
		}
		if tensor.NumElements() != len(tc.want) {
			t.Errorf("%s: NumElements() = %d, want %d", tc.name, tensor.NumElements(), len(tc.want))
		}
		if got := tensor.Float32s(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Float32s() = %v, want %v", tc.name, got, tc.want)
		}
	}

	ints := []struct {
		name string
		want []int
	}{
		{"i32", []int{-7, 1 << 30}},
		{"i64", []int{-1, 1 << 40}},
		{"u8", []int{0, 7, 255}},
		{"mask", []int{1, 0}},
	}
	for _, tc := range ints {
		tensor, _ := f.Tensor(tc.name)
		got, err := tensor.Ints()
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: Ints() = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	bf, _ := f.Tensor("bf16")
	if _, err := bf.Ints(); !errors.Is(err, ErrDType) {
		t.Errorf("Ints() of BF16: err = %v, want ErrDType", err)
	}

	// The first tensor starts right after the 8-byte-padded header, so the
	// zero-copy views are aligned.
	ft, _ := f.Tensor("f32")
	view, err := ft.AsFloat32()
	if err != nil || !slices.Equal(view, []float32{1, -2, 3.5, 0}) {
		t.Errorf("AsFloat32() = %v, %v", view, err)
	}
	if _, err := bf.AsFloat32(); !errors.Is(err, ErrDType) {
		t.Errorf("AsFloat32() of BF16: err = %v, want ErrDType", err)
	}
	if _, err := ft.AsUint16(); !errors.Is(err, ErrDType) {
		t.Errorf("AsUint16() of F32: err = %v, want ErrDType", err)
	}
}

func TestAsUint16Views(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.safetensors")
	writeFile(t, path, encodeSafetensors(t, []testTensor{
		{"a", "BF16", []int{1}, u16Bytes(0x3f80)},
		{"b", "F32", []int{1}, f32Bytes(1)}, // starts 2 bytes in: misaligned for float32
	}, nil))
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, _ := f.Tensor("a")
	if v, err := a.AsUint16(); err != nil || !slices.Equal(v, []uint16{0x3f80}) {
		t.Errorf("AsUint16() = %v, %v", v, err)
	}
	b, _ := f.Tensor("b")
	if _, err := b.AsFloat32(); !errors.Is(err, ErrMisaligned) {
		t.Errorf("AsFloat32() of misaligned data: err = %v, want ErrMisaligned", err)
	}
	if got := b.Float32s(); !slices.Equal(got, []float32{1}) {
		t.Errorf("Float32s() of misaligned data = %v, want [1]", got)
	}
}

func TestHalfConversions(t *testing.T) {
	tests := []struct {
		name string
		f    func(uint16) float32
		in   uint16
		want float32
	}{
		{"f16 one", F16ToFloat32, 0x3c00, 1},
		{"f16 max", F16ToFloat32, 0x7bff, 65504},
		{"f16 min normal", F16ToFloat32, 0x0400, 1.0 / (1 << 14)},
		{"f16 largest subnormal", F16ToFloat32, 0x03ff, 1023.0 / (1 << 24)},
		{"f16 negative subnormal", F16ToFloat32, 0x8001, -1.0 / (1 << 24)},
		{"f16 -inf", F16ToFloat32, 0xfc00, float32(math.Inf(-1))},
		{"f16 third", F16ToFloat32, 0x3555, 0.333251953125},
		{"bf16 pi", BF16ToFloat32, 0x4049, 3.140625},
		{"bf16 -0.5", BF16ToFloat32, 0xbf00, -0.5},
	}
	for _, tc := range tests {
		if got := tc.f(tc.in); got != tc.want {
			t.Errorf("%s: %#04x -> %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
	if got := F16ToFloat32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("f16 NaN -> %v", got)
	}
	if got := F16ToFloat32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("f16 -0 -> %v", got)
	}
}

func TestOpenFileErrors(t *testing.T) {
	valid := encodeSafetensors(t, []testTensor{
		{"w", "F32", []int{2, 3}, f32Bytes(1, 2, 3, 4, 5, 6)},
	}, nil)
	entry := func(dtype string, shape []int, begin, end int) map[string]any {
		return map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int{begin, end}}
	}
	tests := []struct {
		name  string
		data  []byte
		is    error
		wants []string // substrings of the message besides the file path
	}{
		{"empty file", nil, ErrFormat, []string{"truncated", "0 bytes"}},
		{"shorter than length prefix", []byte{1, 2, 3, 4, 5}, ErrFormat, []string{"truncated", "5 bytes"}},
		{"truncated data", valid[:len(valid)-4], ErrFormat, []string{`tensor "w"`, "out of range", "truncated"}},
		{"header length beyond file", func() []byte {
			b := slices.Clone(valid)
			b[0], b[1] = 0xff, 0xff
			return b
		}(), ErrFormat, []string{"header length 65535", "beyond file size"}},
		{"header not JSON", encodeHeaderBytes([]byte(`{"w": {`), nil), ErrFormat, []string{"not a JSON object"}},
		{"header is a list", encodeHeaderBytes([]byte(`[1, 2]`), nil), ErrFormat, []string{"not a JSON object"}},
		{"metadata not strings", encodeRaw(t, map[string]any{"__metadata__": map[string]any{"n": 1}}, nil),
			ErrFormat, []string{"__metadata__"}},
		{"entry not an object", encodeRaw(t, map[string]any{"w": 3}, nil), ErrFormat, []string{`tensor "w"`, "bad header entry"}},
		{"end beyond data", encodeRaw(t, map[string]any{"w": entry("F32", []int{2}, 0, 16)}, make([]byte, 8)),
			ErrFormat, []string{`tensor "w"`, "[0, 16]", "8 data bytes"}},
		{"begin after end", encodeRaw(t, map[string]any{"w": entry("F32", []int{1}, 8, 4)}, make([]byte, 8)),
			ErrFormat, []string{`tensor "w"`, "[8, 4]", "out of range"}},
		{"negative offset", encodeRaw(t, map[string]any{"w": entry("F32", []int{1}, -4, 0)}, make([]byte, 8)),
			ErrFormat, []string{`tensor "w"`, "out of range"}},
		{"one offset", encodeRaw(t, map[string]any{"w": map[string]any{"dtype": "F32", "shape": []int{1}, "data_offsets": []int{0}}}, make([]byte, 4)),
			ErrFormat, []string{`tensor "w"`, "want [begin, end]"}},
		{"overlap", encodeRaw(t, map[string]any{
			"a": entry("F32", []int{2}, 0, 8),
			"b": entry("F32", []int{2}, 4, 12),
		}, make([]byte, 12)), ErrFormat, []string{`"a" [0, 8]`, `"b" [4, 12]`, "overlap"}},
		{"size not matching shape", encodeRaw(t, map[string]any{"w": entry("BF16", []int{2, 3}, 0, 8)}, make([]byte, 8)),
			ErrFormat, []string{`tensor "w"`, "8 data bytes, want 12", "[2 3]", "BF16"}},
		{"negative dim", encodeRaw(t, map[string]any{"w": entry("F32", []int{-1}, 0, 0)}, nil),
			ErrFormat, []string{`tensor "w"`, "negative dimension"}},
		{"unsupported dtype", encodeRaw(t, map[string]any{"w": entry("F8_E8M0", []int{4}, 0, 4)}, make([]byte, 4)),
			ErrDType, []string{`tensor "w"`, `"F8_E8M0"`}},
	}
	dir := t.TempDir()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "case"+string(rune('a'+i))+".safetensors")
			writeFile(t, path, tc.data)
			f, err := OpenFile(path)
			if err == nil {
				f.Close()
				t.Fatal("OpenFile succeeded, want an error")
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("err = %v, want errors.Is %v", err, tc.is)
			}
			for _, want := range append([]string{path}, tc.wants...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to mention %q", err, want)
				}
			}
		})
	}
}

func TestOpenFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.safetensors")
	_, err := OpenFile(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("OpenFile(missing) err = %v, want one naming %s", err, path)
	}
}

func TestFileLookupsAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	writeFile(t, path, encodeSafetensors(t, []testTensor{
		{"w", "F32", []int{2, 3}, f32Bytes(1, 2, 3, 4, 5, 6)},
	}, nil))
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Has("w") || f.Has("v") {
		t.Errorf("Has(w), Has(v) = %v, %v; want true, false", f.Has("w"), f.Has("v"))
	}
	if _, err := f.Expect("w", 2, 3); err != nil {
		t.Errorf("Expect(w, 2, 3): %v", err)
	}
	_, err = f.Expect("w", 3, 2)
	if !errors.Is(err, ErrShape) {
		t.Errorf("Expect(w, 3, 2) err = %v, want ErrShape", err)
	}
	for _, want := range []string{path, `tensor "w"`, "shape [2 3]", "want [3 2]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Expect err = %v, want it to mention %q", err, want)
		}
	}
	_, err = f.Tensor("v")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `tensor "v"`) || !strings.Contains(err.Error(), path) {
		t.Errorf("Tensor(v) err = %v, want ErrNotFound naming file and tensor", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := f.Tensor("w"); !errors.Is(err, ErrClosed) {
		t.Errorf("Tensor after Close: err = %v, want ErrClosed", err)
	}
}

func TestParseDType(t *testing.T) {
	for _, d := range []DType{F32, BF16, F16, I32, I64, U8, Bool} {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
	}
	sizes := map[DType]int{F32: 4, BF16: 2, F16: 2, I32: 4, I64: 8, U8: 1, Bool: 1, DTypeInvalid: 0}
	for d, want := range sizes {
		if d.Size() != want {
			t.Errorf("%s.Size() = %d, want %d", d, d.Size(), want)
		}
	}
	if _, err := ParseDType("F64"); !errors.Is(err, ErrDType) {
		t.Errorf("ParseDType(F64) err = %v, want ErrDType", err)
	}
}
