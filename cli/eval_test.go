package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
	"github.com/deepinfer/deepinfer-go/llm"
)

// The shipped default model and the references HF transformers produced for
// it on the GPU machine when it was trained (tools/train/train.py).
const (
	defaultModelDir = "../assets/deepseek-tiny"
	defaultModelRef = "../testdata/deepseek-tiny"
)

// defaultModelReference is testdata/deepseek-tiny/reference.json, the part
// the tests read.
type defaultModelReference struct {
	Window int `json:"window"`
	Sample struct {
		Tokens       int       `json:"tokens"`
		NLL          float64   `json:"nll"`
		PPL          float64   `json:"ppl"`
		IDs          []int     `json:"ids"`
		WindowNLL    []float64 `json:"window_nll"`
		WindowTokens []int     `json:"window_tokens"`
	} `json:"sample"`
	Greedy struct {
		NewTokens int `json:"new_tokens"`
		Prompts   []struct {
			Src     string    `json:"src"`
			IDs     []int     `json:"ids"`
			Greedy  []int     `json:"greedy"`
			Margins []float64 `json:"margins"`
		} `json:"prompts"`
	} `json:"greedy"`
	Tokenizer []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"tokenizer"`
	Chat struct {
		Messages []tokenizer.Message `json:"messages"`
		Rendered string              `json:"rendered"`
	} `json:"chat"`
}

func TestEvalWindows(t *testing.T) {
	ids := []int{10, 11, 12, 13, 14, 15, 16}
	cases := []struct {
		name      string
		bos, size int
		want      [][]int
		wantErr   bool
	}{
		{"bos", 0, 4, [][]int{{0, 10, 11, 12}, {0, 13, 14, 15}, {0, 16}}, false},
		{"bos exact", 0, 8, [][]int{{0, 10, 11, 12, 13, 14, 15, 16}}, false},
		{"no bos", -1, 3, [][]int{{10, 11, 12}, {13, 14, 15}}, false}, // a lone last token has no context
		{"window too small", 0, 1, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := evalWindows(ids, c.bos, c.size)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("windows = %v, want %v", got, c.want)
			}
		})
	}
	if _, err := evalWindows(nil, 0, 4); err == nil {
		t.Error("no tokens: want an error")
	}
}

func loadDefaultModelReference(t *testing.T) defaultModelReference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(defaultModelRef, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref defaultModelReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if ref.Window < 2 || ref.Sample.Tokens == 0 || len(ref.Greedy.Prompts) == 0 || len(ref.Tokenizer) == 0 {
		t.Fatalf("reference.json lacks figures: window %d, %d sample tokens, %d prompts, %d tokenizer cases",
			ref.Window, ref.Sample.Tokens, len(ref.Greedy.Prompts), len(ref.Tokenizer))
	}
	return ref
}

func newDefaultModelLLM(t *testing.T) *llm.LLM {
	t.Helper()
	dir, err := filepath.Abs(defaultModelDir)
	if err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("model: %q\ncpu: {threads: 2}\ncache: {num_blocks: 256, block_size: 16}\n"+
		"engine: {max_num_seqs: 32, max_num_batched_tokens: 2048}\n", dir)
	cfg, err := config.Parse("default-model-test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	l, err := llm.NewLLM(cfg, llm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestDefaultModelParity checks the shipped model under the engine (CPU)
// against HF transformers (bf16 weights computed in float32) and HF
// tokenizers: the tokenizer on the committed held-out sample, a few strings
// and the chat template; the held-out perplexity of the sample within 1%;
// greedy continuations of 20 held-out prompts token for token.
func TestDefaultModelParity(t *testing.T) {
	ref := loadDefaultModelReference(t)
	l := newDefaultModelLLM(t)
	tok := l.Tokenizer()
	sample, err := os.ReadFile(filepath.Join(defaultModelRef, "heldout_sample.txt"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("tokenizer", func(t *testing.T) {
		for i, c := range ref.Tokenizer {
			got := tok.Encode(c.Text, true)
			if !reflect.DeepEqual(got, c.IDs) {
				t.Errorf("case %d %q: ids %v, HF %v", i, c.Text, got, c.IDs)
			}
		}
		if got := tok.Encode(string(sample), false); !reflect.DeepEqual(got, ref.Sample.IDs) {
			t.Errorf("held-out sample: %d ids, HF %d; first difference at %d", len(got), len(ref.Sample.IDs), firstDiff(got, ref.Sample.IDs))
		}
		if ref.Chat.Rendered == "" {
			t.Fatal("reference.json has no chat template render")
		}
		got, err := tok.ApplyChatTemplate(ref.Chat.Messages, true)
		if err != nil {
			t.Fatal(err)
		}
		if got != ref.Chat.Rendered {
			t.Errorf("chat template renders %q, transformers %q", got, ref.Chat.Rendered)
		}
	})

	t.Run("perplexity", func(t *testing.T) {
		r, ids, err := heldOutPerplexity(context.Background(), l, string(sample), ref.Window, true)
		if err != nil {
			t.Fatal(err)
		}
		if r.NumTokens != ref.Sample.Tokens || len(ids) != ref.Sample.Tokens {
			t.Fatalf("%d scored tokens (%d ids), HF %d", r.NumTokens, len(ids), ref.Sample.Tokens)
		}
		rel := math.Abs(r.Perplexity-ref.Sample.PPL) / ref.Sample.PPL
		t.Logf("perplexity %.6f, HF %.6f (relative difference %.2e) over %d tokens", r.Perplexity, ref.Sample.PPL, rel, r.NumTokens)
		if rel > 0.01 {
			t.Errorf("perplexity %.6f differs from HF's %.6f by %.3g%% > 1%%", r.Perplexity, ref.Sample.PPL, 100*rel)
		}
		for i := range ref.Sample.WindowNLL {
			if r.WindowTokens[i] != ref.Sample.WindowTokens[i] {
				t.Errorf("window %d: %d tokens, HF %d", i, r.WindowTokens[i], ref.Sample.WindowTokens[i])
			}
			if d := math.Abs(r.WindowNLL[i] - ref.Sample.WindowNLL[i]); d > 0.01*ref.Sample.WindowNLL[i] {
				t.Errorf("window %d: nll %.4f, HF %.4f", i, r.WindowNLL[i], ref.Sample.WindowNLL[i])
			}
		}
	})

	t.Run("greedy", func(t *testing.T) {
		params := engine.DefaultSamplingParams()
		params.Temperature = 0
		params.MaxTokens = ref.Greedy.NewTokens
		params.IgnoreEOS = true // as the reference: plain argmax, EOS not special
		prompts := make([]llm.Prompt, len(ref.Greedy.Prompts))
		for i, p := range ref.Greedy.Prompts {
			prompts[i] = llm.Prompt{IDs: p.IDs}
		}
		res, err := l.Generate(context.Background(), prompts, params, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range res {
			o := c.Outputs[0]
			if o.Err != nil {
				t.Fatalf("prompt %d: %v", i, o.Err)
			}
			want := ref.Greedy.Prompts[i]
			if !reflect.DeepEqual(o.TokenIDs, want.Greedy) {
				k := firstDiff(o.TokenIDs, want.Greedy)
				t.Errorf("prompt %d (%s): greedy token %d is %v, HF %d (HF top-2 margin there %.2e)\nours %v\nHF   %v",
					i, want.Src, k, at(o.TokenIDs, k), want.Greedy[k], want.Margins[k], o.TokenIDs, want.Greedy)
			}
		}
	})
}

// firstDiff is the first index where a and b differ (len of the shorter if
// one is a prefix of the other).
func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func at(ids []int, i int) any {
	if i < len(ids) {
		return ids[i]
	}
	return "none"
}
