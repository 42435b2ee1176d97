package llm

import (
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/weights"
)

// modelShape reads the sizes the FLOPs estimator needs from config.json.
// weightBytes is the stored size of one weight, kvBytes of one cache element.
func modelShape(c *weights.Config, weightBytes, kvBytes float64) engine.ModelShape {
	s := engine.ModelShape{
		NumLayers:         c.NumHiddenLayers,
		Hidden:            c.HiddenSize,
		NumHeads:          c.NumAttentionHeads,
		NumKVHeads:        c.NumKeyValueHeads,
		HeadDim:           c.HeadDim,
		Intermediate:      c.IntermediateSize,
		Vocab:             c.VocabSize,
		TieWordEmbeddings: c.TieWordEmbeddings,
		WeightBytes:       weightBytes,
		KVBytes:           kvBytes,
	}
	if c.KVLoraRank > 0 && c.QKNopeHeadDim > 0 {
		s.QLoraRank, s.KVLoraRank = c.QLoraRank, c.KVLoraRank
		s.QKNopeHeadDim, s.QKRopeHeadDim, s.VHeadDim = c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim
	}
	if c.NRoutedExperts > 0 {
		s.NumExperts, s.NumExpertsPerTok = c.NRoutedExperts, c.NumExpertsPerTok
		s.NumSharedExperts, s.MoEIntermediate = c.NSharedExperts, c.MoEIntermediateSize
		s.NumDenseLayers = min(c.FirstKDenseReplace, c.NumHiddenLayers)
	}
	return s
}
