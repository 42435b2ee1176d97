package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const testVocab = 64

// checkInvariants verifies the Scheduler's bookkeeping: resources held only
// by live sequences, counters, queue membership and order, and the block
// manager's own invariants. O(everything); tests only.
func (s *Scheduler) checkInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var live []*Sequence
	slots := map[int]SeqID{}
	reserved := 0
	for id, q := range s.seqs {
		if q.id != id || q.status == StatusFinished {
			return fmt.Errorf("seq %d: in the table as %d with status %v", q.id, id, q.status)
		}
		if !q.isLive() {
			if len(q.blockTable) != 0 || q.stateSlot >= 0 {
				return fmt.Errorf("seq %d (%v) holds %d blocks, state slot %d", q.id, q.status, len(q.blockTable), q.stateSlot)
			}
			continue
		}
		live = append(live, q)
		if !s.sm.owns(int(q.stateSlot), q.id) {
			return fmt.Errorf("seq %d: state slot %d not owned", q.id, q.stateSlot)
		}
		if other, dup := slots[int(q.stateSlot)]; dup {
			return fmt.Errorf("seqs %d and %d share state slot %d", q.id, other, q.stateSlot)
		}
		slots[int(q.stateSlot)] = q.id
		reserved += q.numForks
		if q.numComputed > q.totalLen() {
			return fmt.Errorf("seq %d: %d computed of %d tokens", q.id, q.numComputed, q.totalLen())
		}
	}
	if len(live) != s.numLive || reserved != s.numReserved {
		return fmt.Errorf("live %d (counter %d), reserved %d (counter %d)", len(live), s.numLive, reserved, s.numReserved)
	}
	if s.numLive+s.numReserved > s.cfg.MaxNumSeqs {
		return fmt.Errorf("live %d + reserved %d > max_num_seqs %d", s.numLive, s.numReserved, s.cfg.MaxNumSeqs)
	}
	if s.sm.NumUsed() != len(live) {
		return fmt.Errorf("state slots used %d, live %d", s.sm.NumUsed(), len(live))
	}
	if err := s.bm.checkInvariants(live); err != nil {
		return err
	}
	queues := []struct {
		name   string
		q      []*Sequence
		status []SequenceStatus
	}{
		{"waiting", s.waiting, []SequenceStatus{StatusWaiting, StatusPreempted}},
		{"prompted", s.prompted, []SequenceStatus{StatusPrompted}},
		{"running", s.running, []SequenceStatus{StatusRunning}},
	}
	member := map[*Sequence]string{}
	for _, qu := range queues {
		var prev *Sequence
		for _, q := range qu.q {
			if !slices.Contains(qu.status, q.status) {
				continue // stale, dropped lazily
			}
			if where, dup := member[q]; dup {
				return fmt.Errorf("seq %d in %s and %s", q.id, where, qu.name)
			}
			member[q] = qu.name
			if prev != nil && !older(prev, q) {
				return fmt.Errorf("%s queue out of order: seq %d before %d", qu.name, prev.id, q.id)
			}
			prev = q
		}
	}
	for _, q := range s.seqs {
		if _, ok := member[q]; !ok && q.status != StatusWaitingForGrammar {
			return fmt.Errorf("seq %d (%v) in no queue", q.id, q.status)
		}
	}
	return nil
}

type runOptions struct {
	zos      bool // plan step N+1 before processing step N
	reuse    bool // recycle metadata buffers through ScheduleInto
	maxSteps int
}

type runResult struct {
	outputs        map[string]map[int][]int
	reasons        map[string]map[int]FinishReason
	numPreemptions int64
	prefix         PrefixCacheStats
	checkpoints    CheckpointStats
	steps          int
	sawPlaceholder bool
	sawCopies      bool
	sawChunks      bool
}

// runWorkload drives a Scheduler with the fake model and checks, after
// every step, the budgets and the invariants; it fails the test on any
// violation and returns what every sequence produced.
func runWorkload(t *testing.T, cfg SchedulerConfig, reqs []testRequest, opt runOptions) runResult {
	t.Helper()
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = s.Config()
	model := newFakeModel(cfg, testVocab)
	res := runResult{outputs: map[string]map[int][]int{}, reasons: map[string]map[int]FinishReason{}}
	record := func(fs []FinishedSequence) {
		for _, f := range fs {
			if res.reasons[f.RequestID] == nil {
				res.reasons[f.RequestID] = map[int]FinishReason{}
				res.outputs[f.RequestID] = map[int][]int{}
			}
			if r, dup := res.reasons[f.RequestID][f.Index]; dup {
				t.Fatalf("request %s index %d finished twice (%v, then %v)", f.RequestID, f.Index, r, f.Reason)
			}
			if f.Reason == FinishNone {
				t.Fatalf("request %s index %d finished with no reason", f.RequestID, f.Index)
			}
			res.reasons[f.RequestID][f.Index] = f.Reason
			res.outputs[f.RequestID][f.Index] = f.OutputTokenIDs
		}
	}
	if opt.maxSteps == 0 {
		opt.maxSteps = 20000
	}
	added := 0
	type flying struct {
		id      StepID
		sampled []SampledTokens
	}
	var prev *flying
	var bufs [2][]SequenceMetadata
	for step := 0; ; step++ {
		if step > opt.maxSteps {
			t.Fatalf("not done after %d steps: %+v", opt.maxSteps, s.Stats())
		}
		for _, r := range reqs {
			if r.arriveStep == step {
				if _, err := s.Add(NewSequence(r.id, r.prompt, r.params, time.Time{})); err != nil {
					t.Fatalf("add %s: %v", r.id, err)
				}
				added++
			}
			if r.abortStep == step {
				record(s.Abort(r.id))
			}
		}
		var out *SchedulerOutputs
		var metas []SequenceMetadata
		if opt.reuse {
			out, metas = s.ScheduleInto(bufs[step%2])
			if metas != nil {
				bufs[step%2] = metas
			}
		} else {
			out, metas = s.Schedule()
		}
		record(out.Finished)
		checkStep(t, cfg, out, metas)
		// Victims are the youngest: younger than everything scheduled.
		for _, pid := range out.PreemptedSeqIDs {
			for _, m := range metas {
				if p, q := s.Sequence(pid), s.Sequence(m.SeqID); p != nil && q != nil && !older(q, p) {
					t.Fatalf("step %d: preempted seq %d, older than scheduled seq %d", out.StepID, pid, m.SeqID)
				}
			}
		}
		if slices.ContainsFunc(metas, func(m SequenceMetadata) bool { return m.InputFromRow >= 0 }) {
			res.sawPlaceholder = true
		}
		res.sawCopies = res.sawCopies || len(out.BlockCopies) > 0
		var cur *flying
		if out.StepID != 0 {
			sampled, err := model.run(out, metas)
			if err != nil {
				t.Fatalf("step %d: %v", out.StepID, err)
			}
			cur = &flying{out.StepID, sampled}
			for _, m := range metas {
				if m.Prefill && !m.Sample {
					res.sawChunks = true
				}
			}
		}
		if opt.zos {
			if prev != nil {
				fin, err := s.ProcessOutputs(prev.id, prev.sampled)
				if err != nil {
					t.Fatal(err)
				}
				record(fin)
			}
			prev = cur
		} else if cur != nil {
			fin, err := s.ProcessOutputs(cur.id, cur.sampled)
			if err != nil {
				t.Fatal(err)
			}
			record(fin)
		}
		if err := s.checkInvariants(); err != nil {
			t.Fatalf("after step %d: %v", out.StepID, err)
		}
		if added == len(reqs) && !s.HasUnfinished() && prev == nil {
			res.steps = step
			break
		}
	}
	st := s.Stats()
	if st.NumFreeBlocks != st.NumBlocks && !cfg.EnablePrefixCaching {
		t.Fatalf("blocks leaked: %d free of %d", st.NumFreeBlocks, st.NumBlocks)
	}
	if s.bm.NumUsedBlocks() != 0 || st.NumFreeStateSlots != st.NumStateSlots || s.NumInflightSteps() != 0 {
		t.Fatalf("resources held at the end: %+v", st)
	}
	res.numPreemptions = st.NumPreemptions
	res.prefix = st.PrefixCache
	res.checkpoints = st.Checkpoints
	return res
}

