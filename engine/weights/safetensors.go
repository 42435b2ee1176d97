package weights

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"sync"
)

// File is one memory-mapped safetensors file: an 8-byte little-endian header
// length, a JSON header mapping tensor names to dtype, shape and byte offsets
// (plus an optional "__metadata__" map of strings), then the tensor bytes.
//
// A File is safe for concurrent use. Tensors returned by it alias the mapping
// and are valid until Close.
type File struct {
	path     string
	metadata map[string]string
	tensors  map[string]Tensor
	names    []string // sorted

	mu     sync.Mutex
	data   []byte // the whole mapping; nil once closed
	unmap  func([]byte) error
	closed bool
}

// headerEntry is one tensor's entry in a safetensors header.
type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// OpenFile memory-maps the safetensors file at path read-only and parses its
// header. Every tensor's dtype, shape and data offsets are checked against the
// file size, so a later Tensor call cannot read out of range. Cost: one mmap
// and one JSON parse of the header; the tensor bytes are not read.
func OpenFile(path string) (*File, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("weights: %s: %w", path, err)
	}
	f, err := parseSafetensors(path, data)
	if err != nil {
		_ = unmap(data)
		return nil, err
	}
	f.data, f.unmap = data, unmap
	return f, nil
}

// parseSafetensors parses the header of a safetensors image held in data.
// Returned tensors alias data.
func parseSafetensors(path string, data []byte) (*File, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("weights: %s: %s: %w", path, fmt.Sprintf(format, args...), ErrFormat)
	}
	if len(data) < 8 {
		return nil, fail("truncated: %d bytes, want at least 8 for the header length", len(data))
	}
	header_len := binary.LittleEndian.Uint64(data[:8])
	if header_len > uint64(len(data)-8) {
		return nil, fail("header length %d beyond file size %d", header_len, len(data))
	}
	header := data[8 : 8+header_len]
	body := data[8+header_len:]

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fail("header is not a JSON object: %v", err)
	}
	f := &File{path: path, tensors: make(map[string]Tensor, len(raw))}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.metadata); err != nil {
				return nil, fail("__metadata__ is not a map of strings: %v", err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fail("tensor %q: bad header entry: %v", name, err)
		}
		dtype, err := ParseDType(e.DType)
		if err != nil {
			return nil, fmt.Errorf("weights: %s: tensor %q: %w", path, name, err)
		}
		shape := make([]int, len(e.Shape))
		numel := int64(1)
		for i, d := range e.Shape {
			if d < 0 {
				return nil, fail("tensor %q: negative dimension in shape %v", name, e.Shape)
			}
			if d > 0 && numel > math.MaxInt64/8/d {
				return nil, fail("tensor %q: shape %v overflows", name, e.Shape)
			}
			numel *= d
			shape[i] = int(d)
		}
		if len(e.DataOffsets) != 2 {
			return nil, fail("tensor %q: data_offsets %v, want [begin, end]", name, e.DataOffsets)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > int64(len(body)) {
			return nil, fail("tensor %q: data_offsets [%d, %d] out of range of the %d data bytes (file truncated?)",
				name, begin, end, len(body))
		}
		if want := numel * int64(dtype.Size()); end-begin != want {
			return nil, fail("tensor %q: %d data bytes, want %d for shape %v of %s",
				name, end-begin, want, shape, dtype)
		}
		f.tensors[name] = Tensor{
			Name:  name,
			DType: dtype,
			Shape: shape,
			Data:  body[begin:end:end],
			File:  path,
		}
		spans = append(spans, span{name, begin, end})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var prev *span
	for i := range spans {
		s := &spans[i]
		if s.begin == s.end {
			continue // empty tensors overlap nothing
		}
		if prev != nil && s.begin < prev.end {
			return nil, fail("tensors %q [%d, %d] and %q [%d, %d] overlap",
				prev.name, prev.begin, prev.end, s.name, s.begin, s.end)
		}
		prev = s
	}
	f.names = make([]string, 0, len(f.tensors))
	for name := range f.tensors {
		f.names = append(f.names, name)
	}
	slices.Sort(f.names)
	return f, nil
}

// Path returns the file's path as given to OpenFile.
func (f *File) Path() string { return f.path }

// Metadata returns the header's "__metadata__" map (nil when absent). The
// caller must not modify it.
func (f *File) Metadata() map[string]string { return f.metadata }

// Names returns the tensor names in sorted order. The caller must not modify
// the slice.
func (f *File) Names() []string { return f.names }

// Has reports whether the file holds a tensor called name.
func (f *File) Has(name string) bool {
	_, ok := f.tensors[name]
	return ok
}

// Tensor returns the tensor called name; its Data aliases the mapping. A
// missing name is an error wrapping ErrNotFound. Cost: a map lookup.
func (f *File) Tensor(name string) (Tensor, error) {
	if err := f.checkOpen(); err != nil {
		return Tensor{}, err
	}
	t, ok := f.tensors[name]
	if !ok {
		return Tensor{}, fmt.Errorf("weights: %s: tensor %q: %w", f.path, name, ErrNotFound)
	}
	return t, nil
}

// Expect returns the tensor called name after checking that its shape is
// exactly shape; a mismatch is an error wrapping ErrShape that names the
// file, the tensor, and both shapes.
func (f *File) Expect(name string, shape ...int) (Tensor, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return Tensor{}, err
	}
	return expectShape(t, shape)
}

func expectShape(t Tensor, shape []int) (Tensor, error) {
	if !slices.Equal(t.Shape, shape) {
		return Tensor{}, fmt.Errorf("weights: %s: tensor %q: shape %v, want %v: %w",
			t.File, t.Name, t.Shape, shape, ErrShape)
	}
	return t, nil
}

func (f *File) checkOpen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("weights: %s: %w", f.path, ErrClosed)
	}
	return nil
}

// Close unmaps the file. Tensors obtained from it must no longer be used:
// reading their Data after Close faults. Closing twice returns nil.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	data := f.data
	f.data = nil
	if data == nil || f.unmap == nil {
		return nil
	}
	if err := f.unmap(data); err != nil {
		return fmt.Errorf("weights: %s: unmap: %w", f.path, err)
	}
	return nil
}

// mapFile maps path read-only, or reads it when it is empty (an empty file
// cannot be mapped; the parser then reports it as truncated).
func mapFile(path string) ([]byte, func([]byte) error, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, nil, err
	}
	if st.IsDir() {
		return nil, nil, fmt.Errorf("is a directory: %w", ErrFormat)
	}
	size := st.Size()
	if size == 0 {
		return []byte{}, func([]byte) error { return nil }, nil
	}
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes too large to map: %w", size, ErrFormat)
	}
	return mmapFile(fh, int(size))
}
