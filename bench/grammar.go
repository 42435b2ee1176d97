package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/stat"

	"github.com/deepinfer/deepinfer-go/engine/grammar"
	"github.com/deepinfer/deepinfer-go/engine/grammar/jsonschema"
	"github.com/deepinfer/deepinfer-go/engine/tokenizer"
)

// DefaultGrammarTimeout is the per-file time limit of RunGrammar.
const DefaultGrammarTimeout = 10 * time.Second

// The status of one MaskBench file, in the order a file is classified:
// a file that does not compile is a compile error; one that runs past the
// timeout is a timeout; otherwise a valid instance refused makes it a
// validation error, else an invalid instance accepted an invalidation
// error, else it passes. Each file has exactly one status.
const (
	GrammarPass              = "passing"
	GrammarCompileError      = "compile_error"
	GrammarTimeout           = "timeout"
	GrammarValidationError   = "validation_error"
	GrammarInvalidationError = "invalidation_error"
)

// GrammarOptions configure RunGrammar.
type GrammarOptions struct {
	// DataDir holds the MaskBench files (*.json), each with a "schema" and
	// "tests" ([{description, valid, data, text}]); they run in name order.
	DataDir string
	// Tokenizer encodes the instances and gives the vocabulary (NewVocab,
	// built once per run); TokenizerName only labels the result.
	Tokenizer     *tokenizer.Tokenizer
	TokenizerName string
	// Whitespace is jsonschema.Options.Whitespace: "flexible" ("" too),
	// "python" or "compact".
	Whitespace string
	// Timeout bounds each file (conversion, compilation and all its
	// tests); 0 means DefaultGrammarTimeout. The conversion and the
	// compilation stop at it (jsonschema.ToGBNFContext,
	// grammar.CompileContext); after them it is checked between masks, so
	// a file is stopped after the mask or commit that crossed it.
	Timeout time.Duration
	// Limit runs only the first Limit files (in name order); 0: all.
	Limit int
	// Progress receives a progress bar over files; nil: none.
	Progress io.Writer
}

// GrammarPercentiles summarizes a latency sample in microseconds: MaskBench's
// percentiles (empirical, as Summary's) and the extremes.
type GrammarPercentiles struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P25   float64 `json:"p25"`
	P50   float64 `json:"p50"`
	P75   float64 `json:"p75"`
	P90   float64 `json:"p90"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99.9"`
	Max   float64 `json:"max"`
}

// KeywordCount is how many files failed to compile on one keyword.
type KeywordCount struct {
	Keyword string `json:"keyword"`
	Files   int    `json:"files"`
}

// GrammarFile is one file's outcome.
type GrammarFile struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// TTFMMicros: from the start of the schema's conversion to the first
	// mask (0 when it did not compile).
	TTFMMicros float64 `json:"ttfm_us,omitempty"`
	Tests      int     `json:"tests"`
	Masks      int     `json:"masks"`
	// Keyword and Error explain a compile error; Error also names the
	// first failing test of a validation or invalidation error.
	Keyword string `json:"keyword,omitempty"`
	Error   string `json:"error,omitempty"`
}

