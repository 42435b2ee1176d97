package llm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// drafterSetup is what speculative decoding adds to the engine: the draft
// stage's environment, the drafter's own KV cache (allocated once the
// number of blocks is known: it shares the target's block layout) and the
// lookahead slots the scheduler reserves for a drafter that writes KV
// past a step's tokens.
type drafterSetup struct {
	env       stages.Speculative
	cacheSpec *models.KVCacheSpec
	newCache  func(numBlocks, blockSize int) (*models.KVCache, error)
	lookahead int
}

// loadDrafter prepares cfg.Speculative's drafter for model: mtp needs the
// model's MTP layers, draft_model loads the drafter's directory and checks
// that it shares the model's vocabulary (size, and every token's string
// when both ship a tokenizer), dspark loads the DSpark drafter trained for
// the model (it shares the model's embedding and LM head, and keeps no KV
// cache). Errors name what is wrong.
func loadDrafter(cfg *config.Config, ops kernels.Ops, model models.Model, tok *tokenizer.Tokenizer, reg *models.Registry, maxModelLen int) (drafterSetup, error) {
	sp := cfg.Speculative
	if !sp.Enabled() {
		return drafterSetup{}, nil
	}
	d := drafterSetup{env: stages.Speculative{NumSpeculativeTokens: sp.NumSpeculativeTokens,
		PromptLookupMin: sp.PromptLookupMin, PromptLookupMax: sp.PromptLookupMax, DisableBatchSize: sp.DisableByBatchSize, Adaptive: sp.Adaptive,
		VerifyOnDevice: cfg.ZOS.Enabled && !insertsAfter(cfg.Pipeline.Insert, "sample", "verify", "draft")}}
	switch sp.Method {
	case "mtp":
		mtp := model.MTP()
		if mtp == nil || mtp.NumLayers() == 0 {
			return d, fmt.Errorf("llm: %w: speculative.method mtp: model %s has no MTP layers (config num_nextn_predict_layers is 0, or the checkpoint holds none)",
				config.ErrInvalid, cfg.Model)
		}
		s := mtp.KVCacheSpec()
		d.cacheSpec, d.newCache, d.lookahead = &s, mtp.NewKVCache, sp.NumSpeculativeTokens
	case "draft_model":
		dm, err := reg.Load(ops, sp.DraftModel, models.Options{MaxModelLen: maxModelLen})
		if err != nil {
			return d, fmt.Errorf("llm: speculative.draft_model: %w", err)
		}
		if err := sameVocabulary(model, dm, tok, sp.DraftModel); err != nil {
			return d, fmt.Errorf("llm: %w: speculative.draft_model %s: %w", config.ErrInvalid, sp.DraftModel, err)
		}
		s := dm.KVCacheSpec()
		d.env.DraftModel = dm
		d.cacheSpec, d.newCache, d.lookahead = &s, dm.NewKVCache, sp.NumSpeculativeTokens
	case "dspark":
		ds, err := models.LoadDSpark(ops, sp.DraftModel, model)
		if err != nil {
			return d, fmt.Errorf("llm: %w: speculative.draft_model %s: %w", config.ErrInvalid, sp.DraftModel, err)
		}
		d.env.DSpark = ds
		d.env.ConfidenceThreshold = sp.ConfidenceThreshold
		d.env.MaxVerifyTokensPerStep = sp.MaxVerifyTokensPerStep.Tokens
		d.env.VerifyBudgetAuto = sp.MaxVerifyTokensPerStep.Auto
	}
	return d, nil
}

// sameVocabulary checks that a draft model can draft for target: the same
// vocabulary size, and, when both ship a tokenizer, the same string for
// every token id.
func sameVocabulary(target, draft models.Model, tok *tokenizer.Tokenizer, dir string) error {
	if a, b := target.Config().VocabSize, draft.Config().VocabSize; a != b {
		return fmt.Errorf("vocab_size %d differs from the model's %d: the drafter must share the model's tokenizer", b, a)
	}
	if tok == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		return nil // the drafter ships no tokenizer of its own
	}
	other, err := tokenizer.Load(dir)
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	if a, b := tok.VocabSize(), other.VocabSize(); a != b {
		return fmt.Errorf("its tokenizer has %d tokens, the model's %d: the drafter must share the model's tokenizer", b, a)
	}
	for id := range tok.VocabSize() {
		a, _ := tok.IDToToken(id)
		b, _ := other.IDToToken(id)
		if a != b {
			return fmt.Errorf("token %d is %q in its tokenizer and %q in the model's: the drafter must share the model's tokenizer", id, b, a)
		}
	}
	return nil
}

// insertsAfter reports whether insert places a stage right after one of
// slots.
func insertsAfter(insert []pipeline.Insertion, slots ...string) bool {
	for _, in := range insert {
		if slices.Contains(slots, in.After) {
			return true
		}
	}
	return false
}
