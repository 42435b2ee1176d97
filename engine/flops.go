package engine

import (
	"fmt"
	"math"
)

// ModelShape holds the sizes that decide a transformer's compute and memory
// traffic. Zero MoE fields mean a dense MLP; a zero KVLoraRank means
// standard (MHA/GQA) attention, a non-zero one DeepSeek's MLA.
type ModelShape struct {
	NumLayers    int
	Hidden       int
	NumHeads     int
	NumKVHeads   int
	HeadDim      int
	Intermediate int // dense MLP width
	Vocab        int
	// TieWordEmbeddings: the LM head reuses the embedding matrix.
	TieWordEmbeddings bool

	// MoE: routed experts, experts per token, shared experts, expert MLP
	// width, and the leading layers that keep a dense MLP.
	NumExperts       int
	NumExpertsPerTok int
	NumSharedExperts int
	MoEIntermediate  int
	NumDenseLayers   int

	// MLA: query and KV LoRA ranks (QLoraRank 0: full-rank queries), and
	// the per-head dims of the non-RoPE and RoPE query/key parts and of
	// the values.
	QLoraRank     int
	KVLoraRank    int
	QKNopeHeadDim int
	QKRopeHeadDim int
	VHeadDim      int

	// WeightBytes is the size of one weight (2 for bf16), KVBytes of one
	// cached KV element.
	WeightBytes float64
	KVBytes     float64
}

// StepCost is the estimated work of one step.
type StepCost struct {
	LinearFLOPs    float64 // projections and MLPs of every computed token
	AttentionFLOPs float64 // QK^T and PV over each token's causal context
	LMHeadFLOPs    float64 // the LM head, on the rows that need logits
	WeightBytes    float64 // weights read once (MoE: experts the batch hits)
	KVBytes        float64 // KV read (context) and written (new tokens)
}

// FLOPs returns the total floating-point operations.
func (c StepCost) FLOPs() float64 { return c.LinearFLOPs + c.AttentionFLOPs + c.LMHeadFLOPs }

// Bytes returns the total bytes moved from and to device memory.
func (c StepCost) Bytes() float64 { return c.WeightBytes + c.KVBytes }

// MFU returns the model FLOPs utilization of a step that took seconds on a
// device of peakFLOPS (0 when either is not positive).
func (c StepCost) MFU(seconds, peakFLOPS float64) float64 {
	if seconds <= 0 || peakFLOPS <= 0 {
		return 0
	}
	return c.FLOPs() / seconds / peakFLOPS
}

// BandwidthUtil returns the fraction of peak memory bandwidth (bytes/s)
// the step's traffic used (0 when either is not positive).
func (c StepCost) BandwidthUtil(seconds, peakBytesPerSecond float64) float64 {
	if seconds <= 0 || peakBytesPerSecond <= 0 {
		return 0
	}
	return c.Bytes() / seconds / peakBytesPerSecond
}

// FlopsEstimator turns a scheduled step into FLOPs and bytes from the
// model's shapes, so that stats can report MFU and bandwidth use.
//
// Linear FLOPs are 2 x active parameters per computed token (embedding
// excluded); the LM head (2 x hidden x vocab) counts only rows that need
// logits (sample rows and prompt-logprob rows). Attention FLOPs are 2 x
// heads x (qk_dim + v_dim) per (query, key) pair, with causal pairs
// q*(k-q) + q*(q+1)/2 for a sequence computing q tokens with k in context;
// MLA counts its naive (non-absorbed) form. Weight bytes count every dense
// weight once per step and, for MoE layers, the expected number of distinct
// experts hit by the step's tokens under uniform routing,
// E*(1-(1-k/E)^tokens). KV bytes count each sequence's context read once
// per layer plus the new tokens written. Activations are ignored.
type FlopsEstimator struct {
	shape ModelShape

	attnParams      float64 // per layer
	denseMLPParams  float64 // per dense layer
	expertParams    float64 // one routed or shared expert
	routerParams    float64 // per MoE layer
	numDenseLayers  int
	numMoELayers    int
	activePerToken  float64 // linear params touched by one token
	lmHeadParams    float64
	embedParams     float64
	pairFLOPs       float64 // attention FLOPs per (query, key) pair, all layers
	kvBytesPerToken float64 // KV bytes of one token, all layers
}