// GrammarResult is the outcome of RunGrammar: MaskBench's table (files by
// status, compile errors by keyword, TTFM and time-per-mask percentiles)
// plus per-instance counts and every file's outcome.
type GrammarResult struct {
	Mode           string  `json:"mode"` // "grammar"
	DataDir        string  `json:"data_dir"`
	Tokenizer      string  `json:"tokenizer,omitempty"`
	VocabSize      int     `json:"vocab_size"`
	Whitespace     string  `json:"whitespace"`
	TimeoutSeconds float64 `json:"timeout_s"`
	CPU            string  `json:"cpu"`
	// VocabMillis is NewVocab's time, once per run (not in any TTFM).
	VocabMillis float64 `json:"vocab_ms"`
	// TrieMillis is the first Compile's time (of a one-literal grammar):
	// it builds the vocabulary's byte trie, which every later Compile
	// against the same Vocab shares, once per run (not in any TTFM).
	TrieMillis      float64 `json:"trie_ms"`
	DurationSeconds float64 `json:"duration_s"`
	Interrupted     bool    `json:"interrupted,omitempty"`

	Files              int `json:"files"`
	Passing            int `json:"passing"`
	CompileErrors      int `json:"compile_errors"`
	Timeouts           int `json:"timeouts"`
	ValidationErrors   int `json:"validation_errors"`
	InvalidationErrors int `json:"invalidation_errors"`
	// CompileErrorKeywords counts compile errors by the keyword the
	// converter named ("(gbnf)", "(compile)", "(invalid schema)" or
	// "(other)" when none), most frequent first.
	CompileErrorKeywords []KeywordCount `json:"compile_error_keywords"`

	// Instances of the files that compiled and did not time out.
	Tests                  int `json:"tests"`
	ValidTests             int `json:"valid_tests"`
	InvalidTests           int `json:"invalid_tests"`
	TestValidationErrors   int `json:"test_validation_errors"`
	TestInvalidationErrors int `json:"test_invalidation_errors"`
	// MaskCommitMismatches counts tokens whose mask bit disagreed with
	// Commit (allowed but refused); 0 for a consistent matcher.
	MaskCommitMismatches int `json:"mask_commit_mismatches"`

	TTFM    GrammarPercentiles `json:"ttfm_us"`
	Mask    GrammarPercentiles `json:"mask_us"`
	Results []GrammarFile      `json:"results"`
}

// maskBenchFile is one data file; "data" is not read (text is the
// instance as MaskBench tokenizes it).
type maskBenchFile struct {
	Schema json.RawMessage `json:"schema"`
	Tests  []struct {
		Description string  `json:"description"`
		Valid       bool    `json:"valid"`
		Text        *string `json:"text"`
	} `json:"tests"`
}

