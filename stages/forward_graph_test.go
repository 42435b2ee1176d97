package stages

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

// fakeGraphOps gives the CPU backend the graph capability of the CUDA
// backend: a "graph" re-runs the captured function on replay, so it reads
// the static inputs as they are at replay time, as a CUDA graph does.
type fakeGraphOps struct {
	kernels.Ops
	replays  int
	captures int
	failWith error // CaptureGraph fails with this when set
}

type fakeGraph struct {
	fn    func() error
	ops   *fakeGraphOps
	nodes int
}

func (g *fakeGraph) Replay() error { g.ops.replays++; return g.fn() }
func (g *fakeGraph) Close() error  { return nil }

// Nodes counts the graphs captured before it and this one, times 100: a
// census the stats record (kernels/cuda.Graph's method).
func (g *fakeGraph) Nodes() int { return g.nodes }

func (f *fakeGraphOps) CaptureGraph(fn func() error) (interface {
	Replay() error
	Close() error
}, error) {
	if f.failWith != nil {
		return nil, f.failWith
	}
	if err := fn(); err != nil {
		return nil, err
	}
	f.captures++
	return &fakeGraph{fn: fn, ops: f, nodes: 100 * f.captures}, nil
}

// logitsCounting counts a model's ComputeLogits calls.
type logitsCounting struct {
	models.Model
	calls int
}

func (m *logitsCounting) ComputeLogits(hidden, rows kernels.Tensor) (kernels.Tensor, error) {
	m.calls++
	return m.Model.ComputeLogits(hidden, rows)
}

func (f *fakeGraphOps) CopyRect(dst, src kernels.Tensor) error {
	r, c, w := src.Shape()[0], src.Shape()[1], dst.Shape()[1]
	es := dst.DType().Size()
	sv := make([]byte, kernels.NumElements(src)*es)
	dv := make([]byte, kernels.NumElements(dst)*es)
	if err := f.Download(sv, src); err != nil {
		return err
	}
	if err := f.Download(dv, dst); err != nil {
		return err
	}
	for i := range r {
		copy(dv[i*w*es:(i*w+c)*es], sv[i*c*es:(i+1)*c*es])
	}
	return f.Upload(dst, dv, dst.DType())
}

// graphTestRuntime is a tiny Llama on the CPU backend with its own cache.
func graphTestRuntime(t *testing.T, dir string, withGraphs bool) (*ForwardDeps, *fakeGraphOps) {
	t.Helper()
	c := cpu.New(cpu.Options{Threads: 1})
	t.Cleanup(func() { c.Close() })
	m, err := models.Builtin().Load(c, dir, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := m.NewKVCache(64, 4)
	if err != nil {
		t.Fatal(err)
	}
	if cache.Spec.RingLayers > 0 { // a state slot for each of graphSeq's ids 1..8
		if err := cache.AllocStateSlots(c, 8); err != nil {
			t.Fatal(err)
		}
	}
	rt := &ForwardDeps{Model: m, Ops: c, Cache: cache, Stats: &Stats{}}
	var fake *fakeGraphOps
	if withGraphs {
		fake = &fakeGraphOps{Ops: c}
		rt.Ops = fake
	}
	return rt, fake
}

// graphSeq is one sequence of the test: its tokens so far and its blocks.
type graphSeq struct {
	id     engine.SeqID
	tokens []int
	cached int
	table  []int
}

func (s *graphSeq) meta(row int) engine.SequenceMetadata {
	in := s.tokens[s.cached:]
	return engine.SequenceMetadata{SeqID: s.id, RequestID: "r", SeqlenQ: len(in), SeqlenK: len(s.tokens),
		PosStart: s.cached, InputTokenIDs: in, InputFromRow: -1, BlockTable: s.table,
		Prefill: s.cached == 0, Sample: true, SampleRow: row, StateSlot: int(s.id) - 1}
}

// runStep prepares and forwards one step over seqs and returns the logits
// rows.
func runStep(t *testing.T, f *forward, id engine.StepID, seqs []*graphSeq) []float32 {
	t.Helper()
	step := &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: id, NumSampleRows: len(seqs)}}
	for i, s := range seqs {
		step.Seqs = append(step.Seqs, s.meta(i))
		step.Outputs.NumBatchedTokens += len(s.tokens) - s.cached
	}
	ctx := context.Background()
	prep, err := prepareFor(f.d).Process(ctx, step)
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Process(ctx, prep)
	if err != nil {
		t.Fatal(err)
	}
	v, err := kernels.ToF32(f.d.Ops, res.Logits)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The decode steps that replay a graph (padded to 2 or 4 rows) give the
