package llm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

// Speculative decoding changes no token: the random workload (greedy and
// seeded sampling, n > 1, stop strings and ids, prefix-cache hits, and a
// cache small enough to preempt) gives the same outputs with each drafter,
// ZOS off and on, as without speculation. Sampled rows match too, not
// just in distribution: verification draws each row with the request's
// draw at that output position (see stages.verify), and the CPU kernels
// give a row the same bits in a verify batch as in a decode. Nothing
// leaks, and the drafts are really verified.
func TestSpeculativeSameTokens(t *testing.T) {
	dir := tinyLlama(t)
	writeCharTokenizer(t, dir)
	testSpeculativeSameTokens(t, dir, []struct{ method, draft string }{{"ngram", ""}, {"draft_model", dir}}, 2)
}

// The same on the shipped DeepSeek-V3-architecture model with its trained
// MTP layer.
func TestSpeculativeMTPSameTokens(t *testing.T) {
	testSpeculativeSameTokens(t, filepath.Join("..", "assets", "deepseek-tiny"), []struct{ method, draft string }{{"mtp", ""}}, 1)
}

func testSpeculativeSameTokens(t *testing.T, dir string, methods []struct{ method, draft string }, seeds uint64) {
	for seed := range seeds {
		w := randomWorkload(seed, 20)
		clear(w.abortAt) // an abort lands after a number of emitted tokens, which speculation batches
		run := func(method, draft string, zos, small bool) map[string]string {
			l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
				c.Pipeline.Impl = nil
				c.ZOS.Enabled = zos
				// The adaptive draft length switches lengths (and drafts off)
				// as it measures: with ZOS and the small cache it runs too.
				c.Speculative.Adaptive = zos && small
				c.Speculative.Method = method
				c.Speculative.DraftModel = draft
				c.Speculative.NumSpeculativeTokens = 3
				c.Speculative.PromptLookupMin = 1
				if small {
					c.Cache.NumBlocks = 16 // forces preemption
					// Prompts join the 8 sequences 3 at a time, so that
					// admissions wait beside verify rows and preemptions.
					c.Engine.AdmissionFraction = 0.3
				}
			}), Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := runWorkload(t, l, w)
			st := l.SchedulerStats()
			spec := l.StepStats().Spec()
			modelDrafting := l.StepStats().DraftSteps.Load()
			// No decode row is padding: each is a sequence's last token or
			// a draft it verifies (with ZOS, TrimDrafts drops the rows a
			// shorter draft leaves empty).
			if rows, seqs := l.StepStats().DecodeTokens.Load(), l.StepStats().DecodeSeqs.Load(); rows != seqs+spec.NumDraftTokens {
				t.Errorf("seed %d %s zos %v small %v: %d decode rows for %d decodes and %d draft tokens verified", seed, method, zos, small, rows, seqs, spec.NumDraftTokens)
			}
			// The adaptive controller's limits are counted, once a step
			// with decode rows, each at most k; without it, none.
			limits := int64(0)
			for _, n := range spec.StepsAtLimit {
				limits += n
			}
			if adaptive := zos && small && method != ""; (limits > 0) != adaptive || len(spec.StepsAtLimit) > 4 || limits > l.StepStats().Steps.Load() {
				t.Errorf("seed %d %s zos %v small %v: steps at draft limits %v of %d steps", seed, method, zos, small, spec.StepsAtLimit, l.StepStats().Steps.Load())
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			// Every step's loop time is counted once, under its kind (read
			// once the loop has stopped: a step may still be in flight when
			// the last request finishes).
			if times, steps := l.StepStats().StepTimes(), l.StepStats().Steps.Load(); times.Decode.Steps+times.Mixed.Steps+times.Prefill.Steps != steps || times.Decode.Steps == 0 {
				t.Errorf("seed %d %s zos %v small %v: step times %+v for %d steps", seed, method, zos, small, times, steps)
			}
			if st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots {
				t.Errorf("seed %d %s zos %v small %v: leaked: %d/%d blocks, %d/%d state slots free",
					seed, method, zos, small, st.NumFreeBlocks, st.NumBlocks, st.NumFreeStateSlots, st.NumStateSlots)
			}
			if method != "" && !(zos && small) {
				if spec.NumDraftTokens == 0 || spec.NumAcceptedTokens == 0 {
					t.Errorf("seed %d %s zos %v: %d drafted, %d accepted", seed, method, zos, spec.NumDraftTokens, spec.NumAcceptedTokens)
				}
				// A model drafter's passes are counted apart from the host's
				// time (Stats.RecordDraft); prompt lookup is host work.
				if model := method != "ngram"; (modelDrafting > 0) != model {
					t.Errorf("seed %d %s zos %v: %d steps of model drafting recorded", seed, method, zos, modelDrafting)
				}
				t.Logf("seed %d %s zos %v small %v: %d drafts, %d draft tokens, %d accepted, %d preemptions",
					seed, method, zos, small, spec.NumDrafts, spec.NumDraftTokens, spec.NumAcceptedTokens, st.NumPreemptions)
			}
			return got
		}
		want := run("", "", false, false)
		for _, m := range methods {
			for _, zos := range []bool{false, true} {
				for _, small := range []bool{false, true} {
					got := run(m.method, m.draft, zos, small)
					if !reflect.DeepEqual(want, got) {
						t.Errorf("seed %d %s zos %v small %v: outputs differ", seed, m.method, zos, small)
						for k, v := range want {
							if got[k] != v {
								t.Errorf("  output %s (%+v):\n    off %s\n    on  %s", k, w.params[atoi(k)], v, got[k])
							}
						}
					}
				}
			}
		}
	}
}

