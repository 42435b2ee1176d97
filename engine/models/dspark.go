package models

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/weights"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// DSparkArchitecture is the config.json architectures name of a DSpark
// drafter.
const DSparkArchitecture = "DSparkDrafter"

// DSparkConfig is a DSpark drafter's config.json.
type DSparkConfig struct {
	Architectures []string `json:"architectures"`
	// TargetArchitectures, TargetHiddenSize and TargetNumHiddenLayers
	// describe the model the drafter was trained for; TargetLayerIDs are the
	// target decoder layers whose outputs condition it.
	TargetArchitectures   []string `json:"target_architectures"`
	TargetHiddenSize      int      `json:"target_hidden_size"`
	TargetNumHiddenLayers int      `json:"target_num_hidden_layers"`
	TargetLayerIDs        []int    `json:"target_layer_ids"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	HeadDim               int      `json:"head_dim"`
	IntermediateSize      int      `json:"intermediate_size"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	// BlockSize is k, the positions one pass drafts.
	BlockSize            int `json:"block_size"`
	MarkovRank           int `json:"markov_rank"`
	ConfidenceHiddenSize int `json:"confidence_hidden_size"`
	// The confidence head's calibration (Platt scaling fit after
	// training): p = sigmoid(ConfidenceScale*z + ConfidenceBias).
	ConfidenceScale float64 `json:"confidence_scale"`
	ConfidenceBias  float64 `json:"confidence_bias"`
}

// DSpark is a block drafter (DSpark, of the DFlash family) bound to its
// target model. From the target's hidden state at a sequence's last
// accepted position (the target's Forward output at the row whose output is
// the sequence's last token) and that token, one parallel pass over a block
// of BlockSize positions proposes the next tokens:
//
//   - context c = ctx.proj(RMSNorm(h; ctx.norm.0)) [hidden];
//   - block rows x_0 = E[last] + block.embed[0], x_j = block.embed[j]
//     (learned mask-and-position rows), E the target's embedding;
//   - NumHiddenLayers pre-norm layers: attention of each block row over the
//     whole block (bidirectional) and the context (one key and value per
//     sequence, the layer's k/v projections of RMSNorm(c; context_norm)),
//     no rotary positions, then a SwiGLU MLP;
//   - a Markov correction, sequential over the block but tiny: g_j = x_j +
//     markov.up(silu(a)*b), [a b] = markov.down(E[d_{j-1}]), d_{-1} the last
//     token and d_{j-1} the draft at j-1; the draft d_j is the argmax of the
//     target's final norm and LM head over g_j (both shared with the
//     target);
//   - a confidence head: z_j = confidence.fc2(silu(a)*b), [a b] =
//     confidence.fc1(RMSNorm(g_j)), and p_j = sigmoid(ConfidenceScale*z_j +
//     ConfidenceBias), the probability that the target accepts d_j given
//     that it accepted d_0..d_{j-1}.
//
// It keeps no KV cache of its own: it conditions only on the target's
// hidden state at the last accepted position, so nothing needs rolling
// back. Only the target's last layer output is available to it in the
// engine (TargetLayerIDs must name that layer). Draft may run concurrently.
type DSpark struct {
	cfg    DSparkConfig
	ops    kernels.Ops
	target *base
	eps    float32

	ctxNorm, ctxProj kernels.Tensor
	blockEmbed       kernels.Tensor // [k, hidden]
	layers           []dsparkLayer
	markovDown       kernels.Tensor // [2r, target hidden]
	markovUp         kernels.Tensor // [hidden, r]
	// markovTable [vocab, hidden] (the activation dtype) holds the Markov
	// correction of every token, markov.up(silu(a)*b) for [a b] =
	// markov.down(E[t]), computed at load with the same operations, so a
	// position gathers its correction instead of running three (nil when
	// the table would pass markovTableMaxBytes).
	markovTable      kernels.Tensor
	confNorm         kernels.Tensor
	confFC1, confFC2 kernels.Tensor // [2c, hidden], [1, c]
	confBias         kernels.Tensor // [1]
}

type dsparkLayer struct {
	inputNorm, contextNorm, postNorm kernels.Tensor
	q, k, v, o                       kernels.Tensor
	gateUp, down                     kernels.Tensor
}

// shared gives a drafter of this package the target's embedding, final
// norm and LM head.
func (m *base) shared() *base { return m }

