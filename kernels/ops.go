// Package kernels defines Ops, the narrow operation interface that models are
// written against, and the types its methods exchange.
//
// A backend (kernels/cpu today, a CUDA backend later) owns tensor memory: a
// Tensor is an opaque handle with a shape and a dtype, created by Ops.Alloc and
// filled by Ops.Upload. Nothing here assumes the memory is addressable from the
// host, so models move data only through Upload and Download.
//
// Each Ops method is one kernel launch or one fused loop, not a tensor algebra.
// Methods validate shapes and dtypes and return an error wrapping ErrShape or
// ErrDType before touching memory; a backend may execute asynchronously, so
// results are only guaranteed visible to the host after Download or Sync.
//
// Conventions shared by all methods:
//   - Matrices are row-major; a "row" is the last dimension. Activations have
//     shape [num_tokens, width] and dtype ActivationDType().
//   - Weights keep their stored dtype (F32, BF16 or F16) and nn.Linear layout
//     [out_features, in_features]; backends convert them per tile, never the
//     whole model up front. Small vectors (norm weights, biases, routing bias)
//     are uploaded in ActivationDType.
//   - Batch invariance: every output row is computed from its own input row (and,
//     for attention, its own sequence's cache) in a fixed reduction order, so a
//     row's result is bit-identical whichever other rows share the call and
//     however the work is split over threads.
//   - out may alias an input only where a method says so.
package kernels

import (
	"errors"
	"fmt"
)

// Sentinel errors; backends wrap them with the operation, the tensors involved
// and what was expected.
var (
	// ErrShape: a tensor's shape does not fit the operation.
	ErrShape = errors.New("shape mismatch")
	// ErrDType: a tensor's dtype is not supported by the operation.
	ErrDType = errors.New("unsupported dtype")
	// ErrForeignTensor: a tensor was created by another backend.
	ErrForeignTensor = errors.New("tensor from another backend")
	// ErrOutOfRange: an index (token id, position, slot, block, row) is outside its table.
	ErrOutOfRange = errors.New("index out of range")
	// ErrClosed: the backend was closed.
	ErrClosed = errors.New("backend closed")
)

// Tensor is a handle to a dense, row-major array in backend memory. Shape must
// not be modified by the caller.
type Tensor interface {
	Shape() []int
	DType() DType
}

// NumElements is the product of t's shape (1 for a scalar shape []).
func NumElements(t Tensor) int {
	n := 1
	for _, d := range t.Shape() {
		n *= d
	}
	return n
}