// RunGrammar runs MaskBench's protocol over the files of o.DataDir, in one
// goroutine: per file, convert the schema (jsonschema.ToGBNF), parse it
// (grammar.ParseGBNF), compile it against the vocabulary and compute the
// first mask (TTFM; any failure is a compile error); then for each test,
// from a fresh matcher, encode its text without special tokens and for each
// token compute the mask (timed), check the token's bit and commit it,
// stopping at the first token refused. A valid instance refused or not
// accepting at its end is a validation error; an invalid instance taken to
// its end and accepting is an invalidation error. Every test of a file runs
// (the per-instance counts), and the file gets one status (see
// GrammarPass). ctx ends the run between files with the files done so far
// (Interrupted). A data file that cannot be read or decoded is an error.
//
// Cost: NewVocab and the vocabulary's byte trie once (TrieMillis); per
// file, a Compile (the start state's masks) and one mask per instance
// token.
func RunGrammar(ctx context.Context, o GrammarOptions) (*GrammarResult, error) {
	if o.Tokenizer == nil {
		return nil, errors.New("bench: grammar: no tokenizer")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultGrammarTimeout
	}
	ws := o.Whitespace
	if ws == "" {
		ws = "flexible"
	}
	names, err := grammarFiles(o.DataDir)
	if err != nil {
		return nil, err
	}
	if o.Limit > 0 && len(names) > o.Limit {
		names = names[:o.Limit]
	}
	r := &GrammarResult{Mode: "grammar", DataDir: o.DataDir, Tokenizer: o.TokenizerName, VocabSize: o.Tokenizer.VocabSize(),
		Whitespace: ws, TimeoutSeconds: o.Timeout.Seconds(), CPU: CPUDescription(), Results: []GrammarFile{}, CompileErrorKeywords: []KeywordCount{}}
	start := time.Now()
	vocab, err := grammar.NewVocab(o.Tokenizer, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: grammar: %w", err)
	}
	r.VocabMillis = float64(time.Since(start).Microseconds()) / 1e3
	if r.TrieMillis, err = buildTrie(vocab); err != nil {
		return nil, fmt.Errorf("bench: grammar: %w", err)
	}

	run := &grammarRun{opts: jsonschema.Options{Whitespace: ws}, tok: o.Tokenizer, vocab: vocab, timeout: o.Timeout,
		mask: make([]uint32, (len(vocab.Tokens)+31)/32), keywords: map[string]int{}, r: r}
	bar := newProgress(o.Progress, len(names), "grammar", "file")
	var ttfm []float64
	for _, name := range names {
		if ctx.Err() != nil {
			r.Interrupted = true
			break
		}
		data, err := os.ReadFile(filepath.Join(o.DataDir, name))
		if err != nil {
			return nil, fmt.Errorf("bench: grammar: %w", err)
		}
		var f maskBenchFile
		if err := json.Unmarshal(data, &f); err != nil {
			return nil, fmt.Errorf("bench: grammar: %s: %w", name, err)
		}
		for i, t := range f.Tests {
			if t.Text == nil {
				return nil, fmt.Errorf("bench: grammar: %s: test %d has no \"text\"", name, i)
			}
		}
		res := run.file(name, &f)
		r.Results = append(r.Results, res)
		r.Files++
		switch res.Status {
		case GrammarPass:
			r.Passing++
		case GrammarCompileError:
			r.CompileErrors++
			run.keywords[res.Keyword]++
		case GrammarTimeout:
			r.Timeouts++
		case GrammarValidationError:
			r.ValidationErrors++
		case GrammarInvalidationError:
			r.InvalidationErrors++
		}
		if res.TTFMMicros > 0 {
			ttfm = append(ttfm, res.TTFMMicros)
		}
		bar.add()
	}
	bar.finish()
	r.DurationSeconds = time.Since(start).Seconds()
	for k, n := range run.keywords {
		r.CompileErrorKeywords = append(r.CompileErrorKeywords, KeywordCount{k, n})
	}
	slices.SortFunc(r.CompileErrorKeywords, func(a, b KeywordCount) int {
		if a.Files != b.Files {
			return b.Files - a.Files
		}
		return strings.Compare(a.Keyword, b.Keyword)
	})
	r.TTFM = grammarPercentiles(ttfm)
	r.Mask = grammarPercentiles(run.masks)
	return r, nil
}

// grammarFiles lists the *.json files of dir, sorted by name.
func grammarFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bench: grammar: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("bench: grammar: no .json files in %s", dir)
	}
	slices.Sort(names)
	return names, nil
}

// grammarRun is the state shared by a run's files.
type grammarRun struct {
	opts     jsonschema.Options
	tok      *tokenizer.Tokenizer
	vocab    *grammar.Vocab
	timeout  time.Duration
	mask     []uint32
	masks    []float64 // every timed mask, µs
	keywords map[string]int
	r        *GrammarResult
}