// ReadDSparkConfig reads dir/config.json of a DSpark drafter.
func ReadDSparkConfig(dir string) (*DSparkConfig, error) {
	data, err := os.ReadFile(filepath.Join(dir, weights.ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("models: dspark: %w", err)
	}
	var cfg DSparkConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("models: dspark: %s: %v: %w", dir, err, ErrConfig)
	}
	return &cfg, nil
}

// LoadDSpark loads the DSpark drafter in the Hugging Face style directory
// dir (config.json, model.safetensors) for target, on ops. The files are
// closed before it returns.
func LoadDSpark(ops kernels.Ops, dir string, target Model) (*DSpark, error) {
	cfg, err := ReadDSparkConfig(dir)
	if err != nil {
		return nil, err
	}
	f, err := weights.OpenFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("models: dspark: %w", err)
	}
	defer f.Close()
	return NewDSpark(ops, cfg, f, target)
}

// NewDSpark builds a DSpark drafter for target from cfg and src. The
// target must be a model of this package whose hidden size, vocabulary and
// layer count match cfg's. Errors wrap ErrConfig or ErrWeights.
func NewDSpark(ops kernels.Ops, cfg *DSparkConfig, src Weights, target Model) (*DSpark, error) {
	if !slices.Contains(cfg.Architectures, DSparkArchitecture) {
		return nil, fmt.Errorf("models: dspark: architectures %v, want %s: %w", cfg.Architectures, DSparkArchitecture, ErrUnknownArchitecture)
	}
	sh, ok := target.(interface{ shared() *base })
	if !ok {
		return nil, fmt.Errorf("models: dspark: target %T is not a model of this package: %w", target, ErrConfig)
	}
	tc := target.Config()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("models: dspark: "+format+": %w", append(args, ErrConfig)...)
	}
	switch {
	case cfg.TargetHiddenSize != tc.HiddenSize || cfg.HiddenSize != tc.HiddenSize:
		return nil, bad("hidden_size %d and target_hidden_size %d, the target's is %d (the drafter shares its LM head)", cfg.HiddenSize, cfg.TargetHiddenSize, tc.HiddenSize)
	case cfg.VocabSize != tc.VocabSize:
		return nil, bad("vocab_size %d, the target's is %d", cfg.VocabSize, tc.VocabSize)
	case cfg.TargetNumHiddenLayers != tc.NumHiddenLayers:
		return nil, bad("target_num_hidden_layers %d, the target has %d", cfg.TargetNumHiddenLayers, tc.NumHiddenLayers)
	case !slices.Equal(cfg.TargetLayerIDs, []int{tc.NumHiddenLayers - 1}):
		return nil, bad("target_layer_ids %v: the engine hands a drafter the target's last layer output only, [%d]", cfg.TargetLayerIDs, tc.NumHiddenLayers-1)
	case cfg.BlockSize < 1 || cfg.NumHiddenLayers < 1 || cfg.NumAttentionHeads < 1 || cfg.HeadDim < 1 ||
		cfg.IntermediateSize < 1 || cfg.MarkovRank < 1 || cfg.ConfidenceHiddenSize < 1:
		return nil, bad("block_size, layers, heads, head_dim, intermediate_size, markov_rank and confidence_hidden_size must be positive: %+v", *cfg)
	}
	d := &DSpark{cfg: *cfg, ops: ops, target: sh.shared(), eps: float32(cfg.RMSNormEps)}
	if d.eps == 0 {
		d.eps = 1e-6
	}
	l := &loader{ops: ops, src: src}
	h, ht, att := cfg.HiddenSize, cfg.TargetHiddenSize, cfg.NumAttentionHeads*cfg.HeadDim
	d.ctxNorm = l.vector("ctx.norm.0.weight", ht)
	d.ctxProj = l.matrix("ctx.proj.weight", h, ht)
	d.blockEmbed = l.matrix("block.embed", cfg.BlockSize, h)
	for i := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("layers.%d.", i)
		d.layers = append(d.layers, dsparkLayer{
			inputNorm:   l.vector(p+"input_norm.weight", h),
			contextNorm: l.vector(p+"context_norm.weight", h),
			postNorm:    l.vector(p+"post_norm.weight", h),
			q:           l.matrix(p+"q_proj.weight", att, h),
			k:           l.matrix(p+"k_proj.weight", att, h),
			v:           l.matrix(p+"v_proj.weight", att, h),
			o:           l.matrix(p+"o_proj.weight", h, att),
			gateUp:      l.matrix(p+"mlp.gate_up_proj.weight", 2*cfg.IntermediateSize, h),
			down:        l.matrix(p+"mlp.down_proj.weight", h, cfg.IntermediateSize),
		})
	}
	d.markovDown = l.matrix("markov.down.weight", 2*cfg.MarkovRank, ht)
	d.markovUp = l.matrix("markov.up.weight", h, cfg.MarkovRank)
	d.confNorm = l.vector("confidence.norm.weight", h)
	d.confFC1 = l.matrix("confidence.fc1.weight", 2*cfg.ConfidenceHiddenSize, h)
	d.confFC2 = l.matrix("confidence.fc2.weight", 1, cfg.ConfidenceHiddenSize)
	d.confBias = l.vector("confidence.fc2.bias", 1)
	if l.err != nil {
		return nil, fmt.Errorf("models: dspark: %w", l.err)
	}
	if cfg.VocabSize*h*ops.ActivationDType().Size() <= markovTableMaxBytes {
		var err error
		if d.markovTable, err = d.buildMarkovTable(); err != nil {
			return nil, fmt.Errorf("models: dspark: markov table: %w", err)
		}
	}
	return d, nil
}