// checkStep verifies a step's budgets and the consistency of its metadata.
func checkStep(t *testing.T, cfg SchedulerConfig, out *SchedulerOutputs, metas []SequenceMetadata) {
	t.Helper()
	if out.StepID == 0 {
		if len(metas) != 0 || out.Kind != StepEmpty {
			t.Fatalf("empty step with %d metas, kind %v", len(metas), out.Kind)
		}
		return
	}
	if len(metas) == 0 || len(metas) > cfg.MaxNumSeqs || out.NumSeqs != len(metas) {
		t.Fatalf("step %d: %d sequences (outputs say %d), max %d", out.StepID, len(metas), out.NumSeqs, cfg.MaxNumSeqs)
	}
	seen := map[SeqID]bool{}
	tokens, rows := 0, 0
	for _, m := range metas {
		if seen[m.SeqID] {
			t.Fatalf("step %d: seq %d twice", out.StepID, m.SeqID)
		}
		seen[m.SeqID] = true
		tokens += m.SeqlenQ
		if m.SeqlenQ < 1 {
			t.Fatalf("step %d: seq %d computes %d tokens", out.StepID, m.SeqID, m.SeqlenQ)
		}
		if m.Prefill {
			if cfg.EnableChunkedPrefill && m.SeqlenQ > cfg.ChunkSize {
				t.Fatalf("step %d: seq %d chunk %d > chunk size %d", out.StepID, m.SeqID, m.SeqlenQ, cfg.ChunkSize)
			}
			if !cfg.EnableChunkedPrefill && m.SeqlenK != len(m.TokenIDs) {
				t.Fatalf("step %d: seq %d prefill split (to %d of %d) without chunked prefill", out.StepID, m.SeqID, m.SeqlenK, len(m.TokenIDs))
			}
			if m.Sample != (m.SeqlenK == len(m.TokenIDs)) {
				t.Fatalf("step %d: seq %d samples %v at %d of %d tokens", out.StepID, m.SeqID, m.Sample, m.SeqlenK, len(m.TokenIDs))
			}
		} else if m.SeqlenQ != 1 || !m.Sample {
			t.Fatalf("step %d: decode of seq %d: q %d, sample %v", out.StepID, m.SeqID, m.SeqlenQ, m.Sample)
		}
		if m.Sample {
			if m.SampleRow != rows {
				t.Fatalf("step %d: seq %d sample row %d, want %d", out.StepID, m.SeqID, m.SampleRow, rows)
			}
			rows += 1 + len(m.ForkSeqIDs)
		}
		if m.SeqlenK > cfg.MaxModelLen {
			t.Fatalf("step %d: seq %d context %d > max_model_len %d", out.StepID, m.SeqID, m.SeqlenK, cfg.MaxModelLen)
		}
		// Captured decode graphs size their block tables by max_model_len.
		if maxBlocks := (cfg.MaxModelLen + cfg.BlockSize - 1) / cfg.BlockSize; len(m.BlockTable) > maxBlocks {
			t.Fatalf("step %d: seq %d block table of %d blocks, max_model_len %d needs at most %d",
				out.StepID, m.SeqID, len(m.BlockTable), cfg.MaxModelLen, maxBlocks)
		}
	}
	if tokens != out.NumBatchedTokens || tokens > cfg.MaxNumBatchedTokens || len(out.InputTokenIDs) != tokens || len(out.SlotMapping) != tokens {
		t.Fatalf("step %d: %d tokens (outputs say %d, %d ids, %d slots), max %d", out.StepID, tokens, out.NumBatchedTokens, len(out.InputTokenIDs), len(out.SlotMapping), cfg.MaxNumBatchedTokens)
	}
	if rows != out.NumSampleRows {
		t.Fatalf("step %d: %d sample rows, outputs say %d", out.StepID, rows, out.NumSampleRows)
	}
}

