package llm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
)

// workload is a random mix of requests: shared prefixes (prefix-cache
// hits), greedy and seeded sampling, n > 1, max_tokens of 1, stop token ids,
// and aborts after a chosen number of tokens.
type workload struct {
	prompts []Prompt
	params  []engine.SamplingParams
	abortAt []int // abort the request once it has emitted this many tokens; 0: never
}

func randomWorkload(seed uint64, n int) workload {
	rng := rand.New(rand.NewPCG(seed, 99))
	var w workload
	shared := make([]int, 9)
	for i := range shared {
		shared[i] = 3 + rng.IntN(60)
	}
	for range n {
		var ids []int
		if rng.IntN(3) == 0 {
			ids = append(ids, shared...) // a prefix-cache hit after the first
		}
		for range 1 + rng.IntN(20) {
			ids = append(ids, 3+rng.IntN(60))
		}
		p := engine.DefaultSamplingParams()
		p.MaxTokens = 1 + rng.IntN(14)
		if rng.IntN(4) == 0 {
			p.MaxTokens = 1
		}
		switch rng.IntN(3) {
		case 0:
			p.Temperature = 0
		default:
			p.Temperature = 0.5 + rng.Float32()
			p.TopK = rng.IntN(30)
			s := rng.Int64N(1000)
			p.Seed = &s
		}
		if rng.IntN(3) == 0 {
			p.N = 2
		}
		if rng.IntN(4) == 0 {
			p.StopTokenIDs = []int{3 + rng.IntN(60)}
		}
		if rng.IntN(2) == 0 {
			// One or two characters of the test tokenizer's alphabet: stop
			// strings that end requests mid-step, some across two tokens.
			for range 3 + rng.IntN(4) {
				a := charAlphabet[rng.IntN(len(charAlphabet))]
				stop := string(a)
				if rng.IntN(2) == 0 {
					stop += string(charAlphabet[rng.IntN(len(charAlphabet))])
				}
				p.Stop = append(p.Stop, stop)
			}
		}
		p.IgnoreEOS = rng.IntN(2) == 0
		abort := 0
		if rng.IntN(5) == 0 && p.MaxTokens > 2 {
			// With n > 1 the other sequence's progress at the moment of the
			// abort depends on the schedule, so aborted requests have n = 1.
			abort = 1 + rng.IntN(p.MaxTokens-1)
			p.N = 1
		}
		w.prompts = append(w.prompts, Prompt{IDs: ids})
		w.params = append(w.params, p)
		w.abortAt = append(w.abortAt, abort)
	}
	return w
}

// runWorkload submits every request at once and returns each output's
// tokens and finish reason, keyed by prompt index and sequence index.
func runWorkload(t *testing.T, l *LLM, w workload) map[string]string {
	t.Helper()
	var mu sync.Mutex
	got := map[string]string{}
	var wg sync.WaitGroup
	for i := range w.prompts {
		i := i
		res := make([][]int, max(1, w.params[i].N))
		texts := make([]string, len(res))
		closed := make([]bool, len(res))
		emitted := 0
		id := fmt.Sprintf("w%d", i)
		wg.Add(len(res))
		req := &engine.Request{
			ID: id, PromptTokenIDs: w.prompts[i].IDs, Params: w.params[i],
			OnOutput: func(o engine.RequestOutput) {
				mu.Lock()
				if closed[o.Index] {
					t.Errorf("%s/%d: output after finish: %+v", id, o.Index, o)
				}
				closed[o.Index] = o.Finished
				res[o.Index] = append(res[o.Index], o.TokenIDs...)
				texts[o.Index] += o.Text
				emitted += len(o.TokenIDs)
				abort := w.abortAt[i] > 0 && emitted >= w.abortAt[i] && !o.Finished
				if o.Finished {
					if o.Err != nil {
						t.Errorf("%s: %v", id, o.Err)
					}
					got[fmt.Sprintf("%d/%d", i, o.Index)] = fmt.Sprintf("%v %q %s %q", res[o.Index], texts[o.Index], o.FinishReason, o.StopReason)
				}
				mu.Unlock()
				if o.Finished {
					wg.Done()
				}
				if abort {
					l.Abort(id)
				}
			},
		}
		if err := l.AddRequestWait(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	// The last outputs are out; the scheduler learns of the last finishes
	// and aborts when their step comes back around the loop.
	if err := l.FlushInflight(context.Background()); err != nil {
		t.Fatal(err)
	}
	return got
}

// The same requests give the same tokens with ZOS on and off, and neither
// mode leaks blocks or state slots or emits after a finish.
func TestZOSSameTokens(t *testing.T) {
	dir := tinyLlama(t)
	writeCharTokenizer(t, dir)
	stops := 0
	for seed := range uint64(3) {
		w := randomWorkload(seed, 24)
		var results [2]map[string]string
		for i, zos := range []bool{false, true} {
			for _, small := range []bool{false, true} {
				l, err := NewLLM(tinyConfig(t, dir, func(c *config.Config) {
					c.Pipeline.Impl = nil
					c.ZOS.Enabled = zos
					if small {
						c.Cache.NumBlocks = 14 // forces preemption
					}
				}), Options{})
				if err != nil {
					t.Fatal(err)
				}
				got := runWorkload(t, l, w)
				for k, v := range got {
					var i, j int
					fmt.Sscanf(k, "%d/%d", &i, &j)
					for _, stop := range w.params[i].Stop {
						if strings.HasSuffix(v, fmt.Sprintf(" stop %q", stop)) {
							stops++
						}
					}
				}
				st := l.SchedulerStats()
				if ph := l.StepStats().Placeholders.Load(); zos != (ph > 0) {
					t.Errorf("seed %d zos %v: %d placeholders resolved", seed, zos, ph)
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if st.NumFreeBlocks != st.NumBlocks || st.NumFreeStateSlots != st.NumStateSlots {
					t.Errorf("seed %d zos %v small %v: leaked: %d/%d blocks, %d/%d state slots free",
						seed, zos, small, st.NumFreeBlocks, st.NumBlocks, st.NumFreeStateSlots, st.NumStateSlots)
				}
				if small && st.NumPreemptions == 0 {
					t.Logf("seed %d zos %v: no preemption with the small cache", seed, zos)
				}
				if results[i] == nil {
					results[i] = got
				} else if !reflect.DeepEqual(results[i], got) {
					t.Errorf("seed %d zos %v: the small cache changed the tokens", seed, zos)
					for k, v := range results[i] {
						if got[k] != v {
							t.Errorf("  output %s (%+v): large cache %s, small cache %s", k, w.params[atoi(k)], v, got[k])
						}
					}
				}
			}
		}
		if !reflect.DeepEqual(results[0], results[1]) {
			t.Errorf("seed %d: ZOS changed the outputs", seed)
			for k, v := range results[0] {
				if results[1][k] != v {
					t.Errorf("seed %d, output %s: zos off %s, zos on %s", seed, k, v, results[1][k])
				}
			}
		}
	}
	if stops == 0 {
		t.Error("no request ended on a stop string")
	}
	t.Logf("%d outputs ended on a stop string", stops)
}

func atoi(k string) int {
	var i int
	fmt.Sscanf(k, "%d/", &i)
	return i
}
