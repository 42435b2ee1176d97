package stages_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/sampling"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/stages"
)

// hostDevice gives a backend kernels.DeviceSampler by running the host
// reference sampler on each row it receives: the engine then takes the
// sample stage's device path on the CPU, and tokens equal to the host
// path's show that the rows sent to a device say what the host samples.
type hostDevice struct {
	kernels.Ops
	calls, rows atomic.Int64
}

func (h *hostDevice) SampleTokens(logits kernels.Tensor, rows []kernels.SampleRow) (kernels.Tensor, []int32, error) {
	vocab, err := kernels.SampleArgs("host-device", logits, rows, nil)
	if err != nil {
		return nil, nil, err
	}
	h.calls.Add(1)
	h.rows.Add(int64(len(rows)))
	flat, err := kernels.ToF32(h.Ops, logits)
	if err != nil {
		return nil, nil, err
	}
	host := make([]int32, len(rows))
	s := new(sampling.Scratch)
	for r := range rows {
		res, err := sampling.Sample(flat[r*vocab:(r+1)*vocab], &rows[r], s)
		if err != nil {
			return nil, nil, &kernels.SampleRowError{Row: r, Reason: err.Error(), Index: -1}
		}
		host[r] = res.Token
	}
	// The contract: the logits keep their edited values.
	if err := h.Upload(logits, kernels.F32Bytes(flat), kernels.F32); err != nil {
		return nil, nil, err
	}
	tokens, err := kernels.FromI32(h.Ops, host, len(host))
	if err != nil {
		return nil, nil, err
	}
	return tokens, host, nil
}

// deviceRegistry is the default registry with the sample stages built
// over dev instead of the engine's backend.
// asyncHostDevice is hostDevice as a kernels.AsyncDeviceSampler: the
// sample stage publishes the device tokens before it fetches their host
// copy (which here is ready at once).
type asyncHostDevice struct {
	*hostDevice
	early atomic.Int64 // fetches taken after the tokens were handed out
}

func (a *asyncHostDevice) SampleTokensAsync(logits kernels.Tensor, rows []kernels.SampleRow) (kernels.Tensor, func() ([]int32, error), error) {
	tokens, host, err := a.SampleTokens(logits, rows)
	if err != nil {
		return nil, nil, err
	}
	return tokens, func() ([]int32, error) {
		a.early.Add(1)
		return host, nil
	}, nil
}

func deviceRegistry(t *testing.T, dev *hostDevice) *pipeline.Registry {
	return deviceRegistryOps(t, dev, func() kernels.Ops { return dev })
}

// deviceRegistryOps is deviceRegistry with the sample stage's Ops given by
// ops (dev itself, or a wrapper of it).
func deviceRegistryOps(t *testing.T, dev *hostDevice, ops func() kernels.Ops) *pipeline.Registry {
	t.Helper()
	def := pipeline.DefaultRegistry()
	reg := pipeline.NewRegistry()
	for _, slot := range def.Slots() {
		for _, name := range def.Names(slot) {
			f, err := def.Lookup(slot, name)
			if err != nil {
				t.Fatal(err)
			}
			if slot == "sample" {
				inner := f
				f = func(a pipeline.Args) (*pipeline.Node, error) {
					env, ok := a.Deps.(*stages.Env)
					if !ok {
						return nil, fmt.Errorf("deps %T", a.Deps)
					}
					dev.Ops = env.Ops
					withDevice := *env
					withDevice.Ops = ops()
					a.Deps = &withDevice
					return inner(a)
				}
			}
			reg.Register(slot, name, f)
		}
	}
	return reg
}

// deviceWorkload is a random mix of requests that exercises every input of
// a device row: greedy and seeded sampling with temperature, top-k, top-p
// and min-p, the three penalties, logit bias, min_tokens with stop ids and
// EOS, n = 2, and (withLogprobs) some requests asking for logprobs.
func deviceWorkload(seed uint64, n int, logprobs func(i int) bool) ([][]int, []engine.SamplingParams) {
	rng := rand.New(rand.NewPCG(seed, 5))
	var prompts [][]int
	var params []engine.SamplingParams
	for i := range n {
		var ids []int
		for range 2 + rng.IntN(12) {
			ids = append(ids, 3+rng.IntN(60))
		}
		p := engine.DefaultSamplingParams()
		p.MaxTokens = 2 + rng.IntN(12)
		if rng.IntN(4) > 0 {
			p.Temperature = 0.4 + rng.Float32()
			p.TopK = []int{0, 1, 5, 40}[rng.IntN(4)]
			p.TopP = []float32{1, 0.5, 0.9}[rng.IntN(3)]
			p.MinP = []float32{0, 0.05, 0.3}[rng.IntN(3)]
			s := rng.Int64N(1 << 40)
			p.Seed = &s
		} else {
			p.Temperature = 0
		}
		if rng.IntN(2) == 0 {
			p.RepetitionPenalty = 0.7 + rng.Float32()
			p.PresencePenalty = rng.Float32()*2 - 1
			p.FrequencyPenalty = rng.Float32()*2 - 1
		}
		if rng.IntN(3) == 0 {
			p.LogitBias = map[int]float32{3 + rng.IntN(60): rng.Float32()*20 - 10, rng.IntN(64): 5}
		}
		if rng.IntN(3) == 0 {
			p.MinTokens = 1 + rng.IntN(p.MaxTokens)
			p.StopTokenIDs = []int{3 + rng.IntN(60), 2}
		}
		p.IgnoreEOS = rng.IntN(2) == 0
		if rng.IntN(4) == 0 {
			p.N = 2
		}
		if logprobs(i) {
			k := rng.IntN(3)
			p.Logprobs = &k
		}
		prompts = append(prompts, ids)
		params = append(params, p)
	}
	return prompts, params
}