// Ops is the contract every backend implements. See the package comment for
// the conventions on layouts, dtypes, aliasing and batch invariance. Costs below
// use T = number of tokens (rows) in the call.
type Ops interface {
	// Name identifies the backend and its code path, e.g. "cpu(avx2, 16 threads)".
	Name() string
	// ActivationDType is the dtype of activations, caches and logits inputs
	// (F32 on the CPU backend).
	ActivationDType() DType
	// Close releases the backend's workers and memory; tensors become invalid.
	Close() error

	// Alloc returns a zero-filled tensor. Cost: one allocation.
	Alloc(dtype DType, shape ...int) (Tensor, error)
	// Upload copies host bytes (little-endian, srcDType) into dst, which may be a
	// view; it reads src during the call only (callers may reuse it after). len(src) must be NumElements(dst)*srcDType.Size(). srcDType must equal
	// dst's dtype, except that BF16 and F16 may be widened into an F32 dst.
	Upload(dst Tensor, src []byte, srcDType DType) error
	// Download copies src to the host as little-endian bytes of src's dtype;
	// len(dst) must be NumElements(src)*src.DType().Size(). It waits for all
	// queued work that writes src.
	Download(dst []byte, src Tensor) error
	// Rows is a view of rows [lo, hi) along dimension 0, sharing memory. No copy.
	Rows(t Tensor, lo, hi int) (Tensor, error)
	// Reshape is a view with the same elements and a new shape. No copy.
	Reshape(t Tensor, shape ...int) (Tensor, error)
	// Sync waits until all queued work has finished.
	Sync() error

	// Embedding gathers out[i] = table[ids[i]]. table [vocab, hidden] in its
	// stored dtype, ids I32 [T], out [T, hidden]. An id outside the table is an
	// ErrOutOfRange error on backends that can check it cheaply; callers validate ids.
	// Cost: T*hidden element copies.
	Embedding(out, table, ids Tensor) error
	// RMSNorm: out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight, over the last
	// dimension. x and out [rows, n], weight [n]. out may alias x. Cost: 3 passes over x.
	RMSNorm(out, x, weight Tensor, eps float32) error
	// AddRMSNorm is the fused residual step: residual += x, then
	// out = RMSNorm(residual). residual, x and out [rows, n]. out may alias x.
	AddRMSNorm(out, residual, x, weight Tensor, eps float32) error
	// Linear computes out = x W^T (+ bias): x [T, k], w [n, k] in its stored
	// dtype, bias [n] or nil, out [T, n]. Cost: 2*T*n*k flops, one read of w.
	Linear(out, x, w, bias Tensor) error
	// SiLUMul is the SwiGLU activation: out[i, j] = silu(gateUp[i, j]) * gateUp[i, n+j]
	// with gateUp [T, 2n] (gate columns first) and out [T, n].
	SiLUMul(out, gateUp Tensor) error
	// Add computes out = a + b elementwise; all of one shape. out may alias a or b.
	Add(out, a, b Tensor) error
	// Concat joins rows: out[i] = [a[i], b[i]] with a [T, m], b [T, n], out [T, m+n].
	Concat(out, a, b Tensor) error
	// SplitColumns copies the column blocks of x [T, w_0+w_1+...] into
	// parts[i] [T, w_i], in order: the inverse of Concat for any number of
	// parts (a fused q/k/v projection into its three tensors). Cost: one
	// copy of x.
	SplitColumns(x Tensor, parts ...Tensor) error

	// RoPE rotates x in place by the angles of each row's position. x is
	// [T, NumHeads*HeadSize]; within each head, RotaryDim elements starting at
	// Offset are rotated, the rest pass through. cos and sin are F32
	// [max_positions, RotaryDim/2], built once by the model for its scaling type
	// (attention scaling factors already folded in). positions I32 [T].
	// Cost: T*NumHeads*RotaryDim multiply-adds.
	RoPE(x, positions, cos, sin Tensor, p RoPEParams) error
	// WriteCache stores src [T, w] into the rows of cache [num_blocks, block_size, width]
	// given by slot_mapping (I32 [T], slot = block*block_size + offset; -1 skips
	// the row), columns [col, col+w). Cost: T*w element copies.
	WriteCache(cache, src, slotMapping Tensor, col int) error
	// Attention is paged causal attention with grouped KV heads: q [T, NumHeads*HeadDim],
	// kCache and vCache [num_blocks, block_size, NumKVHeads*HeadDim], out
	// [T, NumHeads*HeadDim]. The tokens of this step must already be in the cache
	// (WriteCache). Query row j of a sequence with q_len rows and k_len keys attends
	// to keys 0..k_len-q_len+j (only the last SlidingWindow of them when set),
	// read through its block table; prefill, chunked prefill and decode are the
	// same call. Cost: 4*NumHeads*HeadDim flops per (query, visible key) pair,
	// plus one read of the visible cache per KV head and chunk of query rows.
	Attention(out, q, kCache, vCache Tensor, m *AttentionMetadata, p AttentionParams) error
	// MLAAttention is multi-head latent attention over a compressed cache with
	// weight absorption. q [T, NumHeads*(NopeDim+RopeDim)] with the rope part
	// already rotated; cache [num_blocks, block_size, KVLoraRank+RopeDim] holds per
	// token the normalized latent c_kv followed by the rotated shared k_pe; wkvb is
	// kv_b_proj.weight [NumHeads*(NopeDim+VHeadDim), KVLoraRank] in its stored dtype.
	// Per head h, q_nope is absorbed into the latent space (q_lat = W_UK[h]^T q_nope),
	// scores are Scale*(q_lat·c_kv + q_pe·k_pe) with the causal rule of Attention,
	// and the latent output is projected by W_UV[h]. out [T, NumHeads*VHeadDim].
	// Cost per (query, head): 2*KVLoraRank*(NopeDim+VHeadDim) flops for the
	// absorptions plus 4*(KVLoraRank+RopeDim) per visible key; per call, one
	// read of W_UK and W_UV.
	MLAAttention(out, q, cache, wkvb Tensor, m *AttentionMetadata, p MLAParams) error

	// MoERoute selects experts: logits [T, num_experts] (router output) become
	// ids I32 [T, TopK] and weights [T, TopK], per RouteParams. bias
	// [num_experts] (the noaux_tc e_score_correction_bias) or nil; it steers the
	// choice only, never the weights. Cost: O(T*num_experts*TopK).
	MoERoute(ids, weights, logits, bias Tensor, p RouteParams) error
	// MoE is the grouped expert MLP: out[t] = sum_k weights[t,k] *
	// down[e](silu(gate[e] x[t]) * up[e] x[t]) with e = ids[t,k], summed in k order.
	// x [T, hidden]; gateUp [num_experts, 2*inter, hidden] (gate rows first) and
	// down [num_experts, hidden, inter] in their stored dtype; out [T, hidden].
	// Cost: 6*T*TopK*hidden*inter flops; each selected expert's weights read once.
	MoE(out, x, ids, weights, gateUp, down Tensor) error

	// ResolvePlaceholders is the device half of zero-overhead scheduling
	// (MetadataZOS): step N+1 is planned before step N's tokens reach the
	// host, so its inputs carry placeholders that name a sample row of step
	// N. For every i with fromRow[i] >= 0: ids[i] = sampled[fromRow[i]]; other
	// ids are untouched. ids and fromRow I32 [T]; sampled I32 [R], step N's
	// tokens, still in backend memory. A row outside [0, R) is ErrOutOfRange.
	// Cost: T reads; no host round trip.
	ResolvePlaceholders(ids, fromRow, sampled Tensor) error
	// ShiftAccepted is the other device half of zero-overhead scheduling
	// with speculative decoding: step N+1 is laid out before step N's
	// accepted draft counts reach the host, as if no draft were accepted.
	// For every sequence s with shiftFrom[s] >= 0, a = accepted[shiftFrom[s]]:
	// m.SeqlensK[s] += a, and for each of its tokens i (CuSeqlensQ[s] <= i <
	// CuSeqlensQ[s+1]) positions[i] += a and m.SlotMapping[i] =
	// BlockTables[s][p/BlockSize]*BlockSize + p%BlockSize at the new
	// position p. shiftFrom I32 [NumSeqs], accepted I32 [R]; m.MaxSeqlenK
	// must already bound the shifted lengths (the host adds the largest
	// possible shift). A row outside [0, R), a negative count or a block
	// table entry that is not a block is ErrOutOfRange on backends that
	// can check it cheaply (the scheduler's reservations rule them out).
	// Cost: NumTokens + NumSeqs reads and writes; no host round trip.
	ShiftAccepted(m *AttentionMetadata, positions, shiftFrom, accepted Tensor) error

	// Logits gathers the rows that sample, normalizes them and applies the LM
	// head: out[r] = RMSNorm(hidden[rows[r]]; norm, eps) W^T. rows I32 [R] (nil: all
	// rows), norm [hidden] or nil (no norm), head [vocab, hidden] in its stored
	// dtype, out F32 [R, vocab]. Cost: 2*R*vocab*hidden flops, one read of head.
	Logits(out, hidden, rows, norm, head Tensor, eps float32) error
}

