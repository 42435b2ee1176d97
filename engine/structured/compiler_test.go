package structured

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/grammar"
)

// byteVocab is a vocabulary of the 256 single bytes, then EOS (id 256).
func byteVocab() *grammar.Vocab {
	v := &grammar.Vocab{Tokens: make([][]byte, 257), EOS: []int{256}}
	for b := range 256 {
		v.Tokens[b] = []byte{byte(b)}
	}
	return v
}

// accepts feeds s byte by byte, checking each against the mask first, and
// reports whether the matcher took all of s and then allows EOS.
func accepts(t *testing.T, g engine.Grammar, s string) bool {
	t.Helper()
	m := g.NewMatcher()
	mask := make([]uint32, (257+31)/32)
	for i := 0; i < len(s); i++ {
		m.ComputeMask(mask)
		allowed := mask[s[i]>>5]>>(s[i]&31)&1 == 1
		err := m.Commit(int(s[i]))
		if allowed != (err == nil) {
			t.Fatalf("%q at byte %d: mask says %v, Commit says %v", s, i, allowed, err)
		}
		if err != nil {
			return false
		}
	}
	m.ComputeMask(mask)
	return mask[256>>5]>>(256&31)&1 == 1 && m.IsAccepting()
}

func TestBuildKinds(t *testing.T) {
	tests := []struct {
		name   string
		spec   engine.StructuredOutput
		accept []string
		refuse []string
	}{
		{"json_schema", engine.StructuredOutput{JSONSchema: `{"type":"object","properties":{"n":{"type":"integer"},"s":{"enum":["a","b"]}},"required":["n","s"],"additionalProperties":false}`, Whitespace: "compact"},
			[]string{`{"n":1,"s":"a"}`, `{"n":-20,"s":"b"}`}, []string{`{"n":1}`, `{"n":"1","s":"a"}`, `{"n":1,"s":"c"}`, `{"s":"a","n":1}`}},
		{"json_object", engine.StructuredOutput{JSONObject: true},
			[]string{`{}`, `{"a": [1, {"b": null}]}`, ` {"x":true} `}, []string{`[]`, `1`, `"s"`, `{`}},
		{"regex", engine.StructuredOutput{Regex: `[0-9]{3}-[a-z]+`},
			[]string{"123-abc", "000-z"}, []string{"12-abc", "123-", "123-ABC"}},
		{"choice", engine.StructuredOutput{Choice: []string{"yes", "no", `say "hi"\`}},
			[]string{"yes", "no", `say "hi"\`}, []string{"ye", "yesno", "maybe"}},
		{"grammar", engine.StructuredOutput{Grammar: `root ::= "(" root ")" | "x"`},
			[]string{"x", "((x))"}, []string{"(x", "xx", "()"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := Build(context.Background(), &tc.spec, byteVocab())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.accept {
				if !accepts(t, g, s) {
					t.Errorf("refused %q", s)
				}
			}
			for _, s := range tc.refuse {
				if accepts(t, g, s) {
					t.Errorf("accepted %q", s)
				}
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		spec engine.StructuredOutput
		want string
	}{
		{engine.StructuredOutput{JSONSchema: `{"type":"object","properties":{"x":{"not":{"minimum":1}}}}`}, `json_schema: jsonschema: unsupported keyword "not" at #/properties/x`},
		{engine.StructuredOutput{JSONSchema: `{"type":`}, "json_schema: jsonschema: invalid schema JSON"},
		{engine.StructuredOutput{Regex: `[a-`}, "regex: "},
		{engine.StructuredOutput{Grammar: `root ::= undefined`}, "grammar: "},
	}
	for _, tc := range tests {
		_, err := Build(context.Background(), &tc.spec, byteVocab())
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want prefix %q", tc.spec, err, tc.want)
		}
	}
	c, err := NewCompiler(byteVocab(), Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile(context.Background(), &engine.StructuredOutput{Regex: "a", Choice: []string{"b"}}); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("two constraints: %v", err)
	}
}

// blockingCompiler counts compiles and holds each until released.
type blockingCompiler struct {
	calls   atomic.Int32
	started chan string
	release chan struct{}
}

func newBlocking() *blockingCompiler {
	return &blockingCompiler{started: make(chan string, 16), release: make(chan struct{})}
}

func (b *blockingCompiler) compile(ctx context.Context, spec *engine.StructuredOutput, v *grammar.Vocab) (engine.Grammar, error) {
	b.calls.Add(1)
	b.started <- spec.Regex
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return Build(ctx, spec, v)
}

func TestCompilerCacheAndSingleflight(t *testing.T) {
	c, err := NewCompiler(byteVocab(), Options{Workers: 2, CacheSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := newBlocking()
	c.compile = b.compile
	spec := &engine.StructuredOutput{Regex: "ab+"}
	var wg sync.WaitGroup
	got := make([]engine.Grammar, 4)
	for i := range got {
		wg.Go(func() {
			g, err := c.Compile(context.Background(), spec)
			if err != nil {
				t.Error(err)
			}
			got[i] = g
		})
	}
	<-b.started
	close(b.release)
	wg.Wait()
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("%d compiles of one constraint asked 4 times at once, want 1", n)
	}
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("caller %d got a different grammar", i)
		}
	}
	again, err := c.Compile(context.Background(), spec)
	if err != nil || again != got[0] || b.calls.Load() != 1 {
		t.Fatalf("cached compile: %v, same %v, compiles %d", err, again == got[0], b.calls.Load())
	}
	// A second constraint evicts the first (cache size 1).
	if _, err := c.Compile(context.Background(), &engine.StructuredOutput{Regex: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile(context.Background(), spec); err != nil || b.calls.Load() != 3 || c.CacheLen() != 1 {
		t.Fatalf("after eviction: %v, compiles %d, cached %d", err, b.calls.Load(), c.CacheLen())
	}
}

// A compile that never finishes fails its request with ErrTimeout, holds
// one worker, and does not stop another constraint from compiling on the
// other worker.
func TestCompilerTimeout(t *testing.T) {
	c, err := NewCompiler(byteVocab(), Options{Workers: 2, CacheSize: 4, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	defer close(stuck)
	c.compile = func(ctx context.Context, spec *engine.StructuredOutput, v *grammar.Vocab) (engine.Grammar, error) {
		if spec.Regex == "slow" {
			<-stuck // ignores ctx, as a runaway compile would
			return nil, errors.New("unreachable")
		}
		return Build(ctx, spec, v)
	}
	_, err = c.Compile(context.Background(), &engine.StructuredOutput{Regex: "slow"})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("runaway compile: %v, want ErrTimeout", err)
	}
	if _, err := c.Compile(context.Background(), &engine.StructuredOutput{Regex: "fast"}); err != nil {
		t.Fatalf("another constraint while the runaway holds a worker: %v", err)
	}
	if c.CacheLen() != 1 {
		t.Fatalf("cached %d grammars, want only the one that compiled", c.CacheLen())
	}
}

// With one worker, a second constraint waits for the first to finish.
func TestCompilerWorkers(t *testing.T) {
	c, err := NewCompiler(byteVocab(), Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := newBlocking()
	c.compile = b.compile
	done := make(chan error, 2)
	for _, r := range []string{"a", "b"} {
		c.CompileAsync(context.Background(), &engine.StructuredOutput{Regex: r}, func(_ engine.Grammar, err error) { done <- err })
	}
	<-b.started
	select {
	case r := <-b.started:
		t.Fatalf("compile of %q started while the only worker was busy", r)
	case <-time.After(20 * time.Millisecond):
	}
	close(b.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("%d compiles, want 2", n)
	}
}

func TestKeyUnambiguous(t *testing.T) {
	a := Key(&engine.StructuredOutput{Choice: []string{"a;", "b"}})
	b := Key(&engine.StructuredOutput{Choice: []string{"a", ";b"}})
	c := Key(&engine.StructuredOutput{JSONSchema: "{}", Whitespace: "compact"})
	d := Key(&engine.StructuredOutput{JSONSchema: "{}"})
	if a == b || c == d {
		t.Fatalf("keys collide: %q %q / %q %q", a, b, c, d)
	}
}

// A real compile past its deadline stops (the conversion and the compile
// honour the context), fails with ErrTimeout, and frees its worker: with
// one worker, the next constraint compiles.
func TestCompilerDeadlineStopsWork(t *testing.T) {
	c, err := NewCompiler(byteVocab(), Options{Workers: 1, CacheSize: 4, Timeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	// A deeply nested schema: thousands of subschemas to convert.
	schema := strings.Repeat(`{"type":"array","items":`, 3000) + `{"type":"integer"}` + strings.Repeat(`}`, 3000)
	if _, err := c.Compile(context.Background(), &engine.StructuredOutput{JSONSchema: schema}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("nested schema under a 1ns deadline: %v", err)
	}
	c.opts.Timeout = time.Minute
	if _, err := c.Compile(context.Background(), &engine.StructuredOutput{Regex: "[0-9]+"}); err != nil {
		t.Fatalf("the next constraint on the freed worker: %v", err)
	}
}

// Pathological constraints either compile (the engine is an automaton:
// nested quantifiers do not backtrack) and behave, or fail by their
// deadline: a catastrophic regex, a huge enum, deep nesting.
func TestCompilerPathological(t *testing.T) {
	enum := make([]string, 3000)
	for i := range enum {
		enum[i] = fmt.Sprintf("%q", fmt.Sprintf("value-%05d", i))
	}
	hugeEnum := `{"enum":[` + strings.Join(enum, ",") + `]}`
	c, err := NewCompiler(byteVocab(), Options{Workers: 2, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.Compile(context.Background(), &engine.StructuredOutput{Regex: `(a+)+(b|a+)*c`})
	if err != nil {
		t.Fatal(err)
	}
	if !accepts(t, g, strings.Repeat("a", 200)+"c") || accepts(t, g, strings.Repeat("a", 200)+"d") {
		t.Fatal("nested quantifiers: wrong language")
	}
	g, err = c.Compile(context.Background(), &engine.StructuredOutput{JSONSchema: hugeEnum, Whitespace: "compact"})
	if err != nil {
		t.Fatal(err)
	}
	if !accepts(t, g, `"value-02345"`) || accepts(t, g, `"value-03000"`) {
		t.Fatal("huge enum: wrong language")
	}
	// The same constraint under a deadline it cannot meet fails alone.
	tight, err := NewCompiler(byteVocab(), Options{Workers: 1, Timeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tight.Compile(context.Background(), &engine.StructuredOutput{JSONSchema: hugeEnum}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("huge enum past its deadline: %v", err)
	}
}