// speculative.disable_by_batch_size turns drafts off while that many
// sequences run: nothing is verified at 1, drafts are at 64, and at 8 they
// turn on and off as the batch of 8 requests (some with n = 2) fills and
// drains, so that,
// with ZOS, steps planned with drafts off are in flight while drafting
// steps are planned after them and the other way round (the scheduler's
// PlaceholdersFromSamples, the stages' DraftFree path). The tokens are the
// same in every case, ZOS off and on.
func TestSpeculativeDisableByBatchSize(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	w := randomWorkload(3, 8)
	clear(w.abortAt)
	var want map[string]string
	for _, zos := range []bool{false, true} {
		for _, limit := range []int{64, 1, 8} {
			l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
				c.Pipeline.Impl = nil
				c.ZOS.Enabled = zos
				c.Speculative.Method = "mtp"
				c.Speculative.DisableByBatchSize = limit
			}), Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := runWorkload(t, l, w)
			sp := l.StepStats().Spec()
			st := l.SchedulerStats()
			l.Close()
			if (sp.NumDraftTokens == 0) != (limit == 1) {
				t.Errorf("zos %v, disable_by_batch_size %d: %d draft tokens verified", zos, limit, sp.NumDraftTokens)
			}
			if st.NumFreeBlocks != st.NumBlocks {
				t.Errorf("zos %v, disable_by_batch_size %d: %d of %d blocks free at the end", zos, limit, st.NumFreeBlocks, st.NumBlocks)
			}
			if want == nil {
				want = got
			} else if !reflect.DeepEqual(want, got) {
				t.Errorf("zos %v, disable_by_batch_size %d: outputs differ from drafts always on without ZOS", zos, limit)
			}
		}
	}
}

// Logprobs and prompt logprobs come out the same with speculation: every
// emitted token, accepted draft or not, carries the target's logprobs at
// its position.
func TestSpeculativeLogprobs(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	var got [2][]Completion
	for i, method := range []string{"", "mtp"} {
		l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
			c.Pipeline.Impl = nil
			c.Speculative.Method = method
			c.Speculative.Adaptive = false
		}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		p := engine.DefaultSamplingParams()
		lp, plp := 3, 2
		p.Temperature, p.MaxTokens, p.Logprobs, p.PromptLogprobs, p.IgnoreEOS = 0, 24, &lp, &plp, true
		res, err := l.Generate(context.Background(), []Prompt{{Text: "The old house"}, {Text: "It was a dark and stormy night"}}, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if method != "" && l.StepStats().Spec().NumAcceptedTokens == 0 {
			t.Error("no draft accepted")
		}
		l.Close()
		got[i] = res
	}
	for r := range got[0] {
		a, b := got[0][r].Outputs[0], got[1][r].Outputs[0]
		if len(b.Logprobs) != len(b.TokenIDs) {
			t.Errorf("prompt %d: %d logprobs for %d tokens", r, len(b.Logprobs), len(b.TokenIDs))
		}
		if !reflect.DeepEqual(a.TokenIDs, b.TokenIDs) || !reflect.DeepEqual(a.Logprobs, b.Logprobs) {
			t.Errorf("prompt %d: tokens or logprobs differ with speculation", r)
		}
		if !reflect.DeepEqual(got[0][r].PromptLogprobs, got[1][r].PromptLogprobs) {
			t.Errorf("prompt %d: prompt logprobs differ with speculation", r)
		}
	}
}