// genWorkload builds a seeded random workload: prompts sharing a few
// prefixes, mixed max/min tokens, ignore_eos, stop tokens, n > 1, prompt
// logprobs, staggered arrivals and aborts at random points.
func genWorkload(rng *rand.Rand, numReqs, maxPrompt, maxN int, withAborts bool) []testRequest {
	prefixes := make([][]int, 3)
	for i := range prefixes {
		prefixes[i] = make([]int, rng.IntN(maxPrompt/2+1))
		for j := range prefixes[i] {
			prefixes[i][j] = 1 + rng.IntN(testVocab-1)
		}
	}
	reqs := make([]testRequest, numReqs)
	for i := range reqs {
		prompt := slices.Clone(prefixes[rng.IntN(len(prefixes))])
		for n := 1 + rng.IntN(maxPrompt-len(prompt)); n > 0; n-- {
			prompt = append(prompt, 1+rng.IntN(testVocab-1))
		}
		p := DefaultSamplingParams()
		p.MaxTokens = 1 + rng.IntN(40)
		if rng.IntN(4) == 0 {
			p.MinTokens = rng.IntN(p.MaxTokens + 1)
		}
		p.IgnoreEOS = rng.IntN(5) == 0
		if rng.IntN(5) == 0 {
			p.StopTokenIDs = []int{1 + rng.IntN(testVocab-1)}
		}
		if maxN > 1 && rng.IntN(4) == 0 {
			p.N = 2 + rng.IntN(maxN-1)
		}
		if rng.IntN(8) == 0 {
			k := 2
			p.PromptLogprobs = &k
		}
		r := testRequest{id: fmt.Sprintf("r%03d", i), prompt: prompt, params: p, arriveStep: rng.IntN(60), abortStep: -1}
		if withAborts && rng.IntN(8) == 0 {
			r.abortStep = r.arriveStep + rng.IntN(40)
		}
		reqs[i] = r
	}
	return reqs
}

// checkAgainstReference fails unless every sequence of every request
// finished once, with the reference outputs and reason (an aborted one with
// a prefix of them).
func checkAgainstReference(t *testing.T, cfg SchedulerConfig, reqs []testRequest, res runResult) {
	t.Helper()
	for _, r := range reqs {
		got := res.reasons[r.id]
		if len(got) == 0 {
			t.Fatalf("request %s lost: no sequence finished", r.id)
		}
		aborted := false
		for _, reason := range got {
			aborted = aborted || reason == FinishAbort
		}
		if !aborted && len(got) != r.params.N {
			t.Fatalf("request %s: %d of %d sequences finished", r.id, len(got), r.params.N)
		}
		for idx, reason := range got {
			want, wantReason := reference(r, idx, cfg, testVocab)
			out := res.outputs[r.id][idx]
			if reason == FinishAbort {
				if len(out) > len(want) || !slices.Equal(out, want[:len(out)]) {
					t.Fatalf("request %s[%d] aborted with %v, not a prefix of %v", r.id, idx, out, want)
				}
				continue
			}
			if reason != wantReason || !slices.Equal(out, want) {
				t.Fatalf("request %s[%d] (prompt %d, %+v): got %v %v, want %v %v", r.id, idx, len(r.prompt), r.params, reason, out, wantReason, want)
			}
		}
	}
}

func baseConfig() SchedulerConfig {
	return SchedulerConfig{
		MaxNumSeqs:           16,
		MaxNumBatchedTokens:  64,
		MaxModelLen:          96,
		EnableChunkedPrefill: true,
		ChunkSize:            16,
		ChunkAlign:           4,
		BlockSize:            4,
		NumBlocks:            512,
		EnablePrefixCaching:  true,
		EOSTokenIDs:          []int{0},
		VocabSize:            testVocab,
	}
}

func TestSchedulerRandomWorkloads(t *testing.T) {
	type tc struct {
		name        string
		mod         func(*SchedulerConfig)
		zos         bool
		reuse       bool
		wantPreempt bool
	}
	cases := []tc{
		{name: "large", mod: func(c *SchedulerConfig) {}},
		{name: "large-reuse", reuse: true, mod: func(c *SchedulerConfig) {}},
		{name: "large-no-chunk", mod: func(c *SchedulerConfig) { c.EnableChunkedPrefill = false; c.MaxNumBatchedTokens = 96 }},
		{name: "large-no-prefix-cache", mod: func(c *SchedulerConfig) { c.EnablePrefixCaching = false }},
		{name: "large-zos", zos: true, mod: func(c *SchedulerConfig) {}},
		{name: "tiny-kv", wantPreempt: true, mod: func(c *SchedulerConfig) { c.NumBlocks = 26 }},
		{name: "tiny-kv-no-prefix-cache", wantPreempt: true, mod: func(c *SchedulerConfig) { c.NumBlocks = 26; c.EnablePrefixCaching = false }},
		{name: "tiny-kv-no-chunk", wantPreempt: true, mod: func(c *SchedulerConfig) {
			c.NumBlocks = 26
			c.EnableChunkedPrefill = false
			c.MaxNumBatchedTokens = 96
		}},
		{name: "tiny-kv-zos", zos: true, wantPreempt: true, mod: func(c *SchedulerConfig) { c.NumBlocks = 26 }},
		{name: "tiny-kv-zos-reuse", zos: true, reuse: true, wantPreempt: true, mod: func(c *SchedulerConfig) { c.NumBlocks = 26 }},
		{name: "tiny-kv-zos-no-prefix-cache", zos: true, wantPreempt: true, mod: func(c *SchedulerConfig) {
			c.NumBlocks = 26
			c.EnablePrefixCaching = false
		}},
		{name: "big-blocks-small-chunks", mod: func(c *SchedulerConfig) {
			c.BlockSize = 16
			c.NumBlocks = 12
			c.ChunkSize = 5
			c.ChunkAlign = 0
		}},
		// State checkpoints (prefix caching for models with state slots):
		// the fake model then checks every slot's content.
		{name: "large-checkpoints", mod: func(c *SchedulerConfig) { c.NumStateCheckpoints = 6 }},
		{name: "large-no-chunk-checkpoints", mod: func(c *SchedulerConfig) {
			c.EnableChunkedPrefill = false
			c.MaxNumBatchedTokens = 96
			c.NumStateCheckpoints = 6
		}},
		{name: "tiny-kv-zos-checkpoints", zos: true, wantPreempt: true, mod: func(c *SchedulerConfig) {
			c.NumBlocks = 26
			c.NumStateCheckpoints = 2
		}},
		{name: "tiny-kv-checkpoints", wantPreempt: true, mod: func(c *SchedulerConfig) {
			c.NumBlocks = 26
			c.NumStateCheckpoints = 1
		}},
		{name: "large-admission-batch", mod: func(c *SchedulerConfig) { c.AdmissionBatch = 4 }},
		{name: "tiny-kv-zos-admission-batch", zos: true, wantPreempt: true, mod: func(c *SchedulerConfig) {
			c.NumBlocks = 26
			c.AdmissionBatch = 3
		}},
		{name: "few-seqs-small-budget", mod: func(c *SchedulerConfig) {
			c.MaxNumSeqs = 4
			c.MaxNumBatchedTokens = 6
			c.NumStateSlots = 5
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig()
			c.mod(&cfg)
			var preemptions, ckptHits int64
			for seed := range uint64(3) {
				rng := rand.New(rand.NewPCG(seed, 7))
				reqs := genWorkload(rng, 50, 48, 3, true)
				res := runWorkload(t, cfg, reqs, runOptions{zos: c.zos, reuse: c.reuse})
				checkAgainstReference(t, cfg, reqs, res)
				preemptions += res.numPreemptions
				ckptHits += res.checkpoints.NumHits
				if cfg.NumStateCheckpoints > 0 && cfg.EnableChunkedPrefill && res.prefix.NumHitTokens == 0 {
					t.Errorf("seed %d: no prefix-cache hit with state checkpoints", seed)
				}
				if c.zos && !res.sawPlaceholder {
					t.Errorf("seed %d: overlapped run planned no placeholder", seed)
				}
				if cfg.EnableChunkedPrefill && !res.sawChunks {
					t.Errorf("seed %d: no prompt was split with chunked prefill", seed)
				}
				if !res.sawCopies {
					t.Errorf("seed %d: no copy-on-write block copy with n > 1 requests", seed)
				}
			}
			if c.wantPreempt && preemptions == 0 {
				t.Errorf("no preemption with a tiny KV cache")
			}
			if cfg.NumStateCheckpoints > 0 && cfg.EnableChunkedPrefill && ckptHits == 0 {
				t.Errorf("no sequence started from a state checkpoint")
			}
			t.Logf("preemptions: %d, checkpoint hits: %d", preemptions, ckptHits)
		})
	}
}