// logits of eager steps bit for bit, padding rows write no cache entry (nor
// ring row), and steps the graphs cannot serve (prefill, 5 sequences) run
// eagerly: for a Llama, and for Gemma 3's fixture, whose window layers
// keep their keys in per-sequence rings (window 4: the decodes wrap them)
// that the graphs' static batch carries the state slots of.
func TestForwardGraphsMatchEager(t *testing.T) {
	llama := t.TempDir()
	if err := random.WriteLlama(llama, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, dir string }{
		{"llama", llama},
		{"gemma3-rings", "../testdata/models/gemma3/f32"},
	} {
		t.Run(c.name, func(t *testing.T) { checkGraphsMatchEager(t, c.dir) })
	}
}

func checkGraphsMatchEager(t *testing.T, dir string) {
	eager, _ := graphTestRuntime(t, dir, false)
	graphed, fake := graphTestRuntime(t, dir, true)
	counted := &logitsCounting{Model: graphed.Model}
	graphed.Model = counted
	graphs, err := newDecodeGraphs(*graphed, []int{2, 4})
	if err != nil {
		t.Fatal(err)
	}
	fEager, fGraphed := &forward{d: *eager}, &forward{d: *graphed, graphs: graphs}
	defer fGraphed.Close()
	prompts := [][]int{{1, 5, 9, 3, 7}, {1, 2, 3, 4, 5, 6, 7}, {1, 8, 8}, {1, 30, 31, 32}, {1, 40}}
	newSeqs := func() []*graphSeq {
		var ss []*graphSeq
		for i, p := range prompts {
			table := make([]int, 8)
			for j := range table {
				table[j] = 63 - (i*8 + j) // blocks far from block 0, which padding rows read
			}
			ss = append(ss, &graphSeq{id: engine.SeqID(i + 1), tokens: append([]int(nil), p...), table: table})
		}
		return ss
	}
	es, gs := newSeqs(), newSeqs()
	pick := func(ss []*graphSeq, idx ...int) []*graphSeq {
		var out []*graphSeq
		for _, i := range idx {
			out = append(out, ss[i])
		}
		return out
	}
	schedule := [][]int{
		{0, 1, 2, 3, 4}, // prefill: eager
		{0, 1, 2},       // decode, padded to 4
		{0, 1, 2},
		{0},             // padded to 2
		{0, 1, 2, 3, 4}, // 5 > 4: eager
		{1, 3},          // exactly 2
		{0, 1, 2, 3},    // exactly 4
	}
	vocab := eager.Model.Config().VocabSize
	wantReplays := 0
	for k, idx := range schedule {
		if k > 0 && len(idx) <= 4 {
			wantReplays++
		}
		id := engine.StepID(k + 1)
		want := runStep(t, fEager, id, pick(es, idx...))
		got := runStep(t, fGraphed, id, pick(gs, idx...))
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
				t.Fatalf("step %d: logits[%d] = %v with graphs, %v eager", id, i, got[i], want[i])
			}
		}
		// Greedy next tokens, the same on both sides.
		for r, i := range idx {
			row := want[r*vocab : (r+1)*vocab]
			best := 0
			for j, v := range row {
				if v > row[best] {
					best = j
				}
			}
			for _, ss := range [][]*graphSeq{es, gs} {
				ss[i].cached = len(ss[i].tokens)
				ss[i].tokens = append(ss[i].tokens, best)
			}
		}
	}
	if fake.replays != wantReplays {
		t.Errorf("%d graph replays, want %d", fake.replays, wantReplays)
	}
	// Logits: a warm-up and a capture per graph, one per replay (a graph
	// step hands on its captured logits), one per eager step.
	if want := 2*2 + wantReplays + len(schedule) - wantReplays; counted.calls != want {
		t.Errorf("%d logits passes, want %d", counted.calls, want)
	}
	if got := graphed.Stats.GraphSteps.Load(); got != int64(wantReplays) {
		t.Errorf("Stats.GraphSteps = %d, want %d", got, wantReplays)
	}
	if got := eager.Stats.GraphSteps.Load(); got != 0 {
		t.Errorf("eager runtime: Stats.GraphSteps = %d, want 0", got)
	}
	// The graphs of 2 and 4 rows, captured in that order, with their nodes.
	if got, want := graphed.Stats.GraphNodes(), []GraphNodes{{2, 100}, {4, 200}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Stats.GraphNodes() = %v, want %v", got, want)
	}
	if rings := eager.Cache.Spec.RingLayers; rings > 0 && (len(eager.Cache.RingK) != rings || fake.replays == 0) {
		t.Fatalf("%d ring layers, %d ring tensors, %d replays", rings, len(eager.Cache.RingK), fake.replays)
	}
	var pairs [][2]kernels.Tensor
	for l := range eager.Cache.K {
		pairs = append(pairs, [2]kernels.Tensor{eager.Cache.K[l], graphed.Cache.K[l]}, [2]kernels.Tensor{eager.Cache.V[l], graphed.Cache.V[l]})
	}
	for l := range eager.Cache.RingK {
		pairs = append(pairs, [2]kernels.Tensor{eager.Cache.RingK[l], graphed.Cache.RingK[l]}, [2]kernels.Tensor{eager.Cache.RingV[l], graphed.Cache.RingV[l]})
	}
	for l, pair := range pairs {
		{
			a, err := kernels.ToF32(eager.Ops, pair[0])
			if err != nil {
				t.Fatal(err)
			}
			b, err := kernels.ToF32(graphed.Ops, pair[1])
			if err != nil {
				t.Fatal(err)
			}
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("cache tensor %d: element %d is %v with graphs, %v eager (a padding row wrote it?)", l, i, b[i], a[i])
				}
			}
		}
	}
}

