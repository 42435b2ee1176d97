package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Writer assembles a GGUF version 3 file: metadata in the order set, then
// tensors in the order added, each tensor's data aligned. It keeps the
// tensor data it is given (no copy) until WriteTo.
type Writer struct {
	// Alignment of the tensor data: 0 for DefaultAlignment; written as
	// general.alignment when not the default. A general.alignment set with
	// Set wins.
	Alignment int
	kv        []KeyValue
	kvIndex   map[string]int
	tensors   []writerTensor
	names     map[string]bool
}

type writerTensor struct {
	info TensorInfo
	data []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{kvIndex: map[string]int{}, names: map[string]bool{}}
}

// Set sets a metadata key, replacing an earlier value in place.
func (w *Writer) Set(key string, v Value) {
	if v.v == nil {
		panic(fmt.Sprintf("gguf: Set %q: empty value", key))
	}
	if i, ok := w.kvIndex[key]; ok {
		w.kv[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kv)
	w.kv = append(w.kv, KeyValue{key, v})
}

// AddTensor adds a tensor with dims in ggml order (innermost first) and its
// data, which must be exactly the size the type and dims give.
func (w *Writer) AddTensor(name string, typ GGMLType, dims []int64, data []byte) error {
	if w.names[name] {
		return fmt.Errorf("gguf: tensor %q added twice", name)
	}
	if !typ.Known() || len(dims) == 0 || len(dims) > maxDims {
		return fmt.Errorf("gguf: tensor %q: type %s with %d dims", name, typ, len(dims))
	}
	row, err := typ.RowSize(int(dims[0]))
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	size := int64(row)
	for _, d := range dims[1:] {
		if d <= 0 {
			return fmt.Errorf("gguf: tensor %q: dims %v", name, dims)
		}
		size *= d
	}
	if int64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q: %d bytes, want %d for %s %v", name, len(data), size, typ, dims)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{TensorInfo{Name: name, Type: typ, Dims: append([]int64(nil), dims...), Size: size}, data})
	return nil
}

// WriteTo writes the file. Cost: one pass over the tensor data.
func (w *Writer) WriteTo(dst io.Writer) (int64, error) {
	align := w.Alignment
	if i, ok := w.kvIndex["general.alignment"]; ok {
		a, _ := w.kv[i].Value.v.(uint32)
		align = int(a)
	} else if align == 0 {
		align = DefaultAlignment
	}
	if align <= 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("gguf: alignment %d is not a power of two", align)
	}
	kv := w.kv
	if align != DefaultAlignment {
		if _, ok := w.kvIndex["general.alignment"]; !ok {
			kv = append(kv[:len(kv):len(kv)], KeyValue{"general.alignment", Uint32(uint32(align))})
		}
	}
	cw := &countWriter{w: bufio.NewWriterSize(dst, 1<<20)}
	cw.raw([]byte(Magic))
	cw.u32(3)
	cw.u64(uint64(len(w.tensors)))
	cw.u64(uint64(len(kv)))
	for _, e := range kv {
		cw.str(e.Key)
		cw.value(e.Value)
	}
	var off int64
	for i := range w.tensors {
		t := &w.tensors[i].info
		t.Offset = off
		cw.str(t.Name)
		cw.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			cw.u64(uint64(d))
		}
		cw.u32(uint32(t.Type))
		cw.u64(uint64(off))
		off = int64(alignUp(int(off+t.Size), align))
	}
	cw.pad(align)
	for i := range w.tensors {
		cw.raw(w.tensors[i].data)
		cw.pad(align)
	}
	if cw.err == nil {
		cw.err = cw.w.Flush()
	}
	return cw.n, cw.err
}

// countWriter writes little-endian fields, remembering the first error.
type countWriter struct {
	w   *bufio.Writer
	n   int64
	err error
	buf [8]byte
}

func (c *countWriter) raw(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *countWriter) u8(v uint8)   { c.raw([]byte{v}) }
func (c *countWriter) u16(v uint16) { binary.LittleEndian.PutUint16(c.buf[:], v); c.raw(c.buf[:2]) }
func (c *countWriter) u32(v uint32) { binary.LittleEndian.PutUint32(c.buf[:], v); c.raw(c.buf[:4]) }
func (c *countWriter) u64(v uint64) { binary.LittleEndian.PutUint64(c.buf[:], v); c.raw(c.buf[:8]) }
func (c *countWriter) str(s string) { c.u64(uint64(len(s))); c.raw([]byte(s)) }

func (c *countWriter) pad(align int) {
	if r := int(c.n % int64(align)); r != 0 {
		c.raw(make([]byte, align-r))
	}
}

func (c *countWriter) value(v Value) {
	t := v.Type()
	c.u32(uint32(t))
	if t != ValueArray {
		c.scalar(v.v)
		return
	}
	et, _ := v.ElemType()
	c.u32(uint32(et))
	n := v.Len()
	c.u64(uint64(n))
	for i := range n {
		c.scalar(v.index(i).v)
	}
}

func (c *countWriter) scalar(x any) {
	switch x := x.(type) {
	case uint8:
		c.u8(x)
	case int8:
		c.u8(uint8(x))
	case uint16:
		c.u16(x)
	case int16:
		c.u16(uint16(x))
	case uint32:
		c.u32(x)
	case int32:
		c.u32(uint32(x))
	case float32:
		c.u32(math.Float32bits(x))
	case bool:
		if x {
			c.u8(1)
		} else {
			c.u8(0)
		}
	case string:
		c.str(x)
	case uint64:
		c.u64(x)
	case int64:
		c.u64(uint64(x))
	case float64:
		c.u64(math.Float64bits(x))
	}
}
