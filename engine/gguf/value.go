package gguf

import (
	"fmt"
	"math"
)

// ValueType is the type tag of a metadata value (enum gguf_type).
type ValueType uint32

const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("value_type(%d)", uint32(t))
}

// size is the encoded size of a scalar of type t; 0 for string, array and
// unknown types.
func (t ValueType) size() int {
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		return 1
	case ValueUint16, ValueInt16:
		return 2
	case ValueUint32, ValueInt32, ValueFloat32:
		return 4
	case ValueUint64, ValueInt64, ValueFloat64:
		return 8
	}
	return 0
}

// Value is one metadata value. A scalar holds uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64 or float64; an array
// holds a slice of one of those ([]string for strings). Arrays of arrays are
// refused, as llama.cpp does. The accessors convert between the integer
// types where the value fits and report ok = false otherwise.
type Value struct {
	v any
}

// Uint8, Int8, ... wrap a Go value as a metadata value of that type.
func Uint8(x uint8) Value     { return Value{x} }
func Int8(x int8) Value       { return Value{x} }
func Uint16(x uint16) Value   { return Value{x} }
func Int16(x int16) Value     { return Value{x} }
func Uint32(x uint32) Value   { return Value{x} }
func Int32(x int32) Value     { return Value{x} }
func Float32(x float32) Value { return Value{x} }
func Bool(x bool) Value       { return Value{x} }
func String(x string) Value   { return Value{x} }
func Uint64(x uint64) Value   { return Value{x} }
func Int64(x int64) Value     { return Value{x} }
func Float64(x float64) Value { return Value{x} }

// Array wraps a slice of one of the scalar Go types ([]uint8 ... []float64,
// []bool, []string) as an array value. It panics on any other type.
func Array(slice any) Value {
	if _, ok := arrayElemType(slice); !ok {
		panic(fmt.Sprintf("gguf: Array of %T", slice))
	}
	return Value{slice}
}

func scalarType(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return ValueUint8, true
	case int8:
		return ValueInt8, true
	case uint16:
		return ValueUint16, true
	case int16:
		return ValueInt16, true
	case uint32:
		return ValueUint32, true
	case int32:
		return ValueInt32, true
	case float32:
		return ValueFloat32, true
	case bool:
		return ValueBool, true
	case string:
		return ValueString, true
	case uint64:
		return ValueUint64, true
	case int64:
		return ValueInt64, true
	case float64:
		return ValueFloat64, true
	}
	return 0, false
}

func arrayElemType(v any) (ValueType, bool) {
	switch v.(type) {
	case []uint8:
		return ValueUint8, true
	case []int8:
		return ValueInt8, true
	case []uint16:
		return ValueUint16, true
	case []int16:
		return ValueInt16, true
	case []uint32:
		return ValueUint32, true
	case []int32:
		return ValueInt32, true
	case []float32:
		return ValueFloat32, true
	case []bool:
		return ValueBool, true
	case []string:
		return ValueString, true
	case []uint64:
		return ValueUint64, true
	case []int64:
		return ValueInt64, true
	case []float64:
		return ValueFloat64, true
	}
	return 0, false
}

// Type is the value's type tag (ValueArray for arrays).
func (v Value) Type() ValueType {
	if t, ok := scalarType(v.v); ok {
		return t
	}
	return ValueArray
}

// ElemType is an array's element type; ok is false for a scalar.
func (v Value) ElemType() (ValueType, bool) { return arrayElemType(v.v) }

// Any returns the Go value: a scalar or a slice.
func (v Value) Any() any { return v.v }

// Len is an array's length, or -1 for a scalar.
func (v Value) Len() int {
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	}
	return -1
}

// Int returns an integer scalar as int64; ok is false for other types and
// for a uint64 above math.MaxInt64.
func (v Value) Int() (int64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

// Float returns a float or integer scalar as float64.
func (v Value) Float() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	return 0, false
}

// Bool returns a bool scalar.
func (v Value) Bool() (bool, bool) { b, ok := v.v.(bool); return b, ok }

// String returns a string scalar; ok is false for other types.
func (v Value) String() (string, bool) { s, ok := v.v.(string); return s, ok }

// Strings returns a string array (not a copy).
func (v Value) Strings() ([]string, bool) { s, ok := v.v.([]string); return s, ok }

// Ints returns an integer array as int64s (a copy); ok is false for other
// arrays and when a uint64 element exceeds math.MaxInt64.
func (v Value) Ints() ([]int64, bool) {
	n := v.Len()
	if n < 0 {
		return nil, false
	}
	out := make([]int64, n)
	for i := range n {
		x, ok := v.index(i).Int()
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// Floats returns a float or integer array as float64s (a copy).
func (v Value) Floats() ([]float64, bool) {
	n := v.Len()
	if n < 0 {
		return nil, false
	}
	out := make([]float64, n)
	for i := range n {
		x, ok := v.index(i).Float()
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// index returns element i of an array as a scalar Value.
func (v Value) index(i int) Value {
	switch a := v.v.(type) {
	case []uint8:
		return Value{a[i]}
	case []int8:
		return Value{a[i]}
	case []uint16:
		return Value{a[i]}
	case []int16:
		return Value{a[i]}
	case []uint32:
		return Value{a[i]}
	case []int32:
		return Value{a[i]}
	case []float32:
		return Value{a[i]}
	case []bool:
		return Value{a[i]}
	case []string:
		return Value{a[i]}
	case []uint64:
		return Value{a[i]}
	case []int64:
		return Value{a[i]}
	case []float64:
		return Value{a[i]}
	}
	return Value{}
}