func TestForwardGraphsErrors(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	plain, _ := graphTestRuntime(t, dir, false)
	if _, err := newDecodeGraphs(*plain, []int{1}); err == nil || !strings.Contains(err.Error(), "cannot capture") {
		t.Errorf("a backend without graphs: %v", err)
	}
	rt, fake := graphTestRuntime(t, dir, true)
	// Bad batch sizes are the config's to refuse (cuda_graph.batch_sizes,
	// engine/config); a capture that fails fails the stage's Start.
	boom := errors.New("boom")
	fake.failWith = boom
	if _, err := newDecodeGraphs(*rt, []int{1, 2}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "batch size 1") {
		t.Errorf("a failing capture: %v", err)
	}
	d := *rt
	d.CUDAGraph = CUDAGraph{Enabled: true, BatchSizes: []int{1}}
	if err := newForward(d).Start(t.Context()); !errors.Is(err, boom) {
		t.Errorf("Start with a failing capture = %v, want boom", err)
	}
	plain.CUDAGraph = CUDAGraph{Enabled: true, BatchSizes: []int{1}}
	f := newForward(*plain) // the constructor does no device work
	if err := f.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "cannot capture") {
		t.Errorf("Start of graphs on a backend without them = %v", err)
	}
}

// countingPrepareRuntime is a tiny random Llama's runtime on the CPU with
// its backend's uploads and allocations counted.
func countingPrepareRuntime(t *testing.T) (*ForwardDeps, *opstest.Counting) {
	t.Helper()
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	rt, _ := graphTestRuntime(t, dir, false)
	counting := &opstest.Counting{Ops: rt.Ops}
	rt.Ops = counting
	return rt, counting
}

