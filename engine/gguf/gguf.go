// Package gguf reads and writes GGUF files, the single-file model format of
// llama.cpp: a header, typed metadata key/values, tensor infos and the
// aligned tensor data.
//
// Parse reads a file held in memory (Open maps it read-only), so tensor
// data is never copied: File.TensorData returns a sub-slice of the mapping.
// Every count, length, offset and dimension the file claims is checked
// against the bytes it actually has before anything is allocated, so a
// truncated or lying file is an error naming the key or tensor (wrapping
// ErrFormat), never a panic or an allocation larger than a small multiple
// of the file size.
//
// Versions 2 and 3 (little-endian) are read; Writer writes version 3.
// Config maps the hyper-parameters of the llama, qwen2, qwen3 and
// deepseek2 architectures to a Hugging Face config.json.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"slices"
	"sort"
)

// ErrFormat is wrapped by every error about a malformed file.
var ErrFormat = errors.New("gguf: malformed file")

// Magic is the four bytes a GGUF file starts with.
const Magic = "GGUF"

// DefaultAlignment is the tensor data alignment when general.alignment is
// absent.
const DefaultAlignment = 32

// maxDims is the most dimensions a ggml tensor has (GGML_MAX_DIMS).
const maxDims = 4

// KeyValue is one metadata entry.
type KeyValue struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor. Dims are in ggml order: Dims[0] is the
// innermost (contiguous) dimension, so a [n][k] nn.Linear weight has Dims
// {k, n}; Shape gives the row-major order.
type TensorInfo struct {
	Name string
	Type GGMLType
	Dims []int64
	// Offset is the byte offset of the data from File.DataOffset.
	Offset int64
	// Size is the number of bytes of the data.
	Size int64
}

// Shape returns the dimensions outermost first (the safetensors order).
func (t *TensorInfo) Shape() []int64 {
	s := slices.Clone(t.Dims)
	slices.Reverse(s)
	return s
}

// NumElements is the product of Dims.
func (t *TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed GGUF file. It is immutable and safe for concurrent use;
// the byte slices it returns alias the file and must not be written.
type File struct {
	Version   uint32
	Alignment int
	// DataOffset is the file offset of the tensor data section.
	DataOffset int64
	KV         []KeyValue
	Tensors    []TensorInfo

	kvIndex     map[string]int
	tensorIndex map[string]int
	data        []byte
	unmap       func([]byte) error
}

// Open maps the file at path read-only and parses it. Close releases the
// mapping; slices from TensorData are invalid after it. Cost: one pass over
// the header and metadata (vocabularies included); tensor data is not read.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if st.Size() > math.MaxInt {
		return nil, fmt.Errorf("gguf: %s: %d bytes: %w", path, st.Size(), ErrFormat)
	}
	data, unmap, err := mmapFile(fh, int(st.Size()))
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		unmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.unmap = unmap
	return f, nil
}

// Close releases the mapping of a file from Open; it does nothing for one
// from Parse.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap(f.data)
	f.unmap, f.data = nil, nil
	return err
}

// Get returns the value of a metadata key.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// Tensor returns the info of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the named tensor's info and its bytes, a slice of the
// file (no copy; read-only). Cost: O(1).
func (f *File) TensorData(name string) (*TensorInfo, []byte, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("gguf: no tensor %q", name)
	}
	if f.data == nil && t.Size > 0 {
		return nil, nil, fmt.Errorf("gguf: tensor %q: file closed", name)
	}
	start := f.DataOffset + t.Offset
	return t, f.data[start : start+t.Size : start+t.Size], nil
}

