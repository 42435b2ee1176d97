// Package models holds the architectures, each written once over kernels.Ops
// and registered by its config.json "architectures" name: the Llama family
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM),
// its sparse MoE variants (Qwen3MoeForCausalLM, MixtralForCausalLM) and
// DeepSeek V2/V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, with the
// V3 multi-token-prediction layers loaded as a separate MTP module) and
// Gemma 3's text model (Gemma3ForCausalLM, its sliding-window layers in
// per-sequence ring buffers: KVCacheSpec.RingLayers).
//
// A model reads its weights once (Registry.New or Load), copying them into
// backend memory in their stored dtype, and is then read-only: Forward may run
// concurrently on different KV caches. The KV cache is paged from the start:
// the caller (the engine's block manager) owns block allocation and describes
// each step with a ForwardBatch (flat token ids, positions, cu_seqlens_q,
// seqlens_k, block tables and the slot mapping of the new tokens).
//
// A step is Forward (all layers, returning the last hidden state of every
// token) followed by ComputeLogits (final norm and LM head) on the rows that
// sample.
package models

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/gguf"
	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// Sentinel errors.
var (
	// ErrUnknownArchitecture: config.json names an architecture no registered
	// constructor builds.
	ErrUnknownArchitecture = errors.New("unknown architecture")
	// ErrWeights: a tensor is missing or has the wrong shape or dtype.
	ErrWeights = errors.New("bad weights")
	// ErrConfig: a config value this architecture cannot run.
	ErrConfig = errors.New("unsupported config")
	// ErrBatch: a ForwardBatch that does not describe a valid step.
	ErrBatch = errors.New("bad batch")
)

// Model is one architecture bound to a backend and its weights.
type Model interface {
	// Architecture is the config.json architectures name the model was built for.
	Architecture() string
	// Config is the parsed config.json.
	Config() *weights.Config
	// KVCacheSpec describes the per-token, per-layer cache the model needs.
	KVCacheSpec() KVCacheSpec
	// NewKVCache allocates numBlocks blocks of blockSize tokens for every layer.
	NewKVCache(numBlocks, blockSize int) (*KVCache, error)
	// Forward runs all layers on the batch's tokens, writing their keys and
	// values into cache at the batch's slot mapping, and returns the hidden
	// states after the last layer, before the final norm [num_tokens,
	// hidden_size] (a new tensor; what MTP and other drafters consume).
	// Cost: one read of every weight plus attention over each sequence's history.
	Forward(ctx context.Context, cache *KVCache, b *ForwardBatch) (kernels.Tensor, error)
	// ComputeLogits applies the final norm and the LM head to the given rows
	// of Forward's output (rows I32 [R]; nil: every row) and returns F32
	// logits [R, vocab_size]. Cost: 2*R*vocab*hidden flops.
	ComputeLogits(hidden, rows kernels.Tensor) (kernels.Tensor, error)
	// MTP returns the multi-token-prediction module, or nil when the checkpoint
	// has none.
	MTP() *MTP
}

// Options tune model construction.
type Options struct {
	// MaxModelLen bounds positions (the RoPE table's rows). Default:
	// config max_position_embeddings.
	MaxModelLen int
	// Logger receives load-time warnings (nil: slog.Default()), such as a
	// checkpoint whose config announces MTP layers it does not hold.
	Logger *slog.Logger
	// Quantization "fp8" quantizes the float weights of every linear layer
	// at load to FP8 E4M3 in blocks of 128x128 with scale = amax/448
	// (DeepSeek-V3's recipe; embeddings, LM head and MoE routers stay as
	// stored), for backends with FP8 kernels (kernels.FP8Weighter). ""
	// keeps the checkpoint's dtypes; an FP8 checkpoint loads as FP8 either
	// way.
	Quantization string
	// SlidingWindowPaged keeps the keys and values of sliding-window
	// layers in paged blocks with the full layers' (a debug switch)
	// instead of per-sequence ring buffers of window tokens in the state
	// slots (KVCacheSpec.RingLayers), for models that use rings.
	SlidingWindowPaged bool
	// GGUF, when not nil, is the already parsed GGUF file that Registry.Load
	// was given the path of: it is used instead of parsing the file again
	// (the caller keeps it open until Load returns).
	GGUF *gguf.File
}

