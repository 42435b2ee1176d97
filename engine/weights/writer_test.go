package weights

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
)

func TestWriteFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ref.safetensors")
	tensors := []Tensor{
		I32Tensor("ids", []int{3}, []int32{5, -1, 7}),
		F32Tensor("logits", []int{3, 2}, []float32{0.5, -1, 2, 3, 4, 5}),
		{Name: "half", DType: BF16, Shape: []int{1}, Data: u16Bytes(0x3f80)},
	}
	if err := WriteFile(path, tensors, map[string]string{"seed": "1"}); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata()["seed"] != "1" {
		t.Errorf("metadata = %v", f.Metadata())
	}
	ids, err := f.Expect("ids", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ids.Ints(); err != nil || !slices.Equal(got, []int{5, -1, 7}) {
		t.Errorf("ids = %v, %v", got, err)
	}
	logits, err := f.Expect("logits", 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := logits.Float32s(); !slices.Equal(got, []float32{0.5, -1, 2, 3, 4, 5}) {
		t.Errorf("logits = %v", got)
	}
	half, _ := f.Tensor("half")
	if got := half.Float32s(); !slices.Equal(got, []float32{1}) {
		t.Errorf("half = %v", got)
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []Tensor
		is      error
	}{
		{"size mismatch", []Tensor{{Name: "a", DType: F32, Shape: []int{2}, Data: make([]byte, 4)}}, ErrFormat},
		{"repeated name", []Tensor{F32Tensor("a", []int{1}, []float32{1}), F32Tensor("a", []int{1}, []float32{2})}, ErrFormat},
		{"reserved name", []Tensor{F32Tensor("__metadata__", []int{1}, []float32{1})}, ErrFormat},
		{"invalid dtype", []Tensor{{Name: "a", Shape: []int{1}, Data: make([]byte, 4)}}, ErrDType},
		{"negative dim", []Tensor{{Name: "a", DType: U8, Shape: []int{-1}}}, ErrFormat},
	}
	for _, tc := range tests {
		if _, err := Encode(tc.tensors, nil); !errors.Is(err, tc.is) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.is)
		}
	}
}