// markovTableMaxBytes bounds the Markov correction table (DSpark's
// markovTable): 64 MiB holds a vocabulary of 65,536 at hidden size 256 in
// float32; larger drafters compute the correction at each position.
const markovTableMaxBytes = 64 << 20

// markovTableChunk is how many tokens' corrections one round of the
// table's build computes: the batch sizes of decode, at which the
// backends run the same products as in a pass.
const markovTableChunk = 64

// buildMarkovTable computes the Markov correction of every token of the
// vocabulary with the operations a pass would run on it (embedding,
// markov.down, SiLU-and-multiply, markov.up), markovTableChunk tokens at a
// time. Cost at load: 2*vocab*(2r*target hidden + hidden*r) flops and
// vocab*hidden activations of memory.
func (d *DSpark) buildMarkovTable() (kernels.Tensor, error) {
	ops, cfg := d.ops, &d.cfg
	v, h, r := cfg.VocabSize, cfg.HiddenSize, cfg.MarkovRank
	table, err := ops.Alloc(ops.ActivationDType(), v, h)
	if err != nil {
		return nil, err
	}
	s := newScratch(ops)
	ids := make([]int32, markovTableChunk)
	for lo := 0; lo < v; lo += markovTableChunk {
		n := min(markovTableChunk, v-lo)
		for i := range n {
			ids[i] = int32(lo + i)
		}
		idT, err := kernels.FromI32(ops, ids[:n], n)
		if err != nil {
			return nil, err
		}
		m, md := s.get(fmt.Sprint("m", n), n, cfg.TargetHiddenSize), s.get(fmt.Sprint("md", n), n, 2*r)
		ma := s.get(fmt.Sprint("ma", n), n, r)
		if s.err != nil {
			return nil, s.err
		}
		rows, err := ops.Rows(table, lo, lo+n)
		if err != nil {
			return nil, err
		}
		for _, f := range []func() error{
			func() error { return ops.Embedding(m, d.target.embed, idT) },
			func() error { return ops.Linear(md, m, d.markovDown, nil) },
			func() error { return ops.SiLUMul(ma, md) },
			func() error { return ops.Linear(rows, ma, d.markovUp, nil) },
		} {
			if err := f(); err != nil {
				return nil, err
			}
		}
	}
	return table, ops.Sync()
}

// Config returns the drafter's config.
func (d *DSpark) Config() DSparkConfig { return d.cfg }

// BlockSize is the most tokens one Draft proposes per sequence.
func (d *DSpark) BlockSize() int { return d.cfg.BlockSize }

// DSparkDrafts is the outcome of one Draft call, per sequence.
type DSparkDrafts struct {
	Tokens [][]int // n drafts per sequence
	// Confidence[s][j] is the predicted probability that the target
	// accepts Tokens[s][j] given that it accepted Tokens[s][:j].
	Confidence [][]float64
}

// WithOps returns a copy of d that queues its work on ops, which must
// reach d's backend (a wrapper that counts or times its operations): the
// weights stay where they are.
func (d *DSpark) WithOps(ops kernels.Ops) *DSpark {
	c := *d
	c.ops = ops
	return &c
}

