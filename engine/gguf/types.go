package gguf

import "fmt"

// GGMLType is a tensor's element type as ggml numbers it (enum ggml_type).
type GGMLType uint32

// The ggml types this package knows the block layout of. Ids missing here
// (4, 5, 31-33, 36-38) were removed from ggml and are refused.
const (
	TypeF32     GGMLType = 0
	TypeF16     GGMLType = 1
	TypeQ4_0    GGMLType = 2
	TypeQ4_1    GGMLType = 3
	TypeQ5_0    GGMLType = 6
	TypeQ5_1    GGMLType = 7
	TypeQ8_0    GGMLType = 8
	TypeQ8_1    GGMLType = 9
	TypeQ2_K    GGMLType = 10
	TypeQ3_K    GGMLType = 11
	TypeQ4_K    GGMLType = 12
	TypeQ5_K    GGMLType = 13
	TypeQ6_K    GGMLType = 14
	TypeQ8_K    GGMLType = 15
	TypeIQ2_XXS GGMLType = 16
	TypeIQ2_XS  GGMLType = 17
	TypeIQ3_XXS GGMLType = 18
	TypeIQ1_S   GGMLType = 19
	TypeIQ4_NL  GGMLType = 20
	TypeIQ3_S   GGMLType = 21
	TypeIQ2_S   GGMLType = 22
	TypeIQ4_XS  GGMLType = 23
	TypeI8      GGMLType = 24
	TypeI16     GGMLType = 25
	TypeI32     GGMLType = 26
	TypeI64     GGMLType = 27
	TypeF64     GGMLType = 28
	TypeIQ1_M   GGMLType = 29
	TypeBF16    GGMLType = 30
	TypeTQ1_0   GGMLType = 34
	TypeTQ2_0   GGMLType = 35
	TypeMXFP4   GGMLType = 39
)

// typeTraits is one type's block layout: BlockSize elements stored in
// TypeSize bytes (1 and the element size for the plain types).
type typeTraits struct {
	name      string
	blockSize int
	typeSize  int
}

var traits = map[GGMLType]typeTraits{
	TypeF32: {"F32", 1, 4}, TypeF16: {"F16", 1, 2}, TypeBF16: {"BF16", 1, 2},
	TypeF64: {"F64", 1, 8}, TypeI8: {"I8", 1, 1}, TypeI16: {"I16", 1, 2},
	TypeI32: {"I32", 1, 4}, TypeI64: {"I64", 1, 8},
	TypeQ4_0: {"Q4_0", 32, 18}, TypeQ4_1: {"Q4_1", 32, 20},
	TypeQ5_0: {"Q5_0", 32, 22}, TypeQ5_1: {"Q5_1", 32, 24},
	TypeQ8_0: {"Q8_0", 32, 34}, TypeQ8_1: {"Q8_1", 32, 36},
	TypeQ2_K: {"Q2_K", 256, 84}, TypeQ3_K: {"Q3_K", 256, 110},
	TypeQ4_K: {"Q4_K", 256, 144}, TypeQ5_K: {"Q5_K", 256, 176},
	TypeQ6_K: {"Q6_K", 256, 210}, TypeQ8_K: {"Q8_K", 256, 292},
	TypeIQ2_XXS: {"IQ2_XXS", 256, 66}, TypeIQ2_XS: {"IQ2_XS", 256, 74},
	TypeIQ3_XXS: {"IQ3_XXS", 256, 98}, TypeIQ1_S: {"IQ1_S", 256, 50},
	TypeIQ4_NL: {"IQ4_NL", 32, 18}, TypeIQ3_S: {"IQ3_S", 256, 110},
	TypeIQ2_S: {"IQ2_S", 256, 82}, TypeIQ4_XS: {"IQ4_XS", 256, 136},
	TypeIQ1_M: {"IQ1_M", 256, 56}, TypeTQ1_0: {"TQ1_0", 256, 54},
	TypeTQ2_0: {"TQ2_0", 256, 66}, TypeMXFP4: {"MXFP4", 32, 17},
}

// Known reports whether this package knows t's block layout.
func (t GGMLType) Known() bool { _, ok := traits[t]; return ok }

// String is ggml's name of the type ("Q4_K"), or "type(N)" when unknown.
func (t GGMLType) String() string {
	if tr, ok := traits[t]; ok {
		return tr.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements one block holds (1 for F32, 32 for
// Q8_0, 256 for the K-quants); 0 for an unknown type.
func (t GGMLType) BlockSize() int { return traits[t].blockSize }

// TypeSize is the number of bytes one block takes; 0 for an unknown type.
func (t GGMLType) TypeSize() int { return traits[t].typeSize }

// RowSize returns the bytes of a row of n elements, or an error when n is
// not a whole number of blocks or the type is unknown.
func (t GGMLType) RowSize(n int) (int, error) {
	tr, ok := traits[t]
	if !ok {
		return 0, fmt.Errorf("gguf: unknown ggml type %d", uint32(t))
	}
	if n < 0 || n%tr.blockSize != 0 {
		return 0, fmt.Errorf("gguf: %s row of %d elements is not a whole number of %d-element blocks", tr.name, n, tr.blockSize)
	}
	return n / tr.blockSize * tr.typeSize, nil
}

// FileType is general.file_type (enum llama_ftype): the mix of types a
// quantization preset writes. Only the values this package's writer uses
// are named.
type FileType uint32

const (
	FileTypeAllF32       FileType = 0
	FileTypeMostlyF16    FileType = 1
	FileTypeMostlyQ4_0   FileType = 2
	FileTypeMostlyQ8_0   FileType = 7
	FileTypeMostlyQ4_K_M FileType = 15
	FileTypeMostlyQ5_K_M FileType = 17
	FileTypeMostlyQ6_K   FileType = 18
	FileTypeMostlyBF16   FileType = 32
)