// TestSchedulerAloneVsCrowded runs requests one per Scheduler and all
// together; both must match each other (and the reference).
func TestSchedulerAloneVsCrowded(t *testing.T) {
	cfg := baseConfig()
	cfg.NumBlocks = 40
	rng := rand.New(rand.NewPCG(11, 13))
	reqs := genWorkload(rng, 12, 40, 2, false)
	crowded := runWorkload(t, cfg, reqs, runOptions{})
	for _, r := range reqs {
		r.arriveStep = 0
		alone := runWorkload(t, cfg, []testRequest{r}, runOptions{})
		for idx, out := range alone.outputs[r.id] {
			if !slices.Equal(out, crowded.outputs[r.id][idx]) || alone.reasons[r.id][idx] != crowded.reasons[r.id][idx] {
				t.Fatalf("request %s[%d]: alone %v %v, crowded %v %v", r.id, idx, alone.reasons[r.id][idx], out,
					crowded.reasons[r.id][idx], crowded.outputs[r.id][idx])
			}
		}
	}
	checkAgainstReference(t, cfg, reqs, crowded)
}

// step runs one strict step with the fake model.
func step(t *testing.T, s *Scheduler, model *fakeModel) (*SchedulerOutputs, []SequenceMetadata, []FinishedSequence) {
	t.Helper()
	out, metas := s.Schedule()
	if out.StepID == 0 {
		return out, metas, out.Finished
	}
	sampled, err := model.run(out, metas)
	if err != nil {
		t.Fatal(err)
	}
	fin, err := s.ProcessOutputs(out.StepID, sampled)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	return out, metas, append(out.Finished, fin...)
}

func seqOf(ids ...int) []int { return ids }

func longParams(maxTokens int) SamplingParams {
	p := DefaultSamplingParams()
	p.MaxTokens = maxTokens
	p.IgnoreEOS = true
	return p
}

func TestPrefixCacheHit(t *testing.T) {
	cfg := baseConfig()
	cfg.EnableChunkedPrefill = false
	cfg.MaxNumBatchedTokens = 96
	prompt := seqOf(5, 6, 7, 8, 9, 10, 11, 12, 13, 14) // 10 tokens: 2 full blocks of 4
	cases := []struct {
		name       string
		second     []int
		finishA    bool // A finished (its blocks only cached) before B arrives
		wantCached int
	}{
		{"shared prefix, A running", append(slices.Clone(prompt[:8]), 40, 41, 42), false, 8},
		{"shared prefix, A finished", append(slices.Clone(prompt[:8]), 40, 41, 42), true, 8},
		{"same prompt", slices.Clone(prompt), false, 8},
		{"one full block", append(slices.Clone(prompt[:4]), 50), false, 4},
		{"whole prompt is full blocks: last one recomputed", slices.Clone(prompt[:8]), false, 4},
		{"different first token", append([]int{1}, prompt[1:]...), false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewScheduler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			model := newFakeModel(s.Config(), testVocab)
			maxA := 30
			if c.finishA {
				maxA = 2
			}
			idA, _ := s.Add(NewSequence("a", prompt, longParams(maxA), time.Time{}))
			for range 3 {
				step(t, s, model)
			}
			a := s.Sequence(idA)
			if c.finishA != (a == nil) {
				t.Fatalf("A finished = %v, want %v", a == nil, c.finishA)
			}
			var tableA []int
			if a != nil {
				tableA = slices.Clone(a.BlockTable())
			}
			idB, _ := s.Add(NewSequence("b", c.second, longParams(3), time.Time{}))
			_, metas, _ := step(t, s, model)
			var mb *SequenceMetadata
			for i := range metas {
				if metas[i].SeqID == idB {
					mb = &metas[i]
				}
			}
			if mb == nil {
				t.Fatal("B not scheduled")
			}
			b := s.Sequence(idB)
			if b.NumCachedTokens() != c.wantCached {
				t.Fatalf("B cached %d tokens, want %d", b.NumCachedTokens(), c.wantCached)
			}
			if mb.SeqlenQ != len(c.second)-c.wantCached || mb.PosStart != c.wantCached {
				t.Fatalf("B computed %d tokens from %d, want %d from %d", mb.SeqlenQ, mb.PosStart, len(c.second)-c.wantCached, c.wantCached)
			}
			nb := c.wantCached / cfg.BlockSize
			if tableA != nil && !slices.Equal(b.BlockTable()[:nb], tableA[:nb]) {
				t.Fatalf("B's blocks %v do not share A's %v", b.BlockTable(), tableA)
			}
			if tableA != nil && len(b.BlockTable()) > nb && slices.Contains(tableA, b.BlockTable()[nb]) {
				t.Fatalf("B's first computed block %d belongs to A %v", b.BlockTable()[nb], tableA)
			}
			st := s.Stats().PrefixCache
			if st.NumHitTokens != int64(c.wantCached) {
				t.Fatalf("prefix stats %+v, want %d hit tokens", st, c.wantCached)
			}
			for s.HasUnfinished() {
				step(t, s, model)
			}
		})
	}
}