// Confidence is the calibrated probability of a confidence logit z (the
// Z of a DSparkPass): sigmoid(ConfidenceScale*z + ConfidenceBias), in
// float64.
func (d *DSpark) Confidence(z float32) float64 {
	return 1 / (1 + math.Exp(-(d.cfg.ConfidenceScale*float64(z) + d.cfg.ConfidenceBias)))
}

// Draft proposes n <= BlockSize tokens for each of len(rows) sequences:
// sequence s continues token last[s], and rows[s] is the row of hidden
// (the target's Forward output, [R, hidden]) computed at the position
// before last[s]'s. Drafts are greedy (the argmax of each position's
// corrected logits). It stops early, with as many drafts for every
// sequence, after the first position at which every sequence's
// cumulative confidence (the product of its confidences so far) is below
// stopBelow: drafts past it would not be verified at that threshold
// (spec.GatePrefix); 0 drafts all n. It is Queue over one upload of its
// index arrays, with the drafts and confidences read back: on a backend
// that computes asynchronously (kernels.AsyncFetcher: a GPU) once after
// all n positions (the same positions are kept, so the drafts are the
// same), on the others after each position, which lets the early stop
// skip the positions after it. Cost: the block's layers over BlockSize
// rows per sequence, then per drafted position one LM-head row per
// sequence (2*len(rows)*vocab*hidden flops), and those reads.
func (d *DSpark) Draft(ctx context.Context, hidden kernels.Tensor, rows, last []int32, n int, stopBelow float64) (*DSparkDrafts, error) {
	b, k := len(rows), d.cfg.BlockSize
	switch {
	case len(last) != b:
		return nil, fmt.Errorf("models: dspark: %d rows and %d last tokens: %w", b, len(last), ErrBatch)
	case n < 0 || n > k:
		return nil, fmt.Errorf("models: dspark: %d drafts, block size %d: %w", n, k, ErrBatch)
	}
	out := &DSparkDrafts{Tokens: make([][]int, b), Confidence: make([][]float64, b)}
	if b == 0 || n == 0 {
		return out, nil
	}
	for _, t := range last {
		if t < 0 || int(t) >= d.cfg.VocabSize {
			return nil, fmt.Errorf("models: dspark: token %d outside the vocabulary of %d: %w", t, d.cfg.VocabSize, ErrBatch)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := d.draft(ctx, hidden, rows, last, n, stopBelow, out); err != nil {
		return nil, fmt.Errorf("models: dspark: %w", err)
	}
	return out, nil
}

func (d *DSpark) draft(ctx context.Context, hidden kernels.Tensor, rows, last []int32, n int, stopBelow float64, out *DSparkDrafts) error {
	ops, b := d.ops, len(rows)
	layout := make([]int32, d.LayoutSize(b))
	d.FillLayout(layout, b)
	ts, err := uploadI32(ops, [][]int32{rows, last, layout})
	if err != nil {
		return err
	}
	p := &DSparkPass{Last: ts[1], Layout: ts[2]}
	if p.Feat, err = kernels.AllocEmpty(ops, ops.ActivationDType(), b, d.cfg.TargetHiddenSize); err != nil { // every row embedded
		return err
	}
	if err := ops.Embedding(p.Feat, hidden, ts[0]); err != nil {
		return err
	}
	if p.Tokens, err = ops.Alloc(kernels.I32, n*b); err != nil {
		return err
	}
	if p.Z, err = ops.Alloc(kernels.F32, n*b, 1); err != nil {
		return err
	}
	cum := make([]float64, b)
	for i := range cum {
		cum[i] = 1
	}
	// take turns position j's tokens and confidence logits into drafts and
	// reports whether a sequence's cumulative confidence still clears
	// stopBelow.
	take := func(j int, ids []int32, zs []float32) bool {
		live := false
		for i := range b {
			c := d.Confidence(zs[i])
			out.Tokens[i] = append(out.Tokens[i], int(ids[i]))
			out.Confidence[i] = append(out.Confidence[i], c)
			cum[i] *= c
			live = live || cum[i] >= stopBelow
		}
		return live
	}
	_, chained := ops.(kernels.AsyncFetcher)
	var after func(int) (bool, error)
	if !chained {
		after = func(j int) (bool, error) {
			ids, err := ops.Rows(p.Tokens, j*b, (j+1)*b)
			if err != nil {
				return false, err
			}
			zj, err := ops.Rows(p.Z, j*b, (j+1)*b)
			if err != nil {
				return false, err
			}
			got, err := kernels.ToI32(ops, ids)
			if err != nil {
				return false, fmt.Errorf("position %d: %w", j, err)
			}
			zs, err := kernels.ToF32(ops, zj)
			if err != nil {
				return false, fmt.Errorf("position %d: %w", j, err)
			}
			return !take(j, got, zs), nil
		}
	}
	if err := d.Queue(ctx, p, n, after); err != nil || !chained {
		return err
	}
	all, err := kernels.ToI32(ops, p.Tokens)
	if err != nil {
		return err
	}
	zs, err := kernels.ToF32(ops, p.Z)
	if err != nil {
		return err
	}
	for j := range n {
		if !take(j, all[j*b:(j+1)*b], zs[j*b:(j+1)*b]) {
			break
		}
	}
	return nil
}

// dsparkLayout is where a pass over b sequences finds its index arrays in
// its layout buffer (I32 offsets, each array 16-byte aligned), for nt =
// BlockSize*b block rows: each block row's position [nt], KV slot [nt],
// each sequence's context slot [b], and the attention layout in which
// each block row is a one-query sequence over its own sequence's k+1 keys
// (the context, then the block): cu_seqlens_q [nt+1], seqlens_k [nt],
// block tables [nt] (one "block" of k+1 slots per sequence).
type dsparkLayout struct{ pos, slots, ctxSlots, cu, seqK, tables, size int }

func (d *DSpark) layout(b int) dsparkLayout {
	nt := d.cfg.BlockSize * b
	var l dsparkLayout
	at := 0
	next := func(n int) int {
		o := at
		at += (n + 3) &^ 3
		return o
	}
	// The context slots follow the block rows' slots directly, so that one
	// cache write takes a layer's block and context keys together.
	l.pos, l.slots, l.cu, l.seqK, l.tables = next(nt), next(nt+b), next(nt+1), next(nt), next(nt)
	l.ctxSlots = l.slots + nt
	l.size = at
	return l
}

// LayoutSize is the length (I32 elements) of the layout buffer of a pass
// over b sequences (DSparkPass.Layout).
func (d *DSpark) LayoutSize(b int) int { return d.layout(b).size }

// FillLayout writes the index arrays of a pass over b sequences into
// host[:LayoutSize(b)]: each block row's position and KV slot in the
// pass's own small cache, each sequence's context slot, and the
// attention layout that makes the block bidirectional. They depend on b
// and the block size only, so a caller that replays passes of b
// sequences uploads them once.
func (d *DSpark) FillLayout(host []int32, b int) {
	l, k := d.layout(b), d.cfg.BlockSize
	stride := k + 1
	clear(host[:l.size])
	for s := range b {
		host[l.ctxSlots+s] = int32(s * stride)
		for j := range k {
			r := j*b + s
			host[l.pos+r], host[l.slots+r], host[l.tables+r] = int32(j), int32(s*stride+1+j), int32(s)
			host[l.cu+r+1], host[l.seqK+r] = int32(r+1), int32(stride)
		}
	}
}

// DSparkPass is one drafting pass over B sequences in backend memory.
type DSparkPass struct {
	// Feat [B, target hidden] (the activation dtype) is each sequence's
	// conditioning state: the target's Forward output at the row before
	// its last token. The pass normalizes it in place.
	Feat   kernels.Tensor
	Last   kernels.Tensor // I32 [B]: each sequence's last token
	Layout kernels.Tensor // I32 [LayoutSize(B)]: FillLayout's arrays
	// Tokens (I32 [>= n*B]) and Z (F32 [>= n*B, 1]) receive draft j of
	// sequence s and its confidence logit (Confidence) at j*B+s. Z nil
	// skips the confidence head, for a caller that does not gate.
	Tokens, Z kernels.Tensor
}

// Queue queues a drafting pass of n <= BlockSize positions over p: the
// block's layers over BlockSize rows a sequence, then position by
// position the Markov correction (a row of the precomputed table where
// the drafter has one) and the argmax of the shared final norm and LM
// head (each position's drafts feed the next position on the device), and
// the confidence head (none when p.Z is nil; once over all positions when
// after is nil). It uploads and
// reads nothing, so a CUDA graph can capture it; rows of p are
// independent, so padding rows (any finite Feat, any token of the
// vocabulary) change no other row.
// after, when not nil, is called once position j is queued, and a true
// return ends the pass there (a caller that reads each position's
// confidences on a synchronous backend skips the positions no gate would
// keep). Cost: the block's layers over BlockSize*B rows, then per
// position one LM-head row a sequence (2*B*vocab*hidden flops).
func (d *DSpark) Queue(ctx context.Context, p *DSparkPass, n int, after func(j int) (stop bool, err error)) error {
	b := 0
	if p.Last != nil {
		b = kernels.NumElements(p.Last)
	}
	switch {
	case n < 0 || n > d.cfg.BlockSize:
		return fmt.Errorf("models: dspark: %d positions, block size %d: %w", n, d.cfg.BlockSize, ErrBatch)
	case b == 0 || p.Feat == nil || len(p.Feat.Shape()) != 2 || p.Feat.Shape()[0] != b || p.Feat.Shape()[1] != d.cfg.TargetHiddenSize:
		return fmt.Errorf("models: dspark: features %v for %d sequences of target hidden size %d: %w", shapeOf(p.Feat), b, d.cfg.TargetHiddenSize, ErrBatch)
	case p.Layout == nil || kernels.NumElements(p.Layout) != d.LayoutSize(b):
		return fmt.Errorf("models: dspark: layout %v, want %d elements for %d sequences: %w", shapeOf(p.Layout), d.LayoutSize(b), b, ErrBatch)
	case p.Tokens == nil || kernels.NumElements(p.Tokens) < n*b || (p.Z != nil && kernels.NumElements(p.Z) < n*b):
		return fmt.Errorf("models: dspark: tokens %v and z %v for %d positions of %d sequences: %w", shapeOf(p.Tokens), shapeOf(p.Z), n, b, ErrBatch)
	}
	if n == 0 {
		return nil
	}
	x, err := d.block(p, b)
	if err != nil {
		return fmt.Errorf("models: dspark: %w", err)
	}
	if err := d.correct(ctx, p, x, b, n, after); err != nil {
		return fmt.Errorf("models: dspark: %w", err)
	}
	return nil
}

func shapeOf(t kernels.Tensor) any {
	if t == nil {
		return "nil"
	}
	return t.Shape()
}

// block runs the parallel pass and returns the block's rows before the
// Markov correction, [k*b, hidden], position-major (row j*b+s is position
// j of sequence s).
func (d *DSpark) block(p *DSparkPass, b int) (kernels.Tensor, error) {
	ops, cfg := d.ops, &d.cfg
	k, h := cfg.BlockSize, cfg.HiddenSize
	att, nt := cfg.NumAttentionHeads*cfg.HeadDim, k*b
	stride := k + 1
	l := d.layout(b)
	var err error
	rows := func(t kernels.Tensor, lo, hi int) kernels.Tensor {
		var v kernels.Tensor
		if err == nil {
			v, err = ops.Rows(t, lo, hi)
		}
		return v
	}
	view := func(off, n int) kernels.Tensor { return rows(p.Layout, off, off+n) }
	posT, slotsT, allSlotsT := view(l.pos, nt), view(l.slots, nt), view(l.slots, nt+b)
	meta := kernels.AttentionMetadata{NumSeqs: nt, NumTokens: nt, MaxSeqlenQ: 1, MaxSeqlenK: stride, BlockSize: stride,
		CuSeqlensQ: view(l.cu, nt+1), SeqlensK: view(l.seqK, nt), SlotMapping: slotsT}
	if tables := view(l.tables, nt); err == nil {
		meta.BlockTables, err = ops.Reshape(tables, nt, 1)
	}
	if err != nil {
		return nil, err
	}

	s := newScratch(ops)
	c := s.get("dspark.c", b, h)
	x, e := s.get("dspark.x", nt, h), s.get("dspark.e", b, h)
	// The normalized block rows, then the normalized context rows, in one
	// buffer: the key and value projections take both in one product, and
	// their outputs go to the cache in one write (their slots are
	// adjacent in the layout).
	xcn := s.get("dspark.xcn", nt+b, h)
	q, kAll, vAll := s.get("dspark.q", nt, att), s.get("dspark.k", nt+b, att), s.get("dspark.v", nt+b, att)
	attn := s.get("dspark.attn", nt, att)
	delta := s.get("dspark.delta", nt, h)
	gu, act := s.get("dspark.gu", nt, 2*cfg.IntermediateSize), s.get("dspark.act", nt, cfg.IntermediateSize)
	if s.err != nil {
		return nil, s.err
	}
	xn, cn := rows(xcn, 0, nt), rows(xcn, nt, nt+b)
	if err != nil {
		return nil, err
	}
	cacheDT := ops.ActivationDType()
	if kd, ok := ops.(kernels.KVCacheDTyper); ok {
		cacheDT = kd.KVCacheDType(d.layers[0].o.DType())
	}
	// Zero-filled, though the layout writes all k+1 slots of a row: an
	// attention kernel may load a whole tile of keys past a row's last and
	// weigh them by a probability of 0, and 0 times stale NaN bytes is NaN.
	// (On an H100 with NaN-filled allocations the drafts keep their bits.)
	kCache, err := ops.Alloc(cacheDT, b, stride, att)
	if err != nil {
		return nil, err
	}
	vCache, err := ops.Alloc(cacheDT, b, stride, att)
	if err != nil {
		return nil, err
	}
	steps := []func() error{
		func() error { return ops.RMSNorm(p.Feat, p.Feat, d.ctxNorm, d.eps) },
		func() error { return ops.Linear(c, p.Feat, d.ctxProj, nil) },
		func() error { return ops.Embedding(x, d.blockEmbed, posT) },
		func() error { return ops.Embedding(e, d.target.embed, p.Last) },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return nil, err
		}
	}
	x0, err := ops.Rows(x, 0, b)
	if err != nil {
		return nil, err
	}
	if err := ops.Add(x0, x0, e); err != nil {
		return nil, err
	}
	ap := kernels.AttentionParams{NumHeads: cfg.NumAttentionHeads, NumKVHeads: cfg.NumAttentionHeads, HeadDim: cfg.HeadDim,
		Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim)))}
	// Each layer's input norm is the previous layer's last step, fused
	// with its residual add (AddRMSNorm), and the MLP is one gated MLP
	// where the backend has one: the operations of a pass are launches
	// on a GPU, and at decode batch sizes their count sets its time.
	gated, fused := ops.(kernels.GatedMLPer)
	if err := ops.RMSNorm(xn, x, d.layers[0].inputNorm, d.eps); err != nil {
		return nil, err
	}
	for i := range d.layers {
		ly := &d.layers[i]
		ap.InputDType = ly.o.DType()
		steps := []func() error{
			func() error { return ops.RMSNorm(cn, c, ly.contextNorm, d.eps) },
			func() error { return ops.Linear(q, xn, ly.q, nil) },
			func() error { return ops.Linear(kAll, xcn, ly.k, nil) },
			func() error { return ops.Linear(vAll, xcn, ly.v, nil) },
			func() error { return ops.WriteCache(kCache, kAll, allSlotsT, 0) },
			func() error { return ops.WriteCache(vCache, vAll, allSlotsT, 0) },
			func() error { return ops.Attention(attn, q, kCache, vCache, &meta, ap) },
			func() error { return ops.Linear(delta, attn, ly.o, nil) },
			func() error { return ops.AddRMSNorm(xn, x, delta, ly.postNorm, d.eps) },
		}
		if fused {
			steps = append(steps, func() error { return gated.GatedMLP(delta, xn, ly.gateUp, ly.down, gu, act) })
		} else {
			steps = append(steps,
				func() error { return ops.Linear(gu, xn, ly.gateUp, nil) },
				func() error { return ops.SiLUMul(act, gu) },
				func() error { return ops.Linear(delta, act, ly.down, nil) })
		}
		if i+1 < len(d.layers) {
			steps = append(steps, func() error { return ops.AddRMSNorm(xn, x, delta, d.layers[i+1].inputNorm, d.eps) })
		} else {
			steps = append(steps, func() error { return ops.Add(x, x, delta) })
		}
		for _, f := range steps {
			if err := f(); err != nil {
				return nil, fmt.Errorf("layer %d: %w", i, err)
			}
		}
	}
	return x, nil
}