// logger returns o.Logger or slog.Default().
func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// KVLayout is the kind of per-token cache entry.
type KVLayout uint8

const (
	// KVLayoutGQA caches a key and a value of Width = num_kv_heads*head_dim
	// elements per token per layer (K and V tensors).
	KVLayoutGQA KVLayout = iota + 1
	// KVLayoutMLA caches one compressed latent of Width = kv_lora_rank +
	// qk_rope_head_dim elements per token per layer (K tensors only).
	KVLayoutMLA
)

func (l KVLayout) String() string {
	switch l {
	case KVLayoutGQA:
		return "gqa"
	case KVLayoutMLA:
		return "mla"
	}
	return fmt.Sprintf("KVLayout(%d)", uint8(l))
}

// KVCacheSpec is what the engine needs to size a cache.
type KVCacheSpec struct {
	Layout    KVLayout
	NumLayers int // layers with paged blocks
	Width     int // elements per token per layer per cached tensor
	DType     kernels.DType
	// RingLayers are the model's sliding-window layers whose keys and
	// values live in per-sequence ring buffers of RingWindow tokens (GQA,
	// Width and DType as the paged layers), one per state slot, instead of
	// paged blocks: they hold a window, not the context. 0: none.
	RingLayers int
	RingWindow int
}

// BytesPerStateSlot is the ring buffers' footprint of one state slot (one
// sequence) across all ring layers: RingWindow keys and values per layer.
func (s KVCacheSpec) BytesPerStateSlot() int {
	return s.RingLayers * s.RingWindow * s.BytesPerTokenPerLayer()
}

// BytesPerSequence is the KV footprint of one sequence of numTokens
// tokens: its paged blocks (rounded up to whole blocks) and, with ring
// layers, its state slot.
func (s KVCacheSpec) BytesPerSequence(numTokens, blockSize int) int {
	blocks := (numTokens + blockSize - 1) / blockSize
	return blocks*s.BytesPerBlock(blockSize) + s.BytesPerStateSlot()
}

// BytesPerTokenPerLayer is the cache footprint of one token in one layer.
func (s KVCacheSpec) BytesPerTokenPerLayer() int {
	n := s.Width * s.DType.Size()
	if s.Layout == KVLayoutGQA {
		n *= 2
	}
	return n
}

// BytesPerBlock is the footprint of one block of blockSize tokens across all layers.
func (s KVCacheSpec) BytesPerBlock(blockSize int) int {
	return s.BytesPerTokenPerLayer() * s.NumLayers * blockSize
}

// KVCache is a paged cache: per layer, tensors [num_blocks, block_size, Width].
// Block b, offset o holds the token at slot b*BlockSize+o.
type KVCache struct {
	Spec      KVCacheSpec
	NumBlocks int
	BlockSize int
	K         []kernels.Tensor // per layer: keys (GQA) or latents (MLA)
	V         []kernels.Tensor // per layer: values (GQA); nil for MLA
	// NumSlots state slots back RingK and RingV (AllocStateSlots): per
	// ring layer, [NumSlots, RingWindow, Width]; the sequence in slot s
	// keeps the key of position p at row s*RingWindow + p%RingWindow.
	NumSlots     int
	RingK, RingV []kernels.Tensor
}