// A drafter that cannot serve the model is a clear error at load: mtp on a
// model without MTP layers, a draft model with another vocabulary size, a
// draft model whose tokenizer maps an id to another string.
func TestSpeculativeDrafterErrors(t *testing.T) {
	target := tinyLlama(t)
	writeCharTokenizer(t, target)
	bigger := t.TempDir()
	other := random.TinyLlama
	other.Vocab = 80
	if err := random.WriteLlama(bigger, other, 3); err != nil {
		t.Fatal(err)
	}
	swapped := tinyLlama(t)
	writeCharTokenizer(t, swapped)
	tok, err := os.ReadFile(filepath.Join(swapped, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Swap the strings of ids 3 and 4 ("a" and "b").
	tok = bytes.Replace(tok, []byte(`"a":3`), []byte(`"a":9999`), 1)
	tok = bytes.Replace(tok, []byte(`"b":4`), []byte(`"b":3`), 1)
	tok = bytes.Replace(tok, []byte(`"a":9999`), []byte(`"a":4`), 1)
	if err := os.WriteFile(filepath.Join(swapped, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, method, draft string
		want                []string
	}{
		{"mtp without MTP layers", "mtp", "", []string{"speculative.method mtp", "no MTP layers"}},
		{"vocabulary size", "draft_model", bigger, []string{"speculative.draft_model", "vocab_size 80 differs from the model's 64"}},
		{"tokenizer", "draft_model", swapped, []string{"speculative.draft_model", `token 3 is "b" in its tokenizer and "a" in the model's`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(tinyConfig(t, target, func(cfg *config.Config) {
				cfg.Speculative.Method = c.method
				cfg.Speculative.DraftModel = c.draft
			}), Options{})
			if err == nil {
				t.Fatal("New succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The models' and the model drafters' buffers without the zero fill
// (kernels.AllocEmpty) are written before they are read: on a backend that
// fills them with NaN, the shipped model's MTP drafting and its DSpark
// drafter give the same tokens and accept the same drafts as on the plain
// CPU backend, ZOS off and on. (A draft computed from an unwritten element
// would be NaN logits' argmax, and its acceptance would change.)
func TestSpeculativeEmptyBuffers(t *testing.T) {
	dir := filepath.Join("..", "assets", "deepseek-tiny")
	b := cpu.New(cpu.Options{Threads: 2})
	defer b.Close()
	for _, method := range []string{"mtp", "dspark"} {
		empty := &opstest.NaNEmpty{Backend: b}
		for _, zos := range []bool{false, true} {
			var want [][]int
			var wantAccepted int64
			for i, ops := range []kernels.Ops{b, empty} {
				l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
					c.ZOS.Enabled = zos
					c.Speculative.Method = method
					c.Speculative.NumSpeculativeTokens = 3
					if method == "dspark" {
						c.Speculative.DraftModel = filepath.Join("..", "assets", "dspark-tiny")
					}
				}), Options{Backend: ops})
				if err != nil {
					t.Fatal(err)
				}
				got := generate(t, l, prompts(4), greedy(24))
				spec := l.StepStats().Spec()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if spec.NumDraftTokens == 0 {
					t.Fatalf("%s zos %v: nothing drafted", method, zos)
				}
				if i == 0 {
					want, wantAccepted = got, spec.NumAcceptedTokens
					continue
				}
				if !reflect.DeepEqual(got, want) || spec.NumAcceptedTokens != wantAccepted {
					t.Errorf("%s zos %v: NaN-filled empty buffers: %d drafts accepted, %v; zero-filled: %d, %v", method, zos, spec.NumAcceptedTokens, got, wantAccepted, want)
				}
			}
		}
		if empty.EmptyAllocs() == 0 {
			t.Fatalf("%s: no buffer came from AllocEmpty", method)
		}
	}
}
