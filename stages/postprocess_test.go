package stages

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// A sequence that finishes on a token that leaves a character incomplete
// still gets that token's text: post-processing flushes what the decode
// stream holds back, so the outputs add up to the full decode.
func TestPostprocessFlushesTheLastCharacter(t *testing.T) {
	dir := filepath.Join("..", ".cache", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("no Qwen3 tokenizer (scripts/fetch-tokenizers.sh fetches it): %v", err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The byte-level token of 0xE6 alone: the first byte of "日".
	lead, ok := tok.TokenToID("æ")
	if !ok {
		t.Fatal("no byte token for 0xE6")
	}
	prompt := tok.Encode("hi", false)
	for _, tc := range []struct {
		name string
		out  []int
	}{
		{"ends inside a character", []int{lead}},
		{"ends after a whole one", tok.Encode("日", false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var text strings.Builder
			finished := false
			resp := NewResponder()
			params := engine.DefaultSamplingParams()
			params.MaxTokens, params.IgnoreEOS = len(tc.out), true
			if err := resp.Add(&engine.Request{ID: "r", Params: params, OnOutput: func(o engine.RequestOutput) {
				text.WriteString(o.Text)
				finished = finished || o.Finished
			}}); err != nil {
				t.Fatal(err)
			}
			p := NewPostprocess(PostprocessDeps{Tokenizer: tok, Responder: resp, MaxModelLen: 1000})
			tokens := append([]int(nil), prompt...)
			for i, id := range tc.out {
				meta := engine.SequenceMetadata{SeqID: 1, RequestID: "r", TokenIDs: append([]int(nil), tokens...),
					NumPromptTokens: len(prompt), Params: &params, InputFromRow: -1, Sample: true}
				step := &SampledStep{
					ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{
						ScheduledStep: &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: engine.StepID(i + 1)}, Seqs: []engine.SequenceMetadata{meta}},
						Rows:          []RowRef{{Meta: &meta, SeqID: 1, RequestID: "r"}},
					}},
					Samples: []Sample{{Token: id}},
				}
				if _, err := p.Process(context.Background(), step); err != nil {
					t.Fatal(err)
				}
				tokens = append(tokens, id)
			}
			want := strings.TrimPrefix(tok.Decode(tokens, false), tok.Decode(prompt, false))
			if !finished || text.String() != want || want == "" {
				t.Errorf("outputs %q (finished %v), want %q, the full decode past the prompt", text.String(), finished, want)
			}
		})
	}
}