// AllocStateSlots allocates the ring buffers of numSlots state slots for
// the spec's ring layers (nothing when it has none). Cost: numSlots *
// Spec.BytesPerStateSlot() bytes.
func (c *KVCache) AllocStateSlots(ops kernels.Ops, numSlots int) error {
	if c.Spec.RingLayers == 0 {
		return nil
	}
	if numSlots <= 0 || c.Spec.RingWindow <= 0 || c.Spec.Layout != KVLayoutGQA {
		return fmt.Errorf("models: %d state slots of ring window %d (%s): %w", numSlots, c.Spec.RingWindow, c.Spec.Layout, ErrConfig)
	}
	c.NumSlots, c.RingK, c.RingV = numSlots, nil, nil
	for range c.Spec.RingLayers {
		for _, dst := range []*[]kernels.Tensor{&c.RingK, &c.RingV} {
			t, err := kernels.AllocCache(ops, c.Spec.DType, numSlots, c.Spec.RingWindow, c.Spec.Width)
			if err != nil {
				return fmt.Errorf("models: state slots: %w", err)
			}
			*dst = append(*dst, t)
		}
	}
	return nil
}

// rectCopier is a backend's device-to-device copy of a 2-D tensor into the
// top-left corner of another (the CUDA backend's CopyRect).
type rectCopier interface {
	CopyRect(dst, src kernels.Tensor) error
}