// NewFlopsEstimator checks the shape and precomputes per-token costs.
func NewFlopsEstimator(shape ModelShape) (*FlopsEstimator, error) {
	switch {
	case shape.NumLayers < 1 || shape.Hidden < 1 || shape.NumHeads < 1 || shape.Vocab < 1:
		return nil, fmt.Errorf("flops: num_layers, hidden, num_heads and vocab must be >= 1, got %d, %d, %d, %d",
			shape.NumLayers, shape.Hidden, shape.NumHeads, shape.Vocab)
	case shape.KVLoraRank == 0 && (shape.HeadDim < 1 || shape.NumKVHeads < 1):
		return nil, fmt.Errorf("flops: head_dim and num_kv_heads must be >= 1 without MLA, got %d, %d", shape.HeadDim, shape.NumKVHeads)
	case shape.KVLoraRank > 0 && (shape.QKNopeHeadDim+shape.QKRopeHeadDim < 1 || shape.VHeadDim < 1):
		return nil, fmt.Errorf("flops: MLA needs qk_nope_head_dim + qk_rope_head_dim >= 1 and v_head_dim >= 1")
	case shape.NumExperts > 0 && (shape.NumExpertsPerTok < 1 || shape.NumExpertsPerTok > shape.NumExperts || shape.MoEIntermediate < 1):
		return nil, fmt.Errorf("flops: MoE needs 1 <= experts_per_tok (%d) <= num_experts (%d) and moe_intermediate >= 1",
			shape.NumExpertsPerTok, shape.NumExperts)
	case shape.NumDenseLayers < 0 || shape.NumDenseLayers > shape.NumLayers:
		return nil, fmt.Errorf("flops: num_dense_layers must be in [0, %d], got %d", shape.NumLayers, shape.NumDenseLayers)
	}
	if shape.WeightBytes <= 0 {
		shape.WeightBytes = 2
	}
	if shape.KVBytes <= 0 {
		shape.KVBytes = 2
	}
	h := float64(shape.Hidden)
	heads := float64(shape.NumHeads)
	e := &FlopsEstimator{shape: shape}

	var qkDim, vDim float64
	if shape.KVLoraRank > 0 {
		nope, rope := float64(shape.QKNopeHeadDim), float64(shape.QKRopeHeadDim)
		qkDim, vDim = nope+rope, float64(shape.VHeadDim)
		kvr := float64(shape.KVLoraRank)
		if shape.QLoraRank > 0 {
			qr := float64(shape.QLoraRank)
			e.attnParams = h*qr + qr*heads*qkDim
		} else {
			e.attnParams = h * heads * qkDim
		}
		e.attnParams += h*(kvr+rope) + kvr*heads*(nope+vDim) + heads*vDim*h
		e.kvBytesPerToken = (kvr + rope) * shape.KVBytes
	} else {
		hd, kvh := float64(shape.HeadDim), float64(shape.NumKVHeads)
		qkDim, vDim = hd, hd
		e.attnParams = h*heads*hd + 2*h*kvh*hd + heads*hd*h
		e.kvBytesPerToken = 2 * kvh * hd * shape.KVBytes
	}
	layers := float64(shape.NumLayers)
	e.kvBytesPerToken *= layers
	e.pairFLOPs = 2 * heads * (qkDim + vDim) * layers

	e.denseMLPParams = 3 * h * float64(shape.Intermediate)
	e.numDenseLayers = shape.NumLayers
	if shape.NumExperts > 0 {
		e.numDenseLayers = shape.NumDenseLayers
		e.numMoELayers = shape.NumLayers - shape.NumDenseLayers
		e.expertParams = 3 * h * float64(shape.MoEIntermediate)
		e.routerParams = h * float64(shape.NumExperts)
	}
	e.activePerToken = layers*e.attnParams + float64(e.numDenseLayers)*e.denseMLPParams +
		float64(e.numMoELayers)*(e.routerParams+float64(shape.NumExpertsPerTok+shape.NumSharedExperts)*e.expertParams)
	e.lmHeadParams = h * float64(shape.Vocab)
	e.embedParams = h * float64(shape.Vocab)
	return e, nil
}