// RoPEParams describes where the rotated elements lie in each row of x.
type RoPEParams struct {
	NumHeads  int // heads per row
	HeadSize  int // elements per head (the stride between heads)
	Offset    int // first rotated element within a head
	RotaryDim int // rotated elements per head; even
	// Interleaved rotates pairs (2i, 2i+1) by angle i (DeepSeek's layout);
	// otherwise pairs (i, i+RotaryDim/2) (GPT-NeoX / Llama "rotate_half").
	Interleaved bool
}

// AttentionParams are the per-layer constants of Attention.
type AttentionParams struct {
	NumHeads   int
	NumKVHeads int // divides NumHeads; query head h reads KV head h/(NumHeads/NumKVHeads)
	HeadDim    int
	Scale      float32 // softmax scale, usually HeadDim^-0.5
	// SlidingWindow > 0 limits each query to its SlidingWindow most recent
	// keys, itself included (Mistral, Qwen2 sliding layers); 0 is full causal.
	SlidingWindow int
	// InputDType is the narrowest type a backend may round q, k, v and the
	// softmax probabilities to (accumulating in float32): 0 or F32 keeps
	// float32 throughout (the CPU backend always does); BF16 or F16 lets a
	// GPU backend run attention on 16-bit tensor cores. Models set it to
	// their weights' dtype.
	InputDType DType
	// Sinks is F32 [NumHeads] or nil: per query head a learned logit that
	// joins the softmax denominator and adds no value (gpt-oss), so a row's
	// probabilities sum to 1 - its sink's share. Only backends that
	// implement AttentionSinker honour it; models check before setting it.
	Sinks Tensor
}

