package llm

import (
	"time"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/grammar"
	"github.com/deepinfer/deepinfer-go/engine/structured"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/stages"
)

// newGrammarCompiler returns the compiler of the requests' structured-output
// constraints over the tokenizer's vocabulary (config structured_output).
// Cost: one pass over the vocabulary; the vocabulary's byte trie is built by
// the first compile.
func newGrammarCompiler(tok *tokenizer.Tokenizer, eos []int, c config.StructuredOutput) (stages.GrammarCompiler, error) {
	v, err := grammar.NewVocab(tok, eos)
	if err != nil {
		return nil, err
	}
	return structured.NewCompiler(v, structured.Options{
		Workers: c.Workers, CacheSize: c.CacheSize,
		Timeout: time.Duration(c.CompileTimeoutS * float64(time.Second)),
	})
}
