package weights

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// Encode returns a safetensors image of tensors (their Name, DType, Shape and
// Data; File is ignored) in the given order, with metadata as
// "__metadata__" when non-nil. The header is padded with spaces to a multiple
// of 8 bytes, as the reference writer does, so the first tensor is 8-byte
// aligned once mapped. A tensor whose Data length does not match its shape
// and dtype, or a repeated name, is an error. Cost: one copy of all data.
func Encode(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	header := make(map[string]any, len(tensors)+1)
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	offset := 0
	for _, t := range tensors {
		if t.Name == "__metadata__" {
			return nil, fmt.Errorf("weights: encode: tensor name %q is reserved: %w", t.Name, ErrFormat)
		}
		if _, dup := header[t.Name]; dup {
			return nil, fmt.Errorf("weights: encode: tensor %q: repeated: %w", t.Name, ErrFormat)
		}
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("weights: encode: tensor %q: dtype %s: %w", t.Name, t.DType, ErrDType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("weights: encode: tensor %q: negative dimension in shape %v: %w", t.Name, t.Shape, ErrFormat)
			}
		}
		if want := numElements(t.Shape) * t.DType.Size(); len(t.Data) != want {
			return nil, fmt.Errorf("weights: encode: tensor %q: %d data bytes, want %d for shape %v of %s: %w",
				t.Name, len(t.Data), want, t.Shape, t.DType, ErrFormat)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = map[string]any{
			"dtype":        t.DType.String(),
			"shape":        shape,
			"data_offsets": [2]int{offset, offset + len(t.Data)},
		}
		offset += len(t.Data)
	}
	h, err := json.Marshal(header)
	if err != nil {
		return nil, fmt.Errorf("weights: encode: %w", err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := make([]byte, 8, 8+len(h)+offset)
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	for _, t := range tensors {
		out = append(out, t.Data...)
	}
	return out, nil
}

// WriteFile writes Encode(tensors, metadata) to path.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	data, err := Encode(tensors, metadata)
	if err != nil {
		return fmt.Errorf("%w (writing %s)", err, path)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// F32Tensor builds an F32 tensor holding vals (little-endian) with the given
// shape; it is meant for writing test and reference files with WriteFile.
func F32Tensor(name string, shape []int, vals []float32) Tensor {
	data := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, DType: F32, Shape: shape, Data: data}
}

// I32Tensor builds an I32 tensor holding vals with the given shape.
func I32Tensor(name string, shape []int, vals []int32) Tensor {
	data := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(v))
	}
	return Tensor{Name: name, DType: I32, Shape: shape, Data: data}
}