func TestForkCopyOnWrite(t *testing.T) {
	cfg := baseConfig()
	cfg.EnablePrefixCaching = false
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	p := longParams(6)
	p.N = 3
	prompt := seqOf(3, 4, 5, 6, 7, 8) // 1 full block + 2 tokens in the second
	id, err := s.Add(NewSequence("fork", prompt, p, time.Time{}))
	if err != nil {
		t.Fatal(err)
	}
	out, metas, _ := step(t, s, model)
	if len(metas) != 1 || !metas[0].Sample || len(metas[0].ForkSeqIDs) != 2 || out.NumSampleRows != 3 {
		t.Fatalf("prefill: %d metas, forks %v, %d sample rows", len(metas), metas[0].ForkSeqIDs, out.NumSampleRows)
	}
	parent := s.Sequence(id)
	shared := slices.Clone(parent.BlockTable())
	for _, cid := range metas[0].ForkSeqIDs {
		c := s.Sequence(cid)
		if !slices.Equal(c.BlockTable(), shared) {
			t.Fatalf("child %d blocks %v, parent %v", cid, c.BlockTable(), shared)
		}
		if c.StateSlot() < 0 || c.StateSlot() == parent.StateSlot() {
			t.Fatalf("child %d state slot %d, parent %d", cid, c.StateSlot(), parent.StateSlot())
		}
	}
	if s.bm.refCount[shared[0]] != 3 || s.bm.refCount[shared[1]] != 3 {
		t.Fatalf("ref counts %d, %d, want 3, 3", s.bm.refCount[shared[0]], s.bm.refCount[shared[1]])
	}
	// First decode: each writes position 6, in the shared partial block.
	out, metas, _ = step(t, s, model)
	if len(metas) != 3 {
		t.Fatalf("decode: %d metas", len(metas))
	}
	if len(out.BlockCopies) != 2 {
		t.Fatalf("block copies %v, want 2 copies of block %d", out.BlockCopies, shared[1])
	}
	for _, c := range out.BlockCopies {
		if c.Src != shared[1] || c.Dst == shared[1] || slices.Contains(shared, c.Dst) {
			t.Fatalf("copy %+v, want from %d to a fresh block", c, shared[1])
		}
	}
	if len(out.StateCopies) != 2 {
		t.Fatalf("state copies %v, want 2", out.StateCopies)
	}
	lastBlocks := map[int]bool{}
	for _, m := range metas {
		if m.BlockTable[0] != shared[0] {
			t.Fatalf("seq %d lost the shared full block: %v", m.SeqID, m.BlockTable)
		}
		lastBlocks[m.BlockTable[1]] = true
	}
	if len(lastBlocks) != 3 {
		t.Fatalf("partial blocks after copy-on-write: %v, want 3 distinct", lastBlocks)
	}
	if s.bm.refCount[shared[0]] != 3 || s.bm.refCount[shared[1]] != 1 {
		t.Fatalf("ref counts %d, %d, want 3, 1", s.bm.refCount[shared[0]], s.bm.refCount[shared[1]])
	}
	outs := map[int][]int{}
	for s.HasUnfinished() {
		_, _, fin := step(t, s, model)
		for _, f := range fin {
			outs[f.Index] = f.OutputTokenIDs
		}
	}
	r := testRequest{id: "fork", prompt: prompt, params: p}
	for idx := range 3 {
		want, _ := reference(r, idx, s.Config(), testVocab)
		if !slices.Equal(outs[idx], want) {
			t.Fatalf("fork %d: %v, want %v", idx, outs[idx], want)
		}
	}
	if s.bm.NumFreeBlocks() != cfg.NumBlocks {
		t.Fatalf("%d blocks free of %d", s.bm.NumFreeBlocks(), cfg.NumBlocks)
	}
}

func TestSchedulerNeverFits(t *testing.T) {
	cfg := baseConfig()
	cfg.NumBlocks = 5 // 20 tokens of cache, max_model_len 96
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	long := make([]int, 30)
	for i := range long {
		long[i] = 1 + i
	}
	idLong, _ := s.Add(NewSequence("long", long, longParams(4), time.Time{}))
	idGrow, _ := s.Add(NewSequence("grow", seqOf(1, 2, 3), longParams(50), time.Time{}))
	var fin []FinishedSequence
	for i := 0; s.HasUnfinished(); i++ {
		if i > 200 {
			t.Fatal("looping")
		}
		_, _, f := step(t, s, model)
		fin = append(fin, f...)
	}
	got := map[SeqID]FinishedSequence{}
	for _, f := range fin {
		got[f.SeqID] = f
	}
	if f := got[idLong]; f.Reason != FinishError || f.Err == nil {
		t.Fatalf("long prompt finished %v (%v), want error", f.Reason, f.Err)
	}
	if f := got[idGrow]; f.Reason != FinishLength || len(f.OutputTokenIDs) != 20+1-3 {
		t.Fatalf("growing sequence finished %v with %d tokens, want length with %d", f.Reason, len(f.OutputTokenIDs), 20+1-3)
	}
}