// correct queues the Markov correction and the shared LM head position by
// position (each needs the draft before it) into p.Tokens, and the
// confidence head into p.Z: with each position when after (not nil) is
// to read it, else once over all n positions' rows at the end, four
// operations a pass instead of four a position. after is called once each
// position is queued, and the pass stops when it says so.
func (d *DSpark) correct(ctx context.Context, p *DSparkPass, x kernels.Tensor, b, n int, after func(int) (bool, error)) error {
	ops, cfg := d.ops, &d.cfg
	h, r, c := cfg.HiddenSize, cfg.MarkovRank, cfg.ConfidenceHiddenSize
	// Without a caller that reads each position, the confidence head runs
	// once over every position's corrected rows, kept in gs, after the
	// last position (its operations are row by row: the same bits).
	batched := after == nil && p.Z != nil
	confRows := b
	if batched {
		confRows = n * b
	}
	s := newScratch(ops)
	gs, gf := s.get("dspark.g", confRows, h), s.get("dspark.gf", b, h)
	var gn, f1, fa, m, md, ma kernels.Tensor
	if p.Z != nil {
		gn, f1 = s.get("dspark.gn", confRows, h), s.get("dspark.f1", confRows, 2*c)
		fa = s.get("dspark.fa", confRows, c)
	}
	if d.markovTable == nil {
		m, md = s.get("dspark.m", b, cfg.TargetHiddenSize), s.get("dspark.md", b, 2*r)
		ma = s.get("dspark.ma", b, r)
	}
	if s.err != nil {
		return s.err
	}
	logits, err := kernels.AllocEmpty(ops, kernels.F32, b, cfg.VocabSize) // the LM head writes every row
	if err != nil {
		return err
	}
	// confidence runs the confidence head over rows g, which are the
	// corrected rows of Z's rows [lo, hi).
	confidence := func(g kernels.Tensor, lo, hi int) error {
		z, err := ops.Rows(p.Z, lo, hi)
		if err != nil {
			return err
		}
		for _, f := range []func() error{
			func() error { return ops.RMSNorm(gn, g, d.confNorm, d.eps) },
			func() error { return ops.Linear(f1, gn, d.confFC1, nil) },
			func() error { return ops.SiLUMul(fa, f1) },
			func() error { return ops.Linear(z, fa, d.confFC2, d.confBias) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
	for j := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Position j's Markov input is the draft at j-1 (the last token
		// at 0).
		ids := p.Last
		if j > 0 {
			if ids, err = ops.Rows(p.Tokens, (j-1)*b, j*b); err != nil {
				return err
			}
		}
		next, err := ops.Rows(p.Tokens, j*b, (j+1)*b)
		if err != nil {
			return err
		}
		xj, err := ops.Rows(x, j*b, (j+1)*b)
		if err != nil {
			return err
		}
		g := gs
		if batched {
			if g, err = ops.Rows(gs, j*b, (j+1)*b); err != nil {
				return err
			}
		}
		var steps []func() error
		if d.markovTable != nil {
			steps = []func() error{func() error { return ops.Embedding(g, d.markovTable, ids) }}
		} else {
			steps = []func() error{
				func() error { return ops.Embedding(m, d.target.embed, ids) },
				func() error { return ops.Linear(md, m, d.markovDown, nil) },
				func() error { return ops.SiLUMul(ma, md) },
				func() error { return ops.Linear(g, ma, d.markovUp, nil) },
			}
		}
		// g += x_j, normalized by the target's final norm into gf (one
		// operation where Add and Logits' own norm would be two), then the
		// LM head.
		steps = append(steps,
			func() error { return ops.AddRMSNorm(gf, g, xj, d.target.finalNorm, d.target.eps) },
			func() error { return ops.Linear(logits, gf, d.target.lmHead, nil) })
		if p.Z != nil && !batched {
			steps = append(steps, func() error { return confidence(g, j*b, (j+1)*b) })
		}
		steps = append(steps, func() error { return kernels.ArgmaxInto(ops, next, logits) })
		for _, f := range steps {
			if err := f(); err != nil {
				return fmt.Errorf("position %d: %w", j, err)
			}
		}
		if after != nil {
			stop, err := after(j)
			if err != nil || stop {
				return err
			}
		}
	}
	if batched {
		if err := confidence(gs, 0, n*b); err != nil {
			return fmt.Errorf("confidence: %w", err)
		}
	}
	return nil
}

// uploadI32 copies several I32 arrays to the backend in one transfer and
// returns a one-dimensional view of each.
func uploadI32(ops kernels.Ops, parts [][]int32) ([]kernels.Tensor, error) {
	offsets, total := make([]int, len(parts)), 0
	for i, p := range parts {
		offsets[i] = total
		total += (len(p) + 3) &^ 3
	}
	packed := make([]int32, total)
	for i, p := range parts {
		copy(packed[offsets[i]:], p)
	}
	flat, err := kernels.FromI32(ops, packed, total)
	if err != nil {
		return nil, err
	}
	out := make([]kernels.Tensor, len(parts))
	for i, p := range parts {
		if out[i], err = ops.Rows(flat, offsets[i], offsets[i]+len(p)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
