// Package weights reads Hugging Face model directories: config.json and
// safetensors weights, either one model.safetensors or the sharded
// model.safetensors.index.json with its shards.
//
// Files are memory-mapped read-only and tensors alias the mapping: opening a
// checkpoint costs one header parse per file and no copy of the weights, so a
// model of any size opens in milliseconds and pages in as the forward pass
// touches it. A Tensor's Data is valid until the Checkpoint (or File) that
// produced it is closed.
//
// Every error names the file, the tensor and what was expected, and wraps one
// of the sentinels below so callers can test it with errors.Is.
package weights

import "errors"

// Sentinel errors. Errors returned by this package wrap one of these (and, for
// I/O failures, the underlying *fs.PathError as well).
var (
	// ErrConfig: config.json is missing, is not valid JSON, or holds a value
	// of the wrong type or out of range.
	ErrConfig = errors.New("bad config")
	// ErrFormat: a safetensors file is truncated or its header is malformed
	// (length beyond the file, bad JSON, data offsets out of range or
	// overlapping, byte size not matching shape x dtype).
	ErrFormat = errors.New("bad safetensors file")
	// ErrNoWeights: the directory holds neither model.safetensors nor
	// model.safetensors.index.json.
	ErrNoWeights = errors.New("no safetensors weights")
	// ErrMissingShard: the index names a shard file that is absent, or a
	// tensor that its shard does not hold.
	ErrMissingShard = errors.New("missing shard")
	// ErrNotFound: the requested tensor is not in the checkpoint.
	ErrNotFound = errors.New("tensor not found")
	// ErrShape: a tensor's shape differs from the expected one.
	ErrShape = errors.New("wrong shape")
	// ErrDType: a dtype this package does not know, or a conversion the
	// tensor's dtype does not allow.
	ErrDType = errors.New("unsupported dtype")
	// ErrMisaligned: a zero-copy view was asked of data whose address is not
	// aligned for the element type.
	ErrMisaligned = errors.New("misaligned tensor data")
	// ErrClosed: the file or checkpoint was closed.
	ErrClosed = errors.New("closed")
)