// Shape returns the shape (byte sizes defaulted).
func (e *FlopsEstimator) Shape() ModelShape { return e.shape }

// ActiveParams returns the parameters one token's forward pass multiplies,
// LM head included, embedding excluded.
func (e *FlopsEstimator) ActiveParams() float64 { return e.activePerToken + e.lmHeadParams }

// TotalParams returns every parameter (norms excluded).
func (e *FlopsEstimator) TotalParams() float64 {
	total := float64(e.shape.NumLayers)*e.attnParams + float64(e.numDenseLayers)*e.denseMLPParams +
		float64(e.numMoELayers)*(e.routerParams+float64(e.shape.NumExperts+e.shape.NumSharedExperts)*e.expertParams) +
		e.embedParams
	if !e.shape.TieWordEmbeddings {
		total += e.lmHeadParams
	}
	return total
}

// Sequence returns the cost of one sequence computing q tokens with k in
// context after the step (k >= q) and logitsRows rows through the LM head.
// Weight bytes are not included (they are per step, see Estimate).
func (e *FlopsEstimator) Sequence(q, k, logitsRows int) StepCost {
	fq, fk := float64(q), float64(k)
	pairs := fq*(fk-fq) + fq*(fq+1)/2
	return StepCost{
		LinearFLOPs:    2 * e.activePerToken * fq,
		AttentionFLOPs: e.pairFLOPs * pairs,
		LMHeadFLOPs:    2 * e.lmHeadParams * float64(logitsRows),
		KVBytes:        e.kvBytesPerToken * (fk + fq),
	}
}

// WeightBytes returns the weight bytes a step of numTokens tokens reads.
func (e *FlopsEstimator) WeightBytes(numTokens int) float64 {
	if numTokens <= 0 {
		return 0
	}
	params := float64(e.shape.NumLayers)*e.attnParams + float64(e.numDenseLayers)*e.denseMLPParams + e.lmHeadParams
	if e.numMoELayers > 0 {
		n, k := float64(e.shape.NumExperts), float64(e.shape.NumExpertsPerTok)
		hit := n * (1 - math.Pow(1-k/n, float64(numTokens)))
		params += float64(e.numMoELayers) * (e.routerParams + (hit+float64(e.shape.NumSharedExperts))*e.expertParams)
	}
	return params * e.shape.WeightBytes
}

// Estimate returns the cost of a scheduled step. Cost: O(len(metas)).
func (e *FlopsEstimator) Estimate(metas []SequenceMetadata) StepCost {
	var c StepCost
	tokens := 0
	for i := range metas {
		m := &metas[i]
		rows := 0
		if m.Sample {
			rows = 1
		}
		if m.PromptLogprobsTo > m.PromptLogprobsFrom {
			rows += m.PromptLogprobsTo - m.PromptLogprobsFrom
		}
		sc := e.Sequence(m.SeqlenQ, m.SeqlenK, rows)
		c.LinearFLOPs += sc.LinearFLOPs
		c.AttentionFLOPs += sc.AttentionFLOPs
		c.LMHeadFLOPs += sc.LMHeadFLOPs
		c.KVBytes += sc.KVBytes
		tokens += m.SeqlenQ
	}
	c.WeightBytes = e.WeightBytes(tokens)
	return c
}
