// Package exampletest runs the examples' stages in an engine on a tiny
// random-weight model, for their tests: servertest's model (128 tokens,
// one per printable ASCII character plus a few merges, 2 layers), small
// enough that a run of a few requests takes milliseconds on the CPU.
package exampletest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/cli"
	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/llm"
	"github.com/deepinfer/deepinfer-go/pipeline"
	"github.com/deepinfer/deepinfer-go/server/servertest"
)

// Timeout bounds one engine run, start and shutdown included: a stage that
// hangs fails its test instead of blocking it. A run takes well under a
// second; the bound is for hangs only.
const Timeout = 30 * time.Second

// Model writes the tiny model and its tokenizer into a temporary directory
// and returns it.
func Model(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := servertest.WriteModel(dir, 11); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Config returns an engine config for the model in dir: the CPU backend
// with two threads, a small KV cache, the pipeline section pipelineYAML (a
// YAML flow mapping such as "{sample: typical}"; "" keeps the built-in
// stages) and zero-overhead scheduling on when zos.
func Config(t testing.TB, dir, pipelineYAML string, zos bool) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf("model: %q\ndevice: cpu\ncpu: {threads: 2}\ncache: {num_blocks: 128, block_size: 16}\n"+
		"engine: {max_num_seqs: 8, max_num_batched_tokens: 256, prefill_chunk_size: 64}\n", dir)
	if pipelineYAML != "" {
		yaml += "pipeline: " + pipelineYAML + "\n"
	}
	cfg, err := config.Parse("example-test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ZOS.Enabled = zos
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Prompts are token-id prompts of a few lengths, inside the model's
// printable range.
func Prompts() []llm.Prompt {
	return []llm.Prompt{
		{IDs: []int{40, 41, 42}},
		{IDs: []int{70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80}},
		{IDs: []int{5}},
		{IDs: []int{90, 60, 30, 91, 61, 31}},
	}
}

// Params returns sampling params that generate exactly maxTokens tokens
// (EOS ignored) at temperature temp, seeded with seed.
func Params(maxTokens int, temp float32, seed int64) engine.SamplingParams {
	p := engine.DefaultSamplingParams()
	p.MaxTokens, p.IgnoreEOS, p.Temperature = maxTokens, true, temp
	p.Seed = &seed
	return p
}

// Generate starts an engine for cfg with the stages of reg, runs prompts
// with params, then calls Shutdown(context.Background()) on the engine,
// and returns the completions. Start, run and shutdown must all end within
// Timeout: a hang anywhere fails t (the run's context ends at the deadline
// too, so a stuck generation is aborted). A failed start, run, output or
// shutdown fails t.
func Generate(t testing.TB, cfg *config.Config, reg *pipeline.Registry, prompts []llm.Prompt, params engine.SamplingParams) []llm.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	type result struct {
		res []llm.Completion
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
		if err != nil {
			done <- result{err: fmt.Errorf("start: %w", err)}
			return
		}
		res, err := l.Generate(ctx, prompts, params, nil)
		if err != nil {
			err = fmt.Errorf("generate: %w", err)
		}
		if serr := l.Shutdown(context.Background()); serr != nil {
			err = errors.Join(err, fmt.Errorf("shutdown: %w", serr))
		}
		done <- result{res, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(Timeout):
		t.Fatalf("the engine did not start, generate and shut down within %s", Timeout)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, c := range r.res {
		for _, o := range c.Outputs {
			if o.Err != nil {
				t.Fatalf("%s/%d: %v", c.RequestID, o.Index, o.Err)
			}
		}
	}
	return r.res
}

// Tokens returns the token ids of every output, prompt by prompt.
func Tokens(res []llm.Completion) [][]int {
	var out [][]int
	for _, c := range res {
		for _, o := range c.Outputs {
			out = append(out, o.TokenIDs)
		}
	}
	return out
}

// Command runs the deepinfer command line of cli.NewRootCommand(reg) with
// args and returns what it wrote (standard output and error together). It
// fails t when the command fails or does not return within Timeout.
func Command(t testing.TB, reg *pipeline.Registry, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cmd := cli.NewRootCommand(reg)
	var out syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("deepinfer %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	case <-time.After(Timeout):
		t.Fatalf("deepinfer %s did not return within %s:\n%s", strings.Join(args, " "), Timeout, out.String())
	}
	return out.String()
}

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartErr builds an engine for cfg with the stages of reg and returns the
// error of the build; an engine that does build is shut down at once
// (StartErr then returns nil). It fails t when the build or the shutdown
// does not end within Timeout, or the shutdown fails.
func StartErr(t testing.TB, cfg *config.Config, reg *pipeline.Registry) error {
	t.Helper()
	type result struct{ build, shutdown error }
	done := make(chan result, 1)
	go func() {
		l, err := llm.NewLLM(cfg, llm.Options{Stages: reg})
		if err != nil {
			done <- result{build: err}
			return
		}
		done <- result{shutdown: l.Shutdown(context.Background())}
	}()
	select {
	case r := <-done:
		if r.shutdown != nil {
			t.Fatalf("shutdown: %v", r.shutdown)
		}
		return r.build
	case <-time.After(Timeout):
		t.Fatalf("the engine did not build and shut down within %s", Timeout)
		return nil
	}
}