// AttentionSinker is implemented by backends whose Attention (and
// RingAttention, where they have it) honour AttentionParams.Sinks.
type AttentionSinker interface {
	AttentionSinks() bool
}

// ClampedSwiGLU is the gated activation of gpt-oss's experts, per element
// with gate g and linear input u: g' = min(g, Limit), u' = clamp(u, -Limit,
// Limit), act = (u' + 1) * g' * sigmoid(Alpha * g').
type ClampedSwiGLU struct {
	Limit, Alpha float32
}

// BiasedMoEer is implemented by backends that run gpt-oss's experts: MoE
// with biases on both projections and the clamped SwiGLU.
type BiasedMoEer interface {
	// MoEClampedSwiGLU is MoE with out[t] = sum_k weights[t,k] *
	// (down[e] act(gateUp[e] x[t] + gateUpBias[e]) + downBias[e]), e =
	// ids[t,k], summed in k order. gateUp [num_experts, 2*inter, hidden]
	// (gate rows first, then up) and down [num_experts, hidden, inter] in
	// their stored dtype; gateUpBias F32 [num_experts, 2*inter], downBias F32
	// [num_experts, hidden]. Cost: MoE's plus the biases.
	MoEClampedSwiGLU(out, x, ids, weights, gateUp, gateUpBias, down, downBias Tensor, p ClampedSwiGLU) error
}

// KVCacheDTyper is implemented by backends that can keep a GQA model's K and
// V caches in a narrower type than their activations: WriteCache rounds into
// it and Attention reads it. KVCacheDType returns the element type for a
// model whose weights are of type weights; a backend without the method
// keeps caches in its activation type.
type KVCacheDTyper interface {
	KVCacheDType(weights DType) DType
}

// MLACacher is implemented by backends that can keep an MLA model's latent
// cache in a narrower type than their activations; the model then writes
// it with WriteMLACache (instead of two WriteCache calls) and MLAAttention
// reads it.
type MLACacher interface {
	// MLACacheLayout returns the element type and the row width, in
	// elements, of the latent cache [num_blocks, block_size, width] for a
	// model whose weights are of type weights: (F32, KVLoraRank+RopeDim)
	// for the activations' layout, (F16 or BF16, KVLoraRank+RopeDim), or
	// (F8E4M3, MLAF8RowBytes(KVLoraRank, RopeDim)) for the packed 8-bit
	// row.
	MLACacheLayout(weights DType, p MLAParams) (DType, int)
	// WriteMLACache stores c_kv [T, KVLoraRank] and k_pe [T, RopeDim] (F32)
	// into the rows of cache given by slotMapping (I32 [T]; -1 skips the
	// row), in the cache's layout: F32, F16 and BF16 rows hold [c_kv k_pe]
	// rounded to nearest; an F8E4M3 row is packed as MLAF8RowBytes says. A
	// slot outside the cache is ErrOutOfRange on backends that check it
	// cheaply. Cost: T*(KVLoraRank+RopeDim) element writes.
	WriteMLACache(cache, ckv, kpe, slotMapping Tensor, p MLAParams) error
}

// MLAF8Group is the number of latent columns that share one scale in the
// packed 8-bit MLA row.
const MLAF8Group = 128

// MLAF8RowBytes is the size of the packed 8-bit MLA cache row (FlashMLA's
// FP8 layout): kvLoraRank E4M3 values, group g of MLAF8Group of them
// holding x / scale_g, with scale_g = max|x| over the group / 448 (1 for a
// group of zeros); ropeDim F16 values of k_pe; the kvLoraRank/MLAF8Group
// scales as F32; zero padding to a multiple of 16 bytes. 656 bytes for
// DeepSeek's 512 + 64. kvLoraRank must be a multiple of MLAF8Group and
// ropeDim of 8.
func MLAF8RowBytes(kvLoraRank, ropeDim int) int {
	return (kvLoraRank + 2*ropeDim + 4*(kvLoraRank/MLAF8Group) + 15) / 16 * 16
}

// LinearInputer is implemented by backends whose Linear (and GatedMLP)
// round a float32 x to a 16-bit type before multiplying, at some row
// counts. LinearInputDType returns that type for a call of rows rows with
// weights of dtype w, or F32 where x is used as float32. Where it is
// 16-bit, a caller may hand those calls x already rounded, as a tensor of
// that type, written so by RMSNorm, AddRMSNorm or Attention (whose out may
// then be of that type): the same bits, with one pass over x less.
type LinearInputer interface {
	LinearInputDType(w DType, rows int) DType
}

