package models

import (
	"context"
	"fmt"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// MTP is DeepSeek-V3's multi-token-prediction module, loaded from the layers
// stored after the main ones (model.layers.<num_hidden_layers + k>.*). Layer k
// combines the normalized embedding of token i+k+1 with the normalized hidden
// state of position i (from the main model for k = 0, from MTP layer k-1
// after), runs one full decoder layer with its own latent KV cache, and
// predicts token i+k+2 through its shared head. Speculative decoding drives it.
type MTP struct {
	m      *deepseek
	layers []mtpLayer
}

type mtpLayer struct {
	embed        kernels.Tensor // the layer's own embed_tokens, or the model's
	enorm, hnorm kernels.Tensor
	ehProj       kernels.Tensor // [hidden, 2*hidden]: applied to [enorm(e), hnorm(h)]
	headNorm     kernels.Tensor // shared_head.norm
	head         kernels.Tensor // shared_head.head, or the model's LM head
	block        dsLayer
}

func (m *deepseek) loadMTP(l *loader) *MTP {
	cfg, h := m.cfg, m.cfg.HiddenSize
	mtp := &MTP{m: m}
	for k := range cfg.NumNextNPredictLayers {
		i := cfg.NumHiddenLayers + k
		p := fmt.Sprintf("model.layers.%d.", i)
		ly := mtpLayer{
			embed:    m.embed,
			head:     m.lmHead,
			enorm:    l.vector(p+"enorm.weight", h),
			hnorm:    l.vector(p+"hnorm.weight", h),
			ehProj:   l.matrix(p+"eh_proj.weight", h, 2*h),
			headNorm: l.vector(p+"shared_head.norm.weight", h),
			block:    m.loadLayer(l, i),
		}
		// DeepSeek's checkpoints store the layer's embedding and head as
		// copies of the model's (the MTP module shares them): a copy that
		// is the same bytes is not loaded again, which keeps the memory
		// and, at every drafting pass, the caches for other weights.
		lmHead := "lm_head.weight"
		if cfg.TieWordEmbeddings {
			lmHead = "model.embed_tokens.weight"
		}
		if name := p + "embed_tokens.weight"; l.src.Has(name) && !l.sameStored(name, "model.embed_tokens.weight") {
			ly.embed = l.matrix(name, cfg.VocabSize, h)
		}
		if name := p + "shared_head.head.weight"; l.src.Has(name) && !l.sameStored(name, lmHead) {
			ly.head = l.matrix(name, cfg.VocabSize, h)
		}
		mtp.layers = append(mtp.layers, ly)
	}
	return mtp
}

// NumLayers is the number of prediction depths.
func (p *MTP) NumLayers() int { return len(p.layers) }

// KVCacheSpec describes the MTP layers' own latent cache (one layer per depth).
func (p *MTP) KVCacheSpec() KVCacheSpec {
	s := p.m.KVCacheSpec()
	s.NumLayers = len(p.layers)
	return s
}

// NewKVCache allocates the MTP layers' cache.
func (p *MTP) NewKVCache(numBlocks, blockSize int) (*KVCache, error) {
	return NewKVCache(p.m.ops, p.KVCacheSpec(), numBlocks, blockSize)
}

// Forward runs depth k. b carries, for each row, the id of the token one
// position ahead of the row's position (the token the previous depth
// predicts) with the row's own position and attention metadata over the MTP
// cache; hidden [num_tokens, hidden_size] is the previous depth's output for
// the same rows (for k = 0, the main model's Forward output: its last hidden
// state before the final norm). It returns the depth's output hidden states,
// the input of depth k+1 and of ComputeLogits.
func (p *MTP) Forward(ctx context.Context, k int, cache *KVCache, b *ForwardBatch, hidden kernels.Tensor) (kernels.Tensor, error) {
	if k < 0 || k >= len(p.layers) {
		return nil, fmt.Errorf("models: mtp depth %d of %d: %w", k, len(p.layers), ErrBatch)
	}
	if err := cache.check(p.KVCacheSpec()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m, ly := p.m, &p.layers[k]
	ops, t, h := m.ops, b.NumTokens, m.cfg.HiddenSize
	s := newScratch(ops)
	e, hn, cat := s.get("mtp.e", t, h), s.get("mtp.h", t, h), s.get("mtp.cat", t, 2*h)
	resid, delta := s.get("resid", t, h), s.get("delta", t, h)
	if s.err != nil {
		return nil, s.err
	}
	if err := p.combine(ly, e, hn, cat, resid, hidden, b); err != nil {
		return nil, fmt.Errorf("models: %s: mtp depth %d: %w", m.arch, k, err)
	}
	if err := m.layer(&ly.block, true, cache.K[k], s, b, resid, delta); err != nil {
		return nil, fmt.Errorf("models: %s: mtp depth %d: %w", m.arch, k, err)
	}
	out, err := kernels.AllocEmpty(ops, ops.ActivationDType(), t, h) // Add writes every element
	if err != nil {
		return nil, err
	}
	if err := ops.Add(out, resid, delta); err != nil {
		return nil, err
	}
	return out, nil
}

// combine writes eh_proj([enorm(embed(ids)), hnorm(hidden)]) into resid.
func (p *MTP) combine(ly *mtpLayer, e, hn, cat, resid, hidden kernels.Tensor, b *ForwardBatch) error {
	ops, eps := p.m.ops, p.m.eps
	// The embedding, both norms and the concat: one operation where the
	// backend has it (kernels.EmbedNormConcater).
	if err := kernels.EmbedNormConcat(ops, cat, e, hn, ly.embed, b.InputIDs, ly.enorm, hidden, ly.hnorm, eps); err != nil {
		return err
	}
	return ops.Linear(resid, cat, ly.ehProj, nil)
}

// ComputeLogits applies depth k's shared head (its norm, then the head) to
// the given rows (nil: all) of that depth's output.
func (p *MTP) ComputeLogits(k int, hidden, rows kernels.Tensor) (kernels.Tensor, error) {
	if k < 0 || k >= len(p.layers) {
		return nil, fmt.Errorf("models: mtp depth %d of %d: %w", k, len(p.layers), ErrBatch)
	}
	ly := &p.layers[k]
	return logits(p.m.ops, hidden, rows, ly.headNorm, ly.head, p.m.eps)
}