// runEngine serves the workload on the tiny model and returns each output
// sequence's tokens and finish reason by request and sequence index.
func runEngine(t *testing.T, dir, sampler string, zos bool, reg *pipeline.Registry, prompts [][]int, params []engine.SamplingParams) map[string]string {
	t.Helper()
	yaml := fmt.Sprintf("model: %s\ncpu: {threads: 2}\ncache: {num_blocks: 96, block_size: 4}\nengine: {max_num_seqs: 8, max_num_batched_tokens: 64, prefill_chunk_size: 16}\npipeline: {sample: %s}\nzos: {enabled: %v}\n", dir, sampler, zos)
	cfg, err := config.Parse("device-sample.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	e, err := llm.New(cfg, llm.Options{Stages: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var mu sync.Mutex
	got := map[string]string{}
	var wg sync.WaitGroup
	for i := range prompts {
		toks := make([][]int, params[i].N)
		wg.Add(params[i].N)
		req := &engine.Request{ID: fmt.Sprintf("r%d", i), PromptTokenIDs: prompts[i], Params: params[i],
			OnOutput: func(o engine.RequestOutput) {
				mu.Lock()
				defer mu.Unlock()
				toks[o.Index] = append(toks[o.Index], o.TokenIDs...)
				if o.Finished {
					if o.Err != nil {
						t.Errorf("request %d: %v", i, o.Err)
					}
					got[fmt.Sprintf("%d/%d", i, o.Index)] = fmt.Sprintf("%v %s", toks[o.Index], o.FinishReason)
					wg.Done()
				}
			}}
		for {
			err := e.AddRequest(req)
			if errors.Is(err, llm.ErrQueueFull) {
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	wg.Wait()
	return got
}

// The sample stages take the device path when the backend has a
// DeviceSampler and no row asks for logprobs, and give the host path's
// tokens: greedy and seeded sampling with penalties, bias and min_tokens,
// with ZOS on and off.
func TestDeviceSampleMatchesHost(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 3); err != nil {
		t.Fatal(err)
	}
	never := func(int) bool { return false }
	tests := []struct {
		name     string
		sampler  string
		logprobs func(int) bool
		device   string // "all": every row on the device; "some"; "none"
	}{
		{"default", "default", never, "all"},
		{"greedy stage", "greedy", never, "all"},
		{"every request asks logprobs", "default", func(int) bool { return true }, "none"},
		{"some ask logprobs", "default", func(i int) bool { return i%5 == 0 }, "some"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(2) {
				prompts, params := deviceWorkload(seed, 20, tc.logprobs)
				for _, zos := range []bool{false, true} {
					want := runEngine(t, dir, tc.sampler, zos, nil, prompts, params)
					dev := &hostDevice{}
					got := runEngine(t, dir, tc.sampler, zos, deviceRegistry(t, dev), prompts, params)
					if !reflect.DeepEqual(got, want) {
						for k, v := range want {
							if got[k] != v {
								t.Errorf("seed %d zos %v: output %s: device path %s, host path %s", seed, zos, k, got[k], v)
							}
						}
					}
					calls, rows := dev.calls.Load(), dev.rows.Load()
					switch {
					case tc.device == "none" && calls != 0:
						t.Errorf("seed %d zos %v: %d device calls with logprobs asked in every step", seed, zos, calls)
					case tc.device != "none" && calls == 0:
						t.Errorf("seed %d zos %v: the device sampler was never called", seed, zos)
					}
					t.Logf("seed %d zos %v: %d outputs; %d device calls, %d rows sampled on the device", seed, zos, len(want), calls, rows)

					// The same through the asynchronous path (tokens
					// published before their host copy).
					adev := &asyncHostDevice{hostDevice: &hostDevice{}}
					got = runEngine(t, dir, tc.sampler, zos, deviceRegistryOps(t, adev.hostDevice, func() kernels.Ops { return adev }), prompts, params)
					if !reflect.DeepEqual(got, want) {
						t.Errorf("seed %d zos %v: the asynchronous device path differs from the host path", seed, zos)
					}
					if tc.device != "none" && adev.early.Load() == 0 {
						t.Errorf("seed %d zos %v: the asynchronous path was never taken", seed, zos)
					}
				}
			}
		})
	}
}