// MoEInputer is implemented by backends whose MoE (MoEAdd, RoutedMoE)
// rounds a float32 x to its experts' 16-bit type. MoEInputDType returns
// that type for a call of rows rows over experts of dtype w, or F32 where x
// must be float32. Where it is 16-bit, a caller may hand the call x rounded
// already (written so by RMSNorm or AddRMSNorm, as for LinearInputer): the
// same bits, with one pass over x less.
type MoEInputer interface {
	MoEInputDType(w DType, rows int) DType
}

// GatedMLPer is implemented by backends with a fused gated MLP without
// biases: out = (silu(g) * u) downᵀ where [g u] = x gateUpᵀ (gateUp
// [2n, hidden], down [hidden, n], out and x [T, hidden]). gu [T, 2n] and act
// [T, n] are scratch in ActivationDType that the backend may use for the
// intermediates (their contents afterwards are unspecified); a backend may
// instead keep them in a narrower type, so the result need not equal
// Linear, SiLUMul, Linear to the bit. Callers without it run those three.
type GatedMLPer interface {
	GatedMLP(out, x, gateUp, down, gu, act Tensor) error
}

// MLAParams are the per-layer constants of MLAAttention.
type MLAParams struct {
	NumHeads   int
	NopeDim    int // qk_nope_head_dim
	RopeDim    int // qk_rope_head_dim
	KVLoraRank int // kv_lora_rank: width of the latent
	VHeadDim   int // v_head_dim
	Scale      float32
}

// AttentionMetadata describes one step's batch for paged attention; all layers
// of the step share it. Sequences are laid out back to back in the token
// dimension: sequence s owns query rows CuSeqlensQ[s]..CuSeqlensQ[s+1].
type AttentionMetadata struct {
	NumSeqs    int
	NumTokens  int // = CuSeqlensQ[NumSeqs]
	MaxSeqlenQ int // host-side bounds, for sizing scratch and launch grids
	MaxSeqlenK int
	BlockSize  int // tokens per KV block

	CuSeqlensQ  Tensor // I32 [NumSeqs+1], CuSeqlensQ[0] = 0
	SeqlensK    Tensor // I32 [NumSeqs]: keys visible to the sequence's last query (cached + new)
	BlockTables Tensor // I32 [NumSeqs, max_blocks_per_seq]: physical block of each logical block
	SlotMapping Tensor // I32 [NumTokens]: cache slot each new token is written to (-1: none)

	// HostCuSeqlensQ, when not nil, is a host copy of CuSeqlensQ's values
	// (NumSeqs+1 of them), which a backend may read while it queues an op
	// instead of reading the device's back (CUDA's MLA prefill path sizes
	// its launches by it). Its owner leaves it unchanged while the ops that
	// take the metadata are queued. CUDA checks what it derives from the
	// copy against the device's values: a mismatch is ErrOutOfRange at
	// the next Sync.
	HostCuSeqlensQ []int32
}

// Scoring is how router logits become expert scores.
type Scoring uint8

const (
	ScoringSoftmax Scoring = iota + 1 // softmax over experts
	ScoringSigmoid                    // independent sigmoid per expert
)

// TopKMethod is how experts are selected from the scores.
type TopKMethod uint8

const (
	// TopKGreedy takes the TopK highest scores.
	TopKGreedy TopKMethod = iota + 1
	// TopKGroupLimited keeps the TopKGroups groups whose best score is highest,
	// then takes TopK experts among them (DeepSeek-V2 group_limited_greedy).
	TopKGroupLimited
	// TopKNoAuxTC adds the correction bias, ranks groups by the sum of their two
	// best biased scores, keeps TopKGroups groups and takes TopK experts among them
	// by biased score (DeepSeek-V3 noaux_tc).
	TopKNoAuxTC
)

// RouteParams configure MoERoute. Experts outside the kept groups compete with
// a masked score of 0, as in the reference implementation; weights are the
// unbiased scores of the chosen experts, divided by their sum (+1e-20) when
// NormTopKProb, then multiplied by ScalingFactor.
type RouteParams struct {
	TopK          int
	Scoring       Scoring
	Method        TopKMethod
	NumGroups     int // n_group; must divide the number of experts (1 for greedy)
	TopKGroups    int // topk_group
	NormTopKProb  bool
	ScalingFactor float32 // routed_scaling_factor
}