func TestSchedulerAbortEverywhere(t *testing.T) {
	cfg := baseConfig()
	cfg.ChunkSize = 4
	cfg.MaxNumBatchedTokens = 16
	for _, when := range []string{"waiting", "grammar", "prompted", "running", "preempted", "in flight"} {
		t.Run(when, func(t *testing.T) {
			c := cfg
			if when == "preempted" {
				c.NumBlocks = 6
			}
			s, err := NewScheduler(c)
			if err != nil {
				t.Fatal(err)
			}
			model := newFakeModel(s.Config(), testVocab)
			prompt := make([]int, 12)
			for i := range prompt {
				prompt[i] = 1 + i
			}
			if when == "preempted" {
				// An older request that grows makes "x" the youngest victim.
				if _, err := s.Add(NewSequence("old", prompt, longParams(20), time.Time{})); err != nil {
					t.Fatal(err)
				}
			}
			add := s.Add
			if when == "grammar" {
				add = s.AddWaitingForGrammar
			}
			id, err := add(NewSequence("x", prompt, longParams(20), time.Time{}))
			if err != nil {
				t.Fatal(err)
			}
			seq := s.Sequence(id)
			var inflight *SchedulerOutputs
			var inflightSampled []SampledTokens
			switch when {
			case "prompted":
				step(t, s, model)
			case "running":
				for range 4 {
					step(t, s, model)
				}
			case "preempted":
				for i := 0; seq.Status() != StatusPreempted; i++ {
					if i > 50 {
						t.Fatal("never preempted")
					}
					step(t, s, model)
				}
			case "in flight":
				for range 4 {
					step(t, s, model)
				}
				out, metas := s.Schedule()
				sampled, err := model.run(out, metas)
				if err != nil {
					t.Fatal(err)
				}
				inflight, inflightSampled = out, sampled
			}
			want := map[string]SequenceStatus{"waiting": StatusWaiting, "grammar": StatusWaitingForGrammar, "prompted": StatusPrompted,
				"running": StatusRunning, "preempted": StatusPreempted, "in flight": StatusRunning}[when]
			if seq.Status() != want {
				t.Fatalf("status %v, want %v", seq.Status(), want)
			}
			got := s.Abort("x")
			if len(got) != 1 || got[0].Reason != FinishAbort || seq.Status() != StatusFinished {
				t.Fatalf("abort returned %+v, status %v", got, seq.Status())
			}
			if again := s.Abort("x"); again != nil {
				t.Fatalf("second abort returned %+v", again)
			}
			if inflight != nil {
				fin, err := s.ProcessOutputs(inflight.StepID, inflightSampled)
				if err != nil || len(fin) != 0 || seq.NumOutputTokens() != len(got[0].OutputTokenIDs) {
					t.Fatalf("outputs after abort: %v, %v, %d tokens", fin, err, seq.NumOutputTokens())
				}
			}
			if err := s.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			out, _, _ := step(t, s, model)
			if !slices.Contains(out.AbortedSeqIDs, seq.ID()) {
				t.Fatalf("aborted ids %v lack %d", out.AbortedSeqIDs, seq.ID())
			}
			for s.HasUnfinished() {
				step(t, s, model)
			}
			if s.bm.NumUsedBlocks() != 0 || s.sm.NumUsed() != 0 {
				t.Fatalf("after abort: %d blocks, %d state slots used", s.bm.NumUsedBlocks(), s.sm.NumUsed())
			}
		})
	}
}

func TestSchedulerGrammar(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	okID, _ := s.AddWaitingForGrammar(NewSequence("ok", seqOf(1, 2, 3), longParams(2), time.Time{}))
	badID, _ := s.AddWaitingForGrammar(NewSequence("bad", seqOf(1, 2, 3), longParams(2), time.Time{}))
	if out, _ := s.Schedule(); out.StepID != 0 {
		t.Fatal("scheduled a sequence waiting for its grammar")
	}
	if err := s.GrammarReady(badID, nil, errors.New("unbalanced brace")); err != nil {
		t.Fatal(err)
	}
	if err := s.GrammarReady(okID, fakeGrammar{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.GrammarReady(okID, fakeGrammar{}, nil); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("second ready: %v", err)
	}
	out, metas, _ := step(t, s, model)
	if len(metas) != 1 || metas[0].SeqID != okID || !slices.Contains(out.FinishedSeqIDs, badID) {
		t.Fatalf("metas %+v, finished %v", metas, out.FinishedSeqIDs)
	}
	if metas[0].Grammar == nil || metas[0].Grammar != s.seqs[okID].Matcher() {
		t.Fatalf("metadata grammar %v, sequence's %v", metas[0].Grammar, s.seqs[okID].Matcher())
	}
}

// fakeGrammar hands out a fresh fakeMatcher each time.
type fakeGrammar struct{}

func (fakeGrammar) NewMatcher() GrammarMatcher { return &fakeMatcher{} }

type fakeMatcher struct{ committed []int }

func (m *fakeMatcher) ComputeMask(mask []uint32) {
	for i := range mask {
		mask[i] = ^uint32(0)
	}
}
func (m *fakeMatcher) Commit(t int) error { m.committed = append(m.committed, t); return nil }
func (m *fakeMatcher) Rollback(n int) error {
	m.committed = m.committed[:len(m.committed)-n]
	return nil
}
func (m *fakeMatcher) IsAccepting() bool  { return true }
func (m *fakeMatcher) IsTerminated() bool { return false }

// The forks of a request under a grammar (n > 1) each get their own
// matcher, named in the fork step's metadata.
func TestSchedulerGrammarForks(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	p := longParams(2)
	p.N = 3
	id, err := s.AddWaitingForGrammar(NewSequence("n3", seqOf(1, 2, 3), p, time.Time{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.GrammarReady(id, fakeGrammar{}, nil); err != nil {
		t.Fatal(err)
	}
	_, metas, _ := step(t, s, model)
	if len(metas) != 1 || len(metas[0].ForkSeqIDs) != 2 || len(metas[0].ForkGrammars) != 2 {
		t.Fatalf("metas %+v", metas)
	}
	m := metas[0]
	seen := map[GrammarMatcher]bool{m.Grammar: true}
	for j, g := range m.ForkGrammars {
		if g == nil || seen[g] || g != s.seqs[m.ForkSeqIDs[j]].Matcher() {
			t.Fatalf("fork %d: matcher %p (parent's %p), sequence's %p", j, g, m.Grammar, s.seqs[m.ForkSeqIDs[j]].Matcher())
		}
		seen[g] = true
	}
}

func TestSchedulerFinishSequence(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	id, _ := s.Add(NewSequence("x", seqOf(1, 2, 3), longParams(30), time.Time{}))
	step(t, s, model)
	step(t, s, model)
	f, err := s.FinishSequence(id, FinishStop)
	if err != nil || f.Reason != FinishStop || len(f.OutputTokenIDs) != 2 {
		t.Fatalf("finish: %+v, %v", f, err)
	}
	if _, err := s.FinishSequence(id, FinishStop); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("finish twice: %v", err)
	}
	if s.HasUnfinished() || s.bm.NumUsedBlocks() != 0 {
		t.Fatal("resources kept after FinishSequence")
	}
}

func TestProcessOutputsMismatch(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	id, _ := s.Add(NewSequence("x", seqOf(1, 2, 3), longParams(5), time.Time{}))
	out, _ := s.Schedule()
	cases := []struct {
		name    string
		step    StepID
		sampled []SampledTokens
		want    error
	}{
		{"unknown step", out.StepID + 1, []SampledTokens{{SeqID: id, TokenIDs: []int{1}}}, ErrUnknownStep},
		{"missing row", out.StepID, nil, ErrStepMismatch},
		{"wrong seq", out.StepID, []SampledTokens{{SeqID: id + 1, TokenIDs: []int{1}}}, ErrStepMismatch},
		{"no tokens", out.StepID, []SampledTokens{{SeqID: id, TokenIDs: nil}}, ErrStepMismatch},
	}
	for _, c := range cases {
		if _, err := s.ProcessOutputs(c.step, c.sampled); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := s.ProcessOutputs(out.StepID, []SampledTokens{{SeqID: id, TokenIDs: []int{7}}}); err != nil {
		t.Fatalf("after rejected calls: %v", err)
	}
	if got := s.Sequence(id).OutputTokenIDs(); !slices.Equal(got, []int{7}) {
		t.Fatalf("outputs %v", got)
	}
}

func TestSchedulerAddValidation(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(NewSequence("dup", seqOf(1), DefaultSamplingParams(), time.Time{})); err != nil {
		t.Fatal(err)
	}
	badParams := DefaultSamplingParams()
	badParams.TopP = 0
	bigN := DefaultSamplingParams()
	bigN.N = 17
	long := make([]int, 97)
	cases := []struct {
		name string
		seq  *Sequence
	}{
		{"nil", nil},
		{"empty prompt", NewSequence("a", nil, DefaultSamplingParams(), time.Time{})},
		{"too long", NewSequence("b", long, DefaultSamplingParams(), time.Time{})},
		{"token outside vocab", NewSequence("c", seqOf(1, testVocab), DefaultSamplingParams(), time.Time{})},
		{"negative token", NewSequence("d", seqOf(-1), DefaultSamplingParams(), time.Time{})},
		{"bad params", NewSequence("e", seqOf(1), badParams, time.Time{})},
		{"n above max_num_seqs", NewSequence("f", seqOf(1), bigN, time.Time{})},
		{"duplicate request id", NewSequence("dup", seqOf(1), DefaultSamplingParams(), time.Time{})},
	}
	for _, c := range cases {
		if _, err := s.Add(c.seq); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", c.name, err)
		}
	}
}

func TestSchedulerConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*SchedulerConfig)
	}{
		{"max_num_seqs", func(c *SchedulerConfig) { c.MaxNumSeqs = 0 }},
		{"max_num_batched_tokens", func(c *SchedulerConfig) { c.MaxNumBatchedTokens = 8 }},
		{"max_model_len", func(c *SchedulerConfig) { c.MaxModelLen = 0 }},
		{"max_model_len", func(c *SchedulerConfig) { c.EnableChunkedPrefill = false }},
		{"chunk_size", func(c *SchedulerConfig) { c.ChunkSize = -1 }},
		{"chunk_align", func(c *SchedulerConfig) { c.ChunkAlign = -1 }},
		{"block_size", func(c *SchedulerConfig) { c.BlockSize = 0 }},
		{"num_blocks", func(c *SchedulerConfig) { c.NumBlocks = 0 }},
		{"num_state_slots", func(c *SchedulerConfig) { c.NumStateSlots = -2 }},
		{"eos", func(c *SchedulerConfig) { c.EOSTokenIDs = []int{testVocab} }},
	}
	good := baseConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		cfg := baseConfig()
		c.mod(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, err := NewScheduler(cfg); err == nil {
			t.Errorf("%s: NewScheduler accepted it", c.name)
		}
	}
}