// A step's metadata, its placeholders' source rows and its sample rows (and
// prompt-logprob rows) reach the backend in one copy.
func TestPrepareOneUpload(t *testing.T) {
	rt, counting := countingPrepareRuntime(t)
	a := engine.SequenceMetadata{SeqID: 1, RequestID: "a", SeqlenQ: 1, SeqlenK: 5, PosStart: 4,
		InputTokenIDs: []int{engine.PlaceholderToken}, InputFromRow: 1, BlockTable: []int{0, 1},
		Sample: true, SampleRow: 0}
	b := engine.SequenceMetadata{SeqID: 2, RequestID: "b", SeqlenQ: 3, SeqlenK: 3, PosStart: 0,
		InputTokenIDs: []int{7, 8, 9}, TokenIDs: []int{7, 8, 9}, InputFromRow: -1, BlockTable: []int{2},
		Prefill: true, Sample: true, SampleRow: 1, PromptLogprobsFrom: 0, PromptLogprobsTo: 2}
	step := &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: 3, NumSampleRows: 2, NumBatchedTokens: 4},
		Seqs: []engine.SequenceMetadata{a, b}}
	prep, err := prepareFor(*rt).Process(context.Background(), step)
	if err != nil {
		t.Fatal(err)
	}
	if counting.Uploads != 1 {
		t.Errorf("%d uploads for one step, want 1", counting.Uploads)
	}
	if prep.RowsInOrder {
		t.Errorf("RowsInOrder with prompt-logprob rows")
	}
	// A decode step of two sequences samples its rows in order; a fork
	// repeats its parent's row.
	a.InputTokenIDs, a.InputFromRow = []int{5}, -1
	c := a
	c.SeqID, c.SampleRow, c.BlockTable = 3, 1, []int{3, 4}
	for _, tc := range []struct {
		name  string
		seqs  []engine.SequenceMetadata
		rows  int
		order bool
	}{
		{"decode", []engine.SequenceMetadata{a, c}, 2, true},
		{"decode with a fork", []engine.SequenceMetadata{a, func() engine.SequenceMetadata { f := c; f.ForkSeqIDs = []engine.SeqID{4}; return f }()}, 3, false},
	} {
		step := &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: 4, NumSampleRows: tc.rows, NumBatchedTokens: 2}, Seqs: tc.seqs}
		prep, err := prepareFor(*rt).Process(context.Background(), step)
		if err != nil {
			t.Fatal(err)
		}
		if prep.RowsInOrder != tc.order {
			t.Errorf("%s: RowsInOrder %v, want %v", tc.name, prep.RowsInOrder, tc.order)
		}
	}
	for _, c := range []struct {
		name string
		got  kernels.Tensor
		want []int32
	}{
		{"input ids", prep.Batch.InputIDs, []int32{int32(engine.PlaceholderToken), 7, 8, 9}},
		{"from rows", prep.FromRow, []int32{1, -1, -1, -1}},
		{"sample rows, then prompt-logprob rows", prep.SampleRows, []int32{0, 3, 1, 2}},
	} {
		v, err := kernels.ToI32(rt.Ops, c.got)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, c.want) {
			t.Errorf("%s: %v, want %v", c.name, v, c.want)
		}
	}
}

// The captured block tables are as wide as the longest sequence the engine
// can hold, by whichever bound is least.
func TestGraphTableBlocks(t *testing.T) {
	for _, c := range []struct {
		numBlocks, blockSize, maxPositions, maxModelLen, want int
	}{
		{100000, 16, 40960, 2048, 128}, // max_model_len (Qwen3-0.6B's offline workload)
		{100000, 16, 40960, 0, 2560},   // no scheduler: the model's positions
		{100000, 16, 0, 0, 100000},     // nothing but the cache
		{64, 16, 40960, 2048, 64},      // a small cache
		{100000, 16, 1000, 2048, 63},   // the model's positions, rounded up
		{100000, 16, 0, 2049, 129},     // a partial last block
	} {
		if got := graphTableBlocks(c.numBlocks, c.blockSize, c.maxPositions, c.maxModelLen); got != c.want {
			t.Errorf("graphTableBlocks(%d, %d, %d, %d) = %d, want %d", c.numBlocks, c.blockSize, c.maxPositions, c.maxModelLen, got, c.want)
		}
	}
}

// prepareFor is the prepare stage over d's backend and cache.
func prepareFor(d ForwardDeps) *prepare {
	return newPrepare(PrepareDeps{Ops: d.Ops, BlockSize: d.Cache.BlockSize, NumBlocks: d.Cache.NumBlocks, Stats: d.Stats,
		RingWindow: d.Cache.Spec.RingWindow})
}

