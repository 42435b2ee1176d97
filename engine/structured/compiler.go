// Package structured turns a request's engine.StructuredOutput into an
// engine.Grammar off the scheduling path: a Compiler runs compilations on
// a bounded pool of workers, keeps the compiled grammars of recent
// constraints in an LRU cache keyed by the constraint (one Compiler serves
// one tokenizer vocabulary, so the key need not name it), collapses
// concurrent compiles of the same constraint into one (singleflight), and
// bounds each compile by a timeout. A constraint that fails or times out
// fails its own request; the engine's steps never wait for a compile.
package structured

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/grammar"
)

// ErrTimeout is wrapped by the error of a compile that ran past its
// timeout.
var ErrTimeout = errors.New("grammar compile timed out")

// Options size a Compiler.
type Options struct {
	// Workers bounds the compiles that run at once (>= 1).
	Workers int
	// CacheSize is how many compiled grammars are kept (0: none).
	CacheSize int
	// Timeout bounds one compile, from the moment a worker takes it
	// (0: no bound).
	Timeout time.Duration
}

// Compiler compiles structured-output constraints against one vocabulary.
// Safe for concurrent use.
type Compiler struct {
	vocab *grammar.Vocab
	opts  Options
	sem   *semaphore.Weighted
	group singleflight.Group

	mu    sync.Mutex
	lru   *list.List // of *cacheEntry, most recent first
	cache map[string]*list.Element

	// compile turns a constraint into a grammar (Build; tests replace it).
	compile func(ctx context.Context, spec *engine.StructuredOutput, v *grammar.Vocab) (engine.Grammar, error)
}

type cacheEntry struct {
	key string
	g   engine.Grammar
}

// NewCompiler returns a Compiler for vocab (see grammar.NewVocab).
func NewCompiler(vocab *grammar.Vocab, opts Options) (*Compiler, error) {
	if vocab == nil {
		return nil, errors.New("structured: NewCompiler needs a vocabulary")
	}
	if opts.Workers < 1 {
		return nil, fmt.Errorf("structured: workers must be at least 1, got %d", opts.Workers)
	}
	if opts.CacheSize < 0 || opts.Timeout < 0 {
		return nil, fmt.Errorf("structured: cache size %d and timeout %v must not be negative", opts.CacheSize, opts.Timeout)
	}
	return &Compiler{vocab: vocab, opts: opts, sem: semaphore.NewWeighted(int64(opts.Workers)),
		lru: list.New(), cache: map[string]*list.Element{}, compile: Build}, nil
}

// Compile returns the compiled grammar of spec: from the cache, by joining
// a compile of the same constraint already running, or by compiling it on
// a worker (waiting for a free one). It blocks; the engine calls it from
// its own goroutine (CompileAsync). Errors: ctx's, ErrTimeout, or the
// constraint's compile error (naming what was wrong); errors are not
// cached, so a later request retries.
func (c *Compiler) Compile(ctx context.Context, spec *engine.StructuredOutput) (engine.Grammar, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	key := Key(spec)
	if g, ok := c.lookup(key); ok {
		return g, nil
	}
	ch := c.group.DoChan(key, func() (any, error) {
		// Detached from the first caller's context: others may be waiting
		// for the same result; the timeout bounds the work.
		return c.run(context.WithoutCancel(ctx), key, spec)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(engine.Grammar), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// CompileAsync runs Compile on a new goroutine and calls done with its
// result there.
func (c *Compiler) CompileAsync(ctx context.Context, spec *engine.StructuredOutput, done func(engine.Grammar, error)) {
	go func() { done(c.Compile(ctx, spec)) }()
}

// run compiles on a worker, under the timeout, and caches the result. A
// compile that runs past its timeout keeps its worker until it returns
// (so runaway compiles never outnumber the workers), but its requests get
// ErrTimeout at once.
func (c *Compiler) run(ctx context.Context, key string, spec *engine.StructuredOutput) (engine.Grammar, error) {
	if err := c.sem.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	if g, ok := c.lookup(key); ok { // compiled while this one queued
		c.sem.Release(1)
		return g, nil
	}
	cancel := context.CancelFunc(func() {})
	if c.opts.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
	}
	defer cancel()
	type result struct {
		g   engine.Grammar
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer c.sem.Release(1)
		g, err := c.compile(ctx, spec, c.vocab)
		if err == nil {
			c.store(key, g)
		}
		res <- result{g, err}
	}()
	select {
	case r := <-res:
		if r.err != nil && ctx.Err() == nil {
			return nil, r.err
		}
		if r.err == nil {
			return r.g, nil
		}
	case <-ctx.Done():
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("%w after %v (structured_output.compile_timeout)", ErrTimeout, c.opts.Timeout)
	}
	return nil, ctx.Err()
}

func (c *Compiler) lookup(key string) (engine.Grammar, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cache[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cacheEntry).g, true
	}
	return nil, false
}

func (c *Compiler) store(key string, g engine.Grammar) {
	if c.opts.CacheSize == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cache[key]; ok {
		c.lru.MoveToFront(e)
		return
	}
	c.cache[key] = c.lru.PushFront(&cacheEntry{key: key, g: g})
	for c.lru.Len() > c.opts.CacheSize {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.cache, old.Value.(*cacheEntry).key)
	}
}

// CacheLen reports how many compiled grammars the cache holds.
func (c *Compiler) CacheLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Key is the cache key of a constraint: its kind, whitespace mode and
// source, unambiguous (each part's length first).
func Key(spec *engine.StructuredOutput) string {
	var b strings.Builder
	part := func(s string) { fmt.Fprintf(&b, "%d:%s;", len(s), s) }
	part(spec.Kind())
	part(spec.Whitespace)
	switch spec.Kind() {
	case "json_schema":
		part(spec.JSONSchema)
	case "regex":
		part(spec.Regex)
	case "choice":
		for _, s := range spec.Choice {
			part(s)
		}
	case "grammar":
		part(spec.Grammar)
	}
	return b.String()
}