// file runs one file's schema and tests.
func (g *grammarRun) file(name string, f *maskBenchFile) GrammarFile {
	res := GrammarFile{Name: name, Tests: len(f.Tests)}
	start := time.Now()
	deadline := start.Add(g.timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, kw, err := g.compile(ctx, f.Schema)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			res.Status, res.Error = GrammarTimeout, err.Error()
			return res
		}
		res.Status, res.Keyword, res.Error = GrammarCompileError, kw, err.Error()
		return res
	}
	c.NewMatcher().ComputeMask(g.mask)
	res.TTFMMicros = micros(time.Since(start))
	if time.Now().After(deadline) {
		res.Status = GrammarTimeout
		return res
	}
	// Counted into the run only when the file does not time out.
	var tests, valid, invalid, verr, ierr, mismatch int
	var masks []float64
	for i, t := range f.Tests {
		m := c.NewMatcher()
		toks := g.tok.Encode(*t.Text, false)
		ok := true
		for _, id := range toks {
			t0 := time.Now()
			m.ComputeMask(g.mask)
			t1 := time.Now()
			masks = append(masks, micros(t1.Sub(t0)))
			allowed := id >= 0 && id < len(g.mask)*32 && g.mask[id>>5]>>(id&31)&1 != 0
			if allowed {
				if err := m.Commit(id); err != nil {
					mismatch++
					allowed = false
				}
			}
			if t1.After(deadline) || time.Now().After(deadline) {
				res.Status, res.Masks = GrammarTimeout, len(masks)
				g.masks = append(g.masks, masks...)
				return res
			}
			if !allowed {
				ok = false
				break
			}
		}
		accepted := ok && m.IsAccepting()
		tests++
		if t.Valid {
			valid++
			if !accepted {
				verr++
				if res.Status != GrammarValidationError {
					res.Status = GrammarValidationError
					res.Error = fmt.Sprintf("valid test %d (%s) refused", i, t.Description)
				}
			}
		} else {
			invalid++
			if accepted {
				ierr++
				if res.Status == "" {
					res.Status = GrammarInvalidationError
					res.Error = fmt.Sprintf("invalid test %d (%s) accepted", i, t.Description)
				}
			}
		}
	}
	if res.Status == GrammarInvalidationError && verr > 0 {
		res.Status = GrammarValidationError // validation errors take precedence
	}
	if res.Status == "" {
		res.Status = GrammarPass
	}
	res.Masks = len(masks)
	g.masks = append(g.masks, masks...)
	r := g.r
	r.Tests += tests
	r.ValidTests += valid
	r.InvalidTests += invalid
	r.TestValidationErrors += verr
	r.TestInvalidationErrors += ierr
	r.MaskCommitMismatches += mismatch
	return res
}

// compile converts, parses and compiles a schema within ctx (its deadline
// stops the conversion and the start state's trie walks); on failure kw
// names the cause: the keyword of a *jsonschema.Error, or "(invalid schema)",
// "(gbnf)", "(compile)", "(other)".
func (g *grammarRun) compile(ctx context.Context, schema json.RawMessage) (c *grammar.Compiled, kw string, err error) {
	src, err := jsonschema.ToGBNFContext(ctx, schema, g.opts)
	if err != nil {
		var je *jsonschema.Error
		switch {
		case errors.As(err, &je) && je.Keyword != "":
			return nil, je.Keyword, err
		case strings.Contains(err.Error(), "invalid schema JSON"):
			return nil, "(invalid schema)", err
		}
		return nil, "(other)", err
	}
	gr, err := grammar.ParseGBNF(src)
	if err != nil {
		return nil, "(gbnf)", err
	}
	c, err = grammar.CompileContext(ctx, gr, g.vocab)
	if err != nil {
		return nil, "(compile)", err
	}
	return c, "", nil
}

// buildTrie times the first Compile against v (of a one-literal grammar),
// which builds the byte trie later Compiles share, in milliseconds.
func buildTrie(v *grammar.Vocab) (float64, error) {
	g, err := grammar.ParseGBNF(`root ::= "a"`)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if _, err := grammar.Compile(g, v); err != nil {
		return 0, err
	}
	return micros(time.Since(t0)) / 1e3, nil
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// grammarPercentiles summarizes xs (µs); all zero when empty.
func grammarPercentiles(xs []float64) GrammarPercentiles {
	if len(xs) == 0 {
		return GrammarPercentiles{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	q := func(p float64) float64 { return stat.Quantile(p, stat.Empirical, s, nil) }
	return GrammarPercentiles{Count: len(s), Mean: stat.Mean(s, nil), P25: q(0.25), P50: q(0.5), P75: q(0.75), P90: q(0.9),
		P95: q(0.95), P99: q(0.99), P999: q(0.999), Max: s[len(s)-1]}
}

// CPUDescription names the host's processor (from /proc/cpuinfo where
// there is one) and its hardware threads, e.g. "Intel(R) Xeon(R) Processor,
// 2 threads".
func CPUDescription() string {
	model := runtime.GOARCH
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d threads", model, runtime.NumCPU())
}
