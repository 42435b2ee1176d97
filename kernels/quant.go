package kernels

import "fmt"

// Block-quantized weights in llama.cpp's (ggml's) formats, as GGUF files
// store them: each matrix row is a run of fixed-size blocks that hold a few
// scales and small integers. A backend that computes with them implements
// QuantWeighter, and the tensors it returns (dtype Quant) are accepted as
// weights by Linear, Logits, Embedding, MoE and MLAAttention. Other
// backends have no such tensors; models check for QuantWeighter before
// they build one and refuse the weights by name otherwise.

// QuantType is a ggml block format, numbered as ggml numbers it (enum
// ggml_type), so a GGUF tensor type converts directly.
type QuantType uint32

// The formats a QuantWeighter may compute with.
const (
	QuantQ4_0 QuantType = 2
	QuantQ8_0 QuantType = 8
	QuantQ4_K QuantType = 12
	QuantQ5_K QuantType = 13
	QuantQ6_K QuantType = 14
)

// String is the ggml name of t ("Q4_K").
func (t QuantType) String() string {
	switch t {
	case QuantQ4_0:
		return "Q4_0"
	case QuantQ8_0:
		return "Q8_0"
	case QuantQ4_K:
		return "Q4_K"
	case QuantQ5_K:
		return "Q5_K"
	case QuantQ6_K:
		return "Q6_K"
	}
	return fmt.Sprintf("QuantType(%d)", uint32(t))
}

// QuantPart is a run of matrix rows stored in one format: Rows rows of k
// weights (k the weight's last dimension), each row k/blockSize blocks,
// Data the rows one after the other.
type QuantPart struct {
	Type QuantType
	Rows int
	Data []byte
}

// QuantWeight is a block-quantized weight in host memory: the matrix [rows,
// k] that Shape flattens to (k its last dimension), whose rows are the
// parts' rows in order. Fusing weights of different formats (llama.cpp's
// Q4_K_M keeps some layers' v projections in Q6_K beside Q4_K q and k)
// gives several parts.
type QuantWeight struct {
	Shape []int // [n, k] or [experts, n, k]
	Parts []QuantPart
}

// QuantWeighter is implemented by backends that compute with block-quantized
// weights: they keep the blocks as stored and dequantize them in the
// kernels' inner loops.
type QuantWeighter interface {
	// QuantWeight copies w into backend memory and returns a weight tensor
	// of dtype Quant and shape w.Shape, or an error wrapping ErrShape (rows
	// or bytes that do not match the shape) or ErrDType (a format the
	// backend does not compute with). Rows and Reshape (keeping the last
	// dimension) of it are weights too. Cost: one copy of the parts' bytes.
	QuantWeight(w QuantWeight) (Tensor, error)
}

// BlockWeight is implemented by tensor types that can hold a QuantWeight;
// HasBlocks reports whether this one does. The argument checks accept a
// Quant weight only when it does.
type BlockWeight interface {
	HasBlocks() bool
}