// A speculative verify step (a decode with drafts: prepare lays out each of
// its rows as a one-token decode row) replays the decode graphs, and every
// row's logits are, bit for bit, those of the eager step and those of plain
// one-token decodes of the same tokens.
func TestForwardGraphsVerifyRows(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 12); err != nil {
		t.Fatal(err)
	}
	eager, _ := graphTestRuntime(t, dir, false)
	graphed, fake := graphTestRuntime(t, dir, true)
	plain, _ := graphTestRuntime(t, dir, false)
	graphs, err := newDecodeGraphs(*graphed, []int{2, 8})
	if err != nil {
		t.Fatal(err)
	}
	fEager, fGraphed, fPlain := &forward{d: *eager}, &forward{d: *graphed, graphs: graphs}, &forward{d: *plain}
	defer fGraphed.Close()
	prompts := [][]int{{1, 5, 9, 3, 7}, {1, 2, 3}}
	drafts := [][]int{{11, 12, 13}, {21}} // the last input, then the drafts
	tables := [][]int{{40, 41, 42, 43}, {50, 51, 52, 53}}
	var want []float32
	// Plain decodes: the prompt, then each input token alone.
	for s, p := range prompts {
		seq := &graphSeq{id: engine.SeqID(s + 1), tokens: append([]int(nil), p...), table: tables[s]}
		runStep(t, fPlain, 1, []*graphSeq{seq})
		for _, tok := range drafts[s] {
			seq.cached = len(seq.tokens)
			seq.tokens = append(seq.tokens, tok)
			want = append(want, runStep(t, fPlain, 2, []*graphSeq{seq})...)
		}
	}
	for _, f := range []*forward{fEager, fGraphed} {
		var metas []engine.SequenceMetadata
		numTokens := 0
		for s, p := range prompts {
			seq := &graphSeq{id: engine.SeqID(s + 1), tokens: append([]int(nil), p...), table: tables[s]}
			runStep(t, f, 1, []*graphSeq{seq})
			seq.cached = len(seq.tokens)
			seq.tokens = append(seq.tokens, drafts[s]...)
			m := seq.meta(s)
			m.NumDrafts = len(drafts[s]) - 1
			metas = append(metas, m)
			numTokens += m.SeqlenQ
		}
		step := &ScheduledStep{Seqs: metas, Outputs: &engine.SchedulerOutputs{StepID: 2, Kind: engine.StepDecode,
			NumSampleRows: 2, NumBatchedTokens: numTokens, NumDecodeSeqs: 2, NumDecodeTokens: numTokens, NumDraftTokens: numTokens - 2}}
		prep, err := prepareFor(f.d).Process(context.Background(), step)
		if err != nil {
			t.Fatal(err)
		}
		if len(prep.Rows) != numTokens {
			t.Fatalf("%d logits rows, want %d", len(prep.Rows), numTokens)
		}
		res, err := f.Process(context.Background(), prep)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kernels.ToF32(f.d.Ops, res.Logits)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
				t.Fatalf("graphs %v: logits[%d] = %v, plain decodes %v", f.graphs != nil, i, got[i], want[i])
			}
		}
	}
	if fake.replays != 1 {
		t.Errorf("%d graph replays, want 1 (the verify step)", fake.replays)
	}
}

// With the loop's in-flight bound known, the prepare stage uploads each
// step into the buffer of the step InFlight+1 before it: after the first
// InFlight+1 steps it allocates nothing, and a step's batch keeps its
// values until that later step reuses its buffer.
func TestPrepareReusesUploads(t *testing.T) {
	rt, counting := countingPrepareRuntime(t)
	const inFlight = 2
	p := newPrepare(PrepareDeps{Ops: counting, BlockSize: rt.Cache.BlockSize, NumBlocks: rt.Cache.NumBlocks, InFlight: inFlight})
	var preps []*PreparedStep
	for k := range 8 {
		n := 1 + k%3 // decodes of 1 to 3 sequences: the buffer's size varies
		step := &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: engine.StepID(k + 1), NumSampleRows: n, NumBatchedTokens: n}}
		for i := range n {
			step.Seqs = append(step.Seqs, engine.SequenceMetadata{SeqID: engine.SeqID(i + 1), RequestID: "r", SeqlenQ: 1,
				SeqlenK: 5 + k, PosStart: 4 + k, InputTokenIDs: []int{100*k + i}, InputFromRow: -1,
				BlockTable: []int{i, 10 + i, 20 + i}, Sample: true, SampleRow: i})
		}
		before := counting.Allocs
		prep, err := p.Process(context.Background(), step)
		if err != nil {
			t.Fatal(err)
		}
		if k > inFlight+2 && counting.Allocs != before {
			t.Errorf("step %d allocated %d tensors, want none", k+1, counting.Allocs-before)
		}
		preps = append(preps, prep)
		// The steps still in flight keep their inputs.
		for j := max(0, k-inFlight); j <= k; j++ {
			ids, err := kernels.ToI32(counting, preps[j].Batch.InputIDs)
			if err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				if int(id) != 100*j+i {
					t.Fatalf("after step %d: step %d's input %d is %d, want %d", k+1, j+1, i, id, 100*j+i)
				}
			}
		}
	}
	if counting.Uploads != 8 {
		t.Errorf("%d uploads for 8 steps, want 8", counting.Uploads)
	}
	// Without the bound every step gets a buffer of its own.
	q := newPrepare(PrepareDeps{Ops: counting, BlockSize: rt.Cache.BlockSize, NumBlocks: rt.Cache.NumBlocks})
	if q.bufs != nil {
		t.Errorf("InFlight 0: %d buffers kept", len(q.bufs))
	}
}