// TestAdmissionBatch: with AdmissionBatch 2, a prompt waits while fewer
// than two of the waiting ones fit beside decoding sequences, then both
// join one step; with 1 each joins as soon as its slot frees; and a hold
// ends after 4*AdmissionBatch steps when the slots free slowly.
func TestAdmissionBatch(t *testing.T) {
	cases := []struct {
		name      string
		batch     int
		maxTokens []int // of the four first requests; two more wait
		want      [2]int
	}{
		// Request 0 finishes at step 2 (its first token at the prefill
		// step 1), request 1 at step 4: their slots are free at 3 and 5.
		{"one at a time", 1, []int{2, 4, 40, 40}, [2]int{3, 5}},
		{"two at a time", 2, []int{2, 4, 40, 40}, [2]int{5, 5}},
		// Request 0's slot is free from step 3; steps 3 to 10 hold (8 in a
		// row), step 11 admits the one that fits.
		{"hold bounded", 2, []int{2, 40, 40, 40}, [2]int{11, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.MaxNumSeqs, cfg.AdmissionBatch = 4, c.batch
			s, err := NewScheduler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			model := newFakeModel(s.Config(), testVocab)
			var ids []SeqID
			for i := range 6 {
				n := 60
				if i < 4 {
					n = c.maxTokens[i]
				}
				id, err := s.Add(NewSequence(fmt.Sprint(i), seqOf(1+i, 2, 3), longParams(n), time.Time{}))
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			first := map[SeqID]int{}
			for i := 1; i <= 12; i++ {
				out, metas, _ := step(t, s, model)
				for _, m := range metas {
					if _, ok := first[m.SeqID]; !ok {
						first[m.SeqID] = i
					}
				}
				if i > 1 && out.NumPrefillSeqs > 0 && out.NumDecodeSeqs == 0 {
					t.Errorf("step %d: prompts alone while sequences decode", i)
				}
			}
			if got := [2]int{first[ids[4]], first[ids[5]]}; got != c.want {
				t.Errorf("requests 4 and 5 first ran at steps %v, want %v", got, c.want)
			}
		})
	}
}

// TestNoStarvation: with a steady stream of short requests, a long one that
// arrived early still runs, and requests are admitted in arrival order.
func TestNoStarvation(t *testing.T) {
	cfg := baseConfig()
	cfg.NumBlocks = 30
	cfg.MaxNumSeqs = 4
	cfg.EnablePrefixCaching = false
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	firstRun := map[SeqID]int{}
	var order []SeqID
	long := make([]int, 60)
	for i := range long {
		long[i] = 1 + i%50
	}
	for i := range 200 {
		if i < 100 {
			prompt := long
			if i != 1 {
				prompt = seqOf(1+i%50, 2, 3)
			}
			id, err := s.Add(NewSequence(fmt.Sprint(i), prompt, longParams(8), time.Time{}))
			if err != nil {
				t.Fatal(err)
			}
			order = append(order, id)
		}
		_, metas, _ := step(t, s, model)
		for _, m := range metas {
			if _, ok := firstRun[m.SeqID]; !ok {
				firstRun[m.SeqID] = i
			}
		}
		if !s.HasUnfinished() {
			break
		}
	}
	for s.HasUnfinished() {
		step(t, s, model)
	}
	for i := 1; i < len(order); i++ {
		if firstRun[order[i]] < firstRun[order[i-1]] {
			t.Fatalf("request %d started at step %d before request %d at %d", i, firstRun[order[i]], i-1, firstRun[order[i-1]])
		}
	}
}

func TestPromptLogprobsRows(t *testing.T) {
	cfg := baseConfig()
	cfg.ChunkSize = 4
	cfg.ChunkAlign = 0
	cfg.NumBlocks = 8 // 32 tokens: the second request preempts the first
	s, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := newFakeModel(s.Config(), testVocab)
	prompt := make([]int, 10)
	for i := range prompt {
		prompt[i] = 1 + i
	}
	// A cached copy of the prompt must not serve a prompt-logprobs request.
	if _, err := s.Add(NewSequence("warm", prompt, longParams(1), zeroTime)); err != nil {
		t.Fatal(err)
	}
	for s.HasUnfinished() {
		step(t, s, model)
	}
	// An older request that keeps growing will preempt it.
	if _, err := s.Add(NewSequence("old", prompt[:2], longParams(24), zeroTime)); err != nil {
		t.Fatal(err)
	}
	step(t, s, model)
	p := longParams(20)
	k := 1
	p.PromptLogprobs = &k
	id, _ := s.Add(NewSequence("lp", prompt, p, zeroTime))
	var ranges [][2]int
	for i := 0; i < 3; i++ {
		_, metas, _ := step(t, s, model)
		for _, m := range metas {
			if m.SeqID == id {
				ranges = append(ranges, [2]int{m.PromptLogprobsFrom, m.PromptLogprobsTo})
			}
		}
	}
	if want := [][2]int{{0, 4}, {4, 8}, {8, 9}}; !slices.Equal(ranges, want) {
		t.Fatalf("prompt logprob rows %v, want %v", ranges, want)
	}
	if s.Sequence(id).NumCachedTokens() != 0 {
		t.Fatal("prompt-logprobs request served from the prefix cache")
	}
	// After preemption, the recompute asks for no rows again.
	preempted := false
	for s.HasUnfinished() {
		out, metas, _ := step(t, s, model)
		preempted = preempted || slices.Contains(out.PreemptedSeqIDs, id)
		for _, m := range metas {
			if m.SeqID == id && m.PromptLogprobsFrom >= 0 {
				t.Fatalf("rows [%d, %d) asked again at %+v", m.PromptLogprobsFrom, m.PromptLogprobsTo, m)
			}
		}
	}
	if !preempted {
		t.Fatal("the prompt-logprobs request was never preempted")
	}
}

// TestOverlapPlaceholder: a step planned before the previous step's
// tokens are known decodes with a placeholder from the previous step's
// sample row, and a sequence found finished late has its row discarded.
func TestOverlapPlaceholder(t *testing.T) {
	s, err := NewScheduler(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := longParams(2)
	a, _ := s.Add(NewSequence("a", seqOf(1, 2, 3), p, zeroTime))
	pb := DefaultSamplingParams()
	pb.MaxTokens = 10
	b, _ := s.Add(NewSequence("b", seqOf(4, 5), pb, zeroTime))
	out1, metas1 := s.Schedule()
	if len(metas1) != 2 || metas1[1].SampleRow != 1 {
		t.Fatalf("step 1: %+v", metas1)
	}
	out2, metas2 := s.Schedule() // step 1 still in flight
	if len(metas2) != 2 {
		t.Fatalf("step 2: %d metas", len(metas2))
	}
	for i, m := range metas2 {
		if m.Prefill || m.InputTokenIDs[0] != PlaceholderToken || m.InputFromRow != i || m.PosStart != len(m.TokenIDs) {
			t.Fatalf("step 2 seq %d: %+v", m.SeqID, m)
		}
	}
	// a reaches max_tokens with step 2's token: step 3 must not schedule it.
	out3, metas3 := s.Schedule()
	if out3.StepID != 0 || len(metas3) != 0 {
		t.Fatalf("step 3 planned with two steps in flight and no known token: %+v", metas3)
	}
	if _, err := s.ProcessOutputs(out1.StepID, []SampledTokens{{SeqID: a, TokenIDs: []int{7}}, {SeqID: b, TokenIDs: []int{8}}}); err != nil {
		t.Fatal(err)
	}
	out3, metas3 = s.Schedule()
	if len(metas3) != 1 || metas3[0].SeqID != b || metas3[0].InputFromRow != 1 {
		t.Fatalf("step 3: %+v", metas3)
	}
	fin, err := s.ProcessOutputs(out2.StepID, []SampledTokens{{SeqID: a, TokenIDs: []int{9}}, {SeqID: b, TokenIDs: []int{0}}}) // b samples EOS
	if err != nil || len(fin) != 2 {
		t.Fatalf("finished %+v, %v", fin, err)
	}
	fin, err = s.ProcessOutputs(out3.StepID, []SampledTokens{{SeqID: b, TokenIDs: []int{11}}})
	if err != nil || len(fin) != 0 {
		t.Fatalf("late row: %+v, %v", fin, err)
	}
	if s.HasUnfinished() || s.bm.NumUsedBlocks() != 0 || s.NumInflightSteps() != 0 {
		t.Fatal("resources left")
	}
}

// Sequences that run into max_model_len, with and without ZOS: runWorkload's
// checkStep holds every block table within max_model_len's blocks (the
// width of the captured decode graphs' tables) up to the last step, and
// each finishes by length at max_model_len tokens.
func TestSchedulerTablesWithinMaxModelLen(t *testing.T) {
	for _, zos := range []bool{false, true} {
		cfg := baseConfig()
		cfg.MaxModelLen = 30 // 8 blocks of 4, the last one partly used
		var reqs []testRequest
		for i := range 6 {
			prompt := make([]int, 5+3*i)
			for j := range prompt {
				prompt[j] = 1 + (7*i+j)%(testVocab-1)
			}
			reqs = append(reqs, testRequest{id: fmt.Sprint("r", i), prompt: prompt, params: longParams(1000), abortStep: -1})
		}
		res := runWorkload(t, cfg, reqs, runOptions{zos: zos})
		for _, r := range reqs {
			if got := res.reasons[r.id][0]; got != FinishLength || len(r.prompt)+len(res.outputs[r.id][0]) != cfg.MaxModelLen {
				t.Errorf("zos %v: %s finished %v with %d + %d tokens, want length at %d", zos, r.id, got,
					len(r.prompt), len(res.outputs[r.id][0]), cfg.MaxModelLen)
			}
		}
	}
}