// Parse parses a whole GGUF file held in data. The File keeps data (tensor
// bytes are sub-slices of it) and the caller must not modify it. Cost: one
// pass over the header, metadata and tensor infos; allocations are bounded
// by a small multiple of len(data).
func Parse(data []byte) (*File, error) {
	r := &reader{data: data}
	magic, err := r.bytes("magic", 4)
	if err != nil {
		return nil, err
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("gguf: magic %q, want %q: %w", magic, Magic, ErrFormat)
	}
	f := &File{data: data, kvIndex: map[string]int{}, tensorIndex: map[string]int{}}
	if f.Version, err = r.u32("version"); err != nil {
		return nil, err
	}
	switch {
	case f.Version == 2 || f.Version == 3:
	case f.Version&0xffff == 0 && bits.ReverseBytes32(f.Version) <= 3:
		return nil, fmt.Errorf("gguf: big-endian file (version %d byte-swapped) is not supported: %w", bits.ReverseBytes32(f.Version), ErrFormat)
	default:
		return nil, fmt.Errorf("gguf: version %d, want 2 or 3: %w", f.Version, ErrFormat)
	}
	numTensors, err := r.u64("tensor count")
	if err != nil {
		return nil, err
	}
	numKV, err := r.u64("metadata count")
	if err != nil {
		return nil, err
	}
	// A key/value takes at least 12 bytes (empty key, type, a 1-byte value
	// or an empty string's 8-byte length), a tensor info at least 24.
	if numKV > uint64(r.left())/12 {
		return nil, fmt.Errorf("gguf: %d metadata entries cannot fit in %d bytes: %w", numKV, r.left(), ErrFormat)
	}
	f.KV = make([]KeyValue, 0, numKV)
	for i := range numKV {
		key, err := r.str(fmt.Sprintf("key of metadata entry %d", i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, fmt.Errorf("gguf: duplicate metadata key %q: %w", key, ErrFormat)
		}
		v, err := r.value(key)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KeyValue{key, v})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.Get("general.alignment"); ok {
		a, isU32 := v.Any().(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("gguf: key %q: %v (%s), want a power of two of type uint32: %w", "general.alignment", v.Any(), v.Type(), ErrFormat)
		}
		f.Alignment = int(a)
	}
	if numTensors > uint64(r.left())/24 {
		return nil, fmt.Errorf("gguf: %d tensors cannot fit in %d bytes: %w", numTensors, r.left(), ErrFormat)
	}
	f.Tensors = make([]TensorInfo, 0, numTensors)
	for i := range numTensors {
		t, err := r.tensorInfo(i)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tensorIndex[t.Name]; dup {
			return nil, fmt.Errorf("gguf: duplicate tensor %q: %w", t.Name, ErrFormat)
		}
		f.tensorIndex[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	// The data section starts at the next multiple of the alignment.
	f.DataOffset = int64(alignUp(r.off, f.Alignment))
	if err := f.checkTensorData(); err != nil {
		return nil, err
	}
	return f, nil
}

// checkTensorData checks that every tensor's data is aligned, inside the
// file and disjoint from the others.
func (f *File) checkTensorData() error {
	avail := int64(len(f.data)) - f.DataOffset
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Offset%int64(f.Alignment) != 0 {
			return fmt.Errorf("gguf: tensor %q: data offset %d is not a multiple of the alignment %d: %w", t.Name, t.Offset, f.Alignment, ErrFormat)
		}
		if avail < 0 || t.Offset > avail || t.Size > avail-t.Offset {
			return fmt.Errorf("gguf: tensor %q: data [%d, +%d) past the end of the file (%d data bytes): %w", t.Name, t.Offset, t.Size, max(avail, 0), ErrFormat)
		}
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	for i := 1; i < len(order); i++ {
		prev, cur := &f.Tensors[order[i-1]], &f.Tensors[order[i]]
		if prev.Offset+prev.Size > cur.Offset {
			return fmt.Errorf("gguf: tensor %q overlaps tensor %q: %w", cur.Name, prev.Name, ErrFormat)
		}
	}
	return nil
}

func alignUp(off, a int) int { return (off + a - 1) / a * a }

// reader reads little-endian fields from data, failing with an error that
// names what it was reading when the data runs out.
type reader struct {
	data []byte
	off  int
}

func (r *reader) left() int { return len(r.data) - r.off }

func (r *reader) bytes(what string, n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, fmt.Errorf("gguf: %s: %d bytes needed at offset %d, %d left: %w", what, n, r.off, r.left(), ErrFormat)
	}
	b := r.data[r.off : r.off+n]
	r.off += n
	return b, nil
}

func (r *reader) u32(what string) (uint32, error) {
	b, err := r.bytes(what, 4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64(what string) (uint64, error) {
	b, err := r.bytes(what, 8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// str reads a gguf_string: a uint64 length and that many bytes.
func (r *reader) str(what string) (string, error) {
	n, err := r.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(r.left()) {
		return "", fmt.Errorf("gguf: %s: string of %d bytes at offset %d, %d left: %w", what, n, r.off, r.left(), ErrFormat)
	}
	b, _ := r.bytes(what, int(n))
	return string(b), nil
}

// value reads the type tag and value of metadata key.
func (r *reader) value(key string) (Value, error) {
	typ, err := r.u32(fmt.Sprintf("key %q: type", key))
	if err != nil {
		return Value{}, err
	}
	if ValueType(typ) != ValueArray {
		return r.scalar(key, ValueType(typ))
	}
	et, err := r.u32(fmt.Sprintf("key %q: array element type", key))
	if err != nil {
		return Value{}, err
	}
	n, err := r.u64(fmt.Sprintf("key %q: array length", key))
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	minSize := elem.size()
	switch {
	case elem == ValueString:
		minSize = 8
	case elem == ValueArray:
		return Value{}, fmt.Errorf("gguf: key %q: arrays of arrays are not supported: %w", key, ErrFormat)
	case minSize == 0:
		return Value{}, fmt.Errorf("gguf: key %q: unknown array element type %d: %w", key, et, ErrFormat)
	}
	if n > uint64(r.left()/minSize) {
		return Value{}, fmt.Errorf("gguf: key %q: array of %d %s cannot fit in the %d bytes left: %w", key, n, elem, r.left(), ErrFormat)
	}
	count := int(n)
	if elem == ValueString {
		out := make([]string, count)
		for i := range out {
			if out[i], err = r.str(fmt.Sprintf("key %q: element %d", key, i)); err != nil {
				return Value{}, err
			}
		}
		return Value{out}, nil
	}
	raw, _ := r.bytes(key, count*minSize)
	return decodeArray(key, elem, raw, count)
}

// decodeArray decodes count fixed-size elements of type elem from raw.
func decodeArray(key string, elem ValueType, raw []byte, count int) (Value, error) {
	le := binary.LittleEndian
	switch elem {
	case ValueUint8:
		return Value{slices.Clone(raw)}, nil
	case ValueInt8:
		out := make([]int8, count)
		for i := range out {
			out[i] = int8(raw[i])
		}
		return Value{out}, nil
	case ValueBool:
		out := make([]bool, count)
		for i := range out {
			if raw[i] > 1 {
				return Value{}, fmt.Errorf("gguf: key %q: element %d: bool byte %d: %w", key, i, raw[i], ErrFormat)
			}
			out[i] = raw[i] == 1
		}
		return Value{out}, nil
	case ValueUint16:
		out := make([]uint16, count)
		for i := range out {
			out[i] = le.Uint16(raw[2*i:])
		}
		return Value{out}, nil
	case ValueInt16:
		out := make([]int16, count)
		for i := range out {
			out[i] = int16(le.Uint16(raw[2*i:]))
		}
		return Value{out}, nil
	case ValueUint32:
		out := make([]uint32, count)
		for i := range out {
			out[i] = le.Uint32(raw[4*i:])
		}
		return Value{out}, nil
	case ValueInt32:
		out := make([]int32, count)
		for i := range out {
			out[i] = int32(le.Uint32(raw[4*i:]))
		}
		return Value{out}, nil
	case ValueFloat32:
		out := make([]float32, count)
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
		return Value{out}, nil
	case ValueUint64:
		out := make([]uint64, count)
		for i := range out {
			out[i] = le.Uint64(raw[8*i:])
		}
		return Value{out}, nil
	case ValueInt64:
		out := make([]int64, count)
		for i := range out {
			out[i] = int64(le.Uint64(raw[8*i:]))
		}
		return Value{out}, nil
	case ValueFloat64:
		out := make([]float64, count)
		for i := range out {
			out[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
		return Value{out}, nil
	}
	return Value{}, fmt.Errorf("gguf: key %q: unknown array element type %d: %w", key, uint32(elem), ErrFormat)
}

// scalar reads one value of a scalar type.
func (r *reader) scalar(key string, typ ValueType) (Value, error) {
	what := fmt.Sprintf("key %q: %s value", key, typ)
	if typ == ValueString {
		s, err := r.str(what)
		return Value{s}, err
	}
	size := typ.size()
	if size == 0 {
		return Value{}, fmt.Errorf("gguf: key %q: unknown value type %d: %w", key, uint32(typ), ErrFormat)
	}
	b, err := r.bytes(what, size)
	if err != nil {
		return Value{}, err
	}
	v, err := decodeArray(key, typ, b, 1)
	if err != nil {
		return Value{}, err
	}
	return v.index(0), nil
}

// tensorInfo reads the i-th tensor info and checks its type and dims.
func (r *reader) tensorInfo(i uint64) (TensorInfo, error) {
	var t TensorInfo
	name, err := r.str(fmt.Sprintf("name of tensor %d", i))
	if err != nil {
		return t, err
	}
	t.Name = name
	what := func(field string) string { return fmt.Sprintf("tensor %q: %s", name, field) }
	nd, err := r.u32(what("dimension count"))
	if err != nil {
		return t, err
	}
	if nd == 0 || nd > maxDims {
		return t, fmt.Errorf("gguf: tensor %q: %d dimensions, want 1 to %d: %w", name, nd, maxDims, ErrFormat)
	}
	t.Dims = make([]int64, nd)
	for d := range t.Dims {
		v, err := r.u64(what(fmt.Sprintf("dimension %d", d)))
		if err != nil {
			return t, err
		}
		if v == 0 || v > math.MaxInt64 {
			return t, fmt.Errorf("gguf: tensor %q: dimension %d is %d: %w", name, d, v, ErrFormat)
		}
		t.Dims[d] = int64(v)
	}
	typ, err := r.u32(what("type"))
	if err != nil {
		return t, err
	}
	t.Type = GGMLType(typ)
	if !t.Type.Known() {
		return t, fmt.Errorf("gguf: tensor %q: unknown ggml type %d: %w", name, typ, ErrFormat)
	}
	off, err := r.u64(what("data offset"))
	if err != nil {
		return t, err
	}
	if off > math.MaxInt64 {
		return t, fmt.Errorf("gguf: tensor %q: data offset %d: %w", name, off, ErrFormat)
	}
	t.Offset = int64(off)
	bs := int64(t.Type.BlockSize())
	if t.Dims[0]%bs != 0 {
		return t, fmt.Errorf("gguf: tensor %q: innermost dimension %d is not a multiple of the %s block size %d: %w", name, t.Dims[0], t.Type, bs, ErrFormat)
	}
	// Size = (Dims[0]/bs)*typeSize * Dims[1] * ..., checked for overflow.
	size := t.Dims[0] / bs * int64(t.Type.TypeSize())
	for _, d := range t.Dims[1:] {
		hi, lo := bits.Mul64(uint64(size), uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return t, fmt.Errorf("gguf: tensor %q: dimensions %v overflow: %w", name, t.Dims, ErrFormat)
		}
		size = int64(lo)
	}
	if size/int64(t.Type.TypeSize()) > math.MaxInt64/bs {
		return t, fmt.Errorf("gguf: tensor %q: dimensions %v overflow: %w", name, t.Dims, ErrFormat)
	}
	t.Size = size
	return t, nil
}