// Validate checks the parameters against a router of numExperts experts:
// top_k in range, a known scoring and method, groups that divide the
// experts and can hold top_k of them. Errors wrap ErrShape.
func (p RouteParams) Validate(numExperts int) error {
	e := numExperts
	bad := func(why string) error {
		return fmt.Errorf("route params %+v with %d experts: %s: %w", p, e, why, ErrShape)
	}
	if p.TopK < 1 || p.TopK > e {
		return bad("top_k out of range")
	}
	if p.Scoring != ScoringSoftmax && p.Scoring != ScoringSigmoid {
		return bad("unknown scoring")
	}
	switch p.Method {
	case TopKGreedy:
	case TopKGroupLimited, TopKNoAuxTC:
		if p.NumGroups < 1 || e%p.NumGroups != 0 {
			return bad("n_group must divide the experts")
		}
		if p.TopKGroups < 1 || p.TopKGroups > p.NumGroups {
			return bad("topk_group out of range")
		}
		if p.TopK > p.TopKGroups*(e/p.NumGroups) {
			return bad("top_k exceeds the experts of the kept groups")
		}
		if p.Method == TopKNoAuxTC && e/p.NumGroups < 2 {
			return bad("noaux_tc needs at least 2 experts per group")
		}
	default:
		return bad("unknown top-k method")
	}
	return nil
}

// RingAttentioner is implemented by backends that keep a sliding-window
// layer's keys and values in per-sequence ring buffers (state slots)
// instead of paged blocks: kRing and vRing [num_slots, window,
// NumKVHeads*HeadDim] (window = p.SlidingWindow) hold, for the sequence in
// slot s, the key of position pos at row s*window + pos%window.
//
// RingAttention is Attention for such a layer: k and v [T,
// NumKVHeads*HeadDim] are the step's new keys and values (rotated), which
// are NOT yet in the ring; slots I32 [NumSeqs] names each sequence's
// slot. Sequence s has q_len = CuSeqlensQ[s+1]-CuSeqlensQ[s] new rows and
// k_len = SeqlensK[s] keys: its first k_len-q_len keys are history, of
// which the ring holds the last window; query row j (position
// k_len-q_len+j) attends to its window most recent keys, reading history
// from the ring and the step's own keys from k and v, so a chunk longer
// than the window is one call. m.BlockTables and m.SlotMapping are not
// read. After the call the caller writes the step's keys and values into
// the ring with WriteCache through a slot mapping that wraps (RingSlots):
// a row whose position will be overwritten within the same step is -1.
// A backend may write a decode row's key and value into its ring row
// itself during the call (the row and the values that WriteCache writes
// afterwards); nothing else of the rings changes.
// The result is the bits Attention gives for the same keys in paged
// blocks with SlidingWindow = window. Cost: that of Attention.
type RingAttentioner interface {
	RingAttention(out, q, k, v, kRing, vRing, slots Tensor, m *AttentionMetadata, p AttentionParams) error
}

// RingSlots returns the ring rows a step's new tokens are written to: for
// each sequence s (slot slots[s], numNew new tokens ending at key count
// seqlensK[s]), the token at position pos goes to slot*window +
// pos%window when pos >= seqlensK[s]-window, else -1 (a later token of the
// same step takes its row). newPerSeq[s] is the sequence's number of new
// tokens.
func RingSlots(slots, seqlensK, newPerSeq []int32, window int) []int32 {
	var out []int32
	for s := range slots {
		k, q := int(seqlensK[s]), int(newPerSeq[s])
		for pos := k - q; pos < k; pos++ {
			row := int32(-1)
			if pos >= k-window {
				row = slots[s]*int32(window) + int32(pos%window)
			}
			out = append(out, row)
		}
	}
	return out
}

// GemmaOpser is implemented by backends with the elementwise operations of
// the Gemma family that the Llama family does not need.
type GemmaOpser interface {
	// Scale computes out = x * s elementwise; out and x of one shape, F32.
	// out may alias x. Cost: one pass over x.
	Scale(out, x Tensor, s float32) error
	// GELUTanhMul is the GeGLU activation with the tanh approximation of
	// GELU: out[i, j] = gelu_tanh(gateUp[i, j]) * gateUp[i, n+j], with
	// gateUp [T, 2n] (gate columns first) and out [T, n], F32.
	GELUTanhMul(out, gateUp Tensor) error
	// Softcap bounds x in place: x = c * tanh(x / c), c > 0, F32 of any
	// shape. Cost: one pass over x.
	Softcap(x Tensor, c float32) error
}