// CopyStateSlots copies the state of slot src[i] into slot dst[i] in every
// ring layer (a forked sequence starts from its parent's state): on the
// device where the backend has a device copy (CopyRect), else through the
// host. Cost: 2 * RingLayers * RingWindow * Width elements a copy.
func (c *KVCache) CopyStateSlots(ops kernels.Ops, src, dst []int) error {
	if len(src) != len(dst) {
		return fmt.Errorf("models: state copies: %d sources, %d destinations: %w", len(src), len(dst), ErrBatch)
	}
	var buf []byte
	for _, layer := range [][]kernels.Tensor{c.RingK, c.RingV} {
		for _, t := range layer {
			for i := range src {
				if src[i] < 0 || src[i] >= c.NumSlots || dst[i] < 0 || dst[i] >= c.NumSlots {
					return fmt.Errorf("models: state copy %d -> %d of %d slots: %w", src[i], dst[i], c.NumSlots, ErrBatch)
				}
				if src[i] == dst[i] {
					continue
				}
				from, err := ops.Rows(t, src[i], src[i]+1)
				if err != nil {
					return err
				}
				to, err := ops.Rows(t, dst[i], dst[i]+1)
				if err != nil {
					return err
				}
				if rc, ok := ops.(rectCopier); ok {
					if err := copySlotOnDevice(ops, rc, to, from); err != nil {
						return err
					}
					continue
				}
				n := kernels.NumElements(from) * from.DType().Size()
				if cap(buf) < n {
					buf = make([]byte, n)
				}
				if err := ops.Download(buf[:n], from); err != nil {
					return err
				}
				if err := ops.Upload(to, buf[:n], from.DType()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// copySlotOnDevice copies one state slot's view [1, window, width] into
// another on the device.
func copySlotOnDevice(ops kernels.Ops, rc rectCopier, to, from kernels.Tensor) error {
	sh := from.Shape()
	f, err := ops.Reshape(from, sh[1], sh[2])
	if err != nil {
		return err
	}
	d, err := ops.Reshape(to, sh[1], sh[2])
	if err != nil {
		return err
	}
	return rc.CopyRect(d, f)
}

// NewKVCache allocates a zeroed cache for spec on ops (kernels.AllocCache).
func NewKVCache(ops kernels.Ops, spec KVCacheSpec, numBlocks, blockSize int) (*KVCache, error) {
	if numBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("models: kv cache of %d blocks of %d tokens: %w", numBlocks, blockSize, ErrConfig)
	}
	c := &KVCache{Spec: spec, NumBlocks: numBlocks, BlockSize: blockSize}
	for range spec.NumLayers {
		k, err := kernels.AllocCache(ops, spec.DType, numBlocks, blockSize, spec.Width)
		if err != nil {
			return nil, fmt.Errorf("models: kv cache: %w", err)
		}
		c.K = append(c.K, k)
		if spec.Layout == KVLayoutGQA {
			v, err := kernels.AllocCache(ops, spec.DType, numBlocks, blockSize, spec.Width)
			if err != nil {
				return nil, fmt.Errorf("models: kv cache: %w", err)
			}
			c.V = append(c.V, v)
		}
	}
	return c, nil
}

func (c *KVCache) check(spec KVCacheSpec) error {
	if c == nil || c.Spec != spec || len(c.K) != spec.NumLayers {
		return fmt.Errorf("models: kv cache does not match the model's spec %+v: %w", spec, ErrBatch)
	}
	if spec.RingLayers > 0 && len(c.RingK) != spec.RingLayers {
		return fmt.Errorf("models: kv cache has no state slots for the model's %d ring layers (KVCache.AllocStateSlots): %w", spec.RingLayers, ErrBatch)
	}
	return nil
}

// ForwardBatch is one step's input in backend memory. Sequences are laid out
// back to back: sequence s owns token rows Attn.CuSeqlensQ[s]..[s+1].
type ForwardBatch struct {
	NumTokens int
	InputIDs  kernels.Tensor // I32 [NumTokens]
	Positions kernels.Tensor // I32 [NumTokens]
	Attn      kernels.AttentionMetadata
	// StateSlots (I32 [Attn.NumSeqs]) and RingSlotMapping (I32
	// [NumTokens], kernels.RingSlots) are set when the batch was laid out
	// for ring buffers (HostBatch.RingWindow > 0).
	StateSlots      kernels.Tensor
	RingSlotMapping kernels.Tensor
}

// HostBatch is the host-side description of one step, as the engine's prepare
// stage builds it. See kernels.AttentionMetadata for the attention fields.
type HostBatch struct {
	InputIDs    []int32
	Positions   []int32
	CuSeqlensQ  []int32   // [num_seqs+1]
	SeqlensK    []int32   // [num_seqs]: cached + new tokens
	BlockTables [][]int32 // per sequence, logical -> physical block
	SlotMapping []int32   // [num_tokens]
	BlockSize   int
	// RingWindow > 0 lays the batch out for a model with ring layers
	// (KVCacheSpec.RingWindow): StateSlots holds each sequence's state
	// slot, and Upload adds the ring slot mapping.
	RingWindow int
	StateSlots []int32 // [num_seqs]
	// Packed is UploadReusing's host scratch: the arrays packed for the
	// one copy, kept here (and grown) for the next call. Nothing reads it
	// after the call.
	Packed []int32
}

// AddSequence appends the new tokens of one sequence whose first numCached
// tokens are already in the cache; blockTable must cover numCached+len(ids)
// tokens. Positions are numCached.., slots follow the block table.
func (h *HostBatch) AddSequence(ids []int32, numCached int, blockTable []int32) {
	if len(h.CuSeqlensQ) == 0 {
		h.CuSeqlensQ = []int32{0}
	}
	for i, id := range ids {
		pos := numCached + i
		h.InputIDs = append(h.InputIDs, id)
		h.Positions = append(h.Positions, int32(pos))
		slot := int32(-1)
		if b := pos / h.BlockSize; b < len(blockTable) {
			slot = blockTable[b]*int32(h.BlockSize) + int32(pos%h.BlockSize)
		}
		h.SlotMapping = append(h.SlotMapping, slot)
	}
	h.CuSeqlensQ = append(h.CuSeqlensQ, h.CuSeqlensQ[len(h.CuSeqlensQ)-1]+int32(len(ids)))
	h.SeqlensK = append(h.SeqlensK, int32(numCached+len(ids)))
	h.BlockTables = append(h.BlockTables, blockTable)
}

// Validate checks the batch's internal consistency: lengths, monotonic
// cu_seqlens, key counts, block tables covering every key, slots matching
// the block tables. numBlocks > 0 also bounds block ids.
func (h *HostBatch) Validate(numBlocks int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("models: batch: "+format+": %w", append(args, ErrBatch)...)
	}
	n := len(h.SeqlensK)
	t := len(h.InputIDs)
	switch {
	case h.BlockSize <= 0:
		return bad("block size %d", h.BlockSize)
	case n == 0 || t == 0:
		return bad("empty batch")
	case len(h.CuSeqlensQ) != n+1 || len(h.BlockTables) != n:
		return bad("%d sequences but %d cu_seqlens_q and %d block tables", n, len(h.CuSeqlensQ), len(h.BlockTables))
	case len(h.Positions) != t || len(h.SlotMapping) != t:
		return bad("%d tokens but %d positions and %d slots", t, len(h.Positions), len(h.SlotMapping))
	case h.CuSeqlensQ[0] != 0 || int(h.CuSeqlensQ[n]) != t:
		return bad("cu_seqlens_q %v does not span %d tokens", h.CuSeqlensQ, t)
	}
	// A table shared by consecutive sequences (a decode's rows) is checked
	// once, as far as the longest of them needs.
	var checked []int32
	for s := range n {
		lo, hi, k := int(h.CuSeqlensQ[s]), int(h.CuSeqlensQ[s+1]), int(h.SeqlensK[s])
		if hi < lo || k < hi-lo {
			return bad("sequence %d: %d queries, %d keys", s, hi-lo, k)
		}
		need := (k + h.BlockSize - 1) / h.BlockSize
		table := h.BlockTables[s]
		if len(table) < need {
			return bad("sequence %d: %d keys need %d blocks, table has %d", s, k, need, len(table))
		}
		from := 0
		if len(checked) > 0 && need > 0 && &checked[0] == &table[0] {
			from = min(len(checked), need)
		}
		for j := from; j < need; j++ {
			if blk := table[j]; blk < 0 || (numBlocks > 0 && int(blk) >= numBlocks) {
				return bad("sequence %d: block_tables[%d] = %d, cache has %d blocks", s, j, blk, numBlocks)
			}
		}
		if need > len(checked) || from == 0 {
			checked = table[:need]
		}
		for i := lo; i < hi; i++ {
			pos := int(h.Positions[i])
			if want := k - hi + i; pos != want {
				return bad("sequence %d: token %d at position %d, want %d", s, i, pos, want)
			}
			want := h.BlockTables[s][pos/h.BlockSize]*int32(h.BlockSize) + int32(pos%h.BlockSize)
			if h.SlotMapping[i] != want {
				return bad("sequence %d: token %d: slot %d, block table gives %d", s, i, h.SlotMapping[i], want)
			}
		}
	}
	return nil
}

// Upload validates h and copies it into backend memory.
func (h *HostBatch) Upload(ops kernels.Ops, numBlocks int) (*ForwardBatch, error) {
	b, _, err := h.UploadWith(ops, numBlocks)
	return b, err
}

// UploadWith is Upload that also sends the caller's own I32 arrays (a
// step's other per-row metadata) in the same copy: it returns one
// one-dimensional tensor per array of extra, views of the same buffer.
func (h *HostBatch) UploadWith(ops kernels.Ops, numBlocks int, extra ...[]int32) (*ForwardBatch, []kernels.Tensor, error) {
	return h.UploadReusing(ops, numBlocks, nil, extra...)
}

// UploadReusing is UploadWith into *buf (an I32 vector) when it is large
// enough, else into a new buffer with room to spare, which it leaves in
// *buf; buf nil allocates the batch's own buffer. The caller hands over a
// buffer that nothing reads any more, in the backend's stream order: a
// batch uploaded before into it is overwritten. The batch's metadata
// carries a host copy of the query offsets (HostCuSeqlensQ) when a
// sequence has more than one row. Cost: no allocation once *buf has grown
// to the steps' size, but that copy's (4 bytes a sequence).
func (h *HostBatch) UploadReusing(ops kernels.Ops, numBlocks int, buf *kernels.Tensor, extra ...[]int32) (*ForwardBatch, []kernels.Tensor, error) {
	if err := h.Validate(numBlocks); err != nil {
		return nil, nil, err
	}
	n, t := len(h.SeqlensK), len(h.InputIDs)
	maxBlocks, maxQ, maxK := 1, 0, 0
	for s := range n {
		maxBlocks = max(maxBlocks, len(h.BlockTables[s]))
		maxQ = max(maxQ, int(h.CuSeqlensQ[s+1]-h.CuSeqlensQ[s]))
		maxK = max(maxK, int(h.SeqlensK[s]))
	}
	b := &ForwardBatch{NumTokens: t, Attn: kernels.AttentionMetadata{
		NumSeqs: n, NumTokens: t, MaxSeqlenQ: maxQ, MaxSeqlenK: maxK, BlockSize: h.BlockSize}}
	if maxQ > 1 {
		// A host copy of the query offsets, for backends that size a
		// prefill's launches by them (h's arrays may be reused for the
		// next step while this one's ops are still being queued).
		b.Attn.HostCuSeqlensQ = slices.Clone(h.CuSeqlensQ)
	}
	// The six arrays (and extra) travel in one host-to-device copy: packed
	// into one I32 buffer, each starting on a 16-byte boundary, and handed
	// out as views of it. Separate copies cost the device a few
	// microseconds each between two steps.
	// The block tables, the largest part, are written straight into the
	// packed buffer (xs nil: n rows of maxBlocks, padded with -1).
	type part struct {
		xs    []int32
		shape []int
		dst   *kernels.Tensor
	}
	parts := []part{
		{h.InputIDs, []int{t}, &b.InputIDs},
		{h.Positions, []int{t}, &b.Positions},
		{h.CuSeqlensQ, []int{n + 1}, &b.Attn.CuSeqlensQ},
		{h.SeqlensK, []int{n}, &b.Attn.SeqlensK},
		{nil, []int{n, maxBlocks}, &b.Attn.BlockTables},
		{h.SlotMapping, []int{t}, &b.Attn.SlotMapping},
	}
	if h.RingWindow > 0 {
		newPerSeq := make([]int32, n)
		for s := range n {
			newPerSeq[s] = h.CuSeqlensQ[s+1] - h.CuSeqlensQ[s]
		}
		parts = append(parts,
			part{h.StateSlots, []int{n}, &b.StateSlots},
			part{kernels.RingSlots(h.StateSlots, h.SeqlensK, newPerSeq, h.RingWindow), []int{t}, &b.RingSlotMapping})
	}
	extras := make([]kernels.Tensor, len(extra))
	for i, xs := range extra {
		parts = append(parts, part{xs, []int{len(xs)}, &extras[i]})
	}
	size := func(p part) int {
		e := 1
		for _, d := range p.shape {
			e *= d
		}
		return e
	}
	offsets, total := make([]int, len(parts)), 0
	for i, p := range parts {
		offsets[i] = total
		total += (size(p) + 3) &^ 3
	}
	// Upload reads packed during the call only, so it is kept for the next.
	h.Packed = slices.Grow(h.Packed[:0], total)[:total]
	packed := h.Packed
	for i, p := range parts {
		if p.xs != nil || size(p) == 0 {
			copy(packed[offsets[i]:], p.xs)
			continue
		}
		tables := packed[offsets[i] : offsets[i]+n*maxBlocks]
		for s, row := range h.BlockTables {
			dst := tables[s*maxBlocks : (s+1)*maxBlocks]
			copy(dst, row)
			for j := len(row); j < maxBlocks; j++ {
				dst[j] = -1
			}
		}
	}
	flat, err := kernels.UploadI32Into(ops, buf, packed)
	if err != nil {
		return nil, nil, fmt.Errorf("models: upload batch: %w", err)
	}
	for i, p := range parts {
		rows, err := ops.Rows(flat, offsets[i], offsets[i]+size(p))
		if err == nil {
			*p.dst, err = ops.Reshape(rows, p.shape...)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("models: upload batch: %w", err)
		}
	}
	return b, extras, nil
}
