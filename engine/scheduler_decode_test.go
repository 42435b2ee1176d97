package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// fieldEnd returns the end offset of a struct field, by name.
func fieldEnd(t *testing.T, typ reflect.Type, name string) uintptr {
	t.Helper()
	f, ok := typ.FieldByName(name)
	if !ok {
		t.Fatalf("%s has no field %s", typ.Name(), name)
	}
	return f.Offset + f.Type.Size()
}

// TestSequenceLayout pins the layout the decode step relies on (see
// Sequence and SequenceMetadata, Layout): what a decode's ProcessOutputs
// touches in a Sequence lies in its first 64 bytes, what its Schedule
// touches in the first 192, and the fields a recycled plain decode
// rewrites in the first 128 bytes of its SequenceMetadata.
func TestSequenceLayout(t *testing.T) {
	seqType := reflect.TypeFor[Sequence]()
	metaType := reflect.TypeFor[SequenceMetadata]()
	cases := []struct {
		typ    reflect.Type
		within uintptr
		fields []string
	}{
		{seqType, 64, []string{"tokens", "lastToken", "quietLen", "epoch", "numPending", "numHashedBlocks",
			"numPendingDrafts", "status", "mayShare", "ignoreEOS", "maxTokens"}},
		{seqType, 192, []string{"numComputed", "numPromptTokens", "blockTable", "lastBlock", "pendingRow",
			"pendingStep", "scheduledStep", "id", "metaGen"}},
		{metaType, 128, []string{"SeqID", "SeqlenK", "PosStart", "InputTokenIDs", "InputFromRow", "SampleRow",
			"SlotMapping", "TokenIDs", "src", "gen", "Sample"}},
	}
	for _, c := range cases {
		for _, name := range c.fields {
			if end := fieldEnd(t, c.typ, name); end > c.within {
				t.Errorf("%s.%s ends at byte %d, past %d", c.typ.Name(), name, end, c.within)
			}
		}
	}
}

// equalMetadata reports the first exported field in which a and b differ
// ("" when none): slices by content, pointers by what they point to.
func equalMetadata(a, b *SequenceMetadata) string {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		f := va.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return fmt.Sprintf("%s: %v, want %v", f.Name, va.Field(i).Interface(), vb.Field(i).Interface())
		}
	}
	return ""
}

// TestRecycledMetadata runs the same workload through two Schedulers in
// lockstep, one planning with Schedule, the other with ScheduleInto over
// the metadata of two steps back, and requires the same metadata at every
// step, with the recycled slices viewing the step's own arrays and the
// recycled matchers being the sequence's own: partial rewrites of
// recycled plain decodes must miss no change (block appended, copied on
// write or freed, state slot, matcher).
func TestRecycledMetadata(t *testing.T) {
	cases := []struct {
		name string
		zos  bool
		mod  func(*SchedulerConfig)
	}{
		{"large", false, func(*SchedulerConfig) {}},
		{"large-zos", true, func(*SchedulerConfig) {}},
		{"tiny-kv", false, func(c *SchedulerConfig) { c.NumBlocks = 26 }},
		{"tiny-kv-zos", true, func(c *SchedulerConfig) { c.NumBlocks = 26 }},
		{"tiny-kv-checkpoints", false, func(c *SchedulerConfig) { c.NumBlocks = 26; c.NumStateCheckpoints = 2 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig()
			c.mod(&cfg)
			for seed := range uint64(3) {
				rng := rand.New(rand.NewPCG(seed, 11))
				reqs := genWorkload(rng, 50, 48, 3, true)
				grammar := map[string]bool{}
				for _, r := range reqs {
					grammar[r.id] = rng.IntN(4) == 0
				}
				lockstep(t, cfg, reqs, grammar, c.zos)
			}
		})
	}
}

func lockstep(t *testing.T, cfg SchedulerConfig, reqs []testRequest, grammar map[string]bool, zos bool) {
	t.Helper()
	fresh, err := NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	recycled, _ := NewScheduler(cfg)
	model := newFakeModel(fresh.Config(), testVocab)
	var bufs [2][]SequenceMetadata
	type flying struct {
		id      StepID
		sampled []SampledTokens
	}
	var prev *flying
	partial := 0
	// The token array of the last two steps, by parity: a recycled buf
	// brings back its step's array, never the other step's.
	var arrays [2]*int
	reusedInts := 0
	for step := 0; step < 20000; step++ {
		for _, r := range reqs {
			if r.arriveStep == step {
				for _, s := range []*Scheduler{fresh, recycled} {
					seq := NewSequence(r.id, r.prompt, r.params, time.Time{})
					if !grammar[r.id] {
						if _, err := s.Add(seq); err != nil {
							t.Fatal(err)
						}
						continue
					}
					id, err := s.AddWaitingForGrammar(seq)
					if err == nil {
						err = s.GrammarReady(id, fakeGrammar{}, nil)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			if r.abortStep == step {
				fresh.Abort(r.id)
				recycled.Abort(r.id)
			}
		}
		out, metas := fresh.Schedule()
		rout, rmetas := recycled.ScheduleInto(bufs[step%2])
		if rmetas != nil {
			bufs[step%2] = rmetas
		}
		if out.StepID != rout.StepID || len(metas) != len(rmetas) || !slices.Equal(out.InputTokenIDs, rout.InputTokenIDs) ||
			!slices.Equal(out.SlotMapping, rout.SlotMapping) {
			t.Fatalf("step %d: %d sequences, %v %v; recycled: %d, %v %v", out.StepID, len(metas), out.InputTokenIDs,
				out.SlotMapping, len(rmetas), rout.InputTokenIDs, rout.SlotMapping)
		}
		if cap(rout.InputTokenIDs) > 0 {
			a := &rout.InputTokenIDs[:1][0]
			if a == arrays[(step+1)%2] {
				t.Fatalf("step %d: the token array of the step before, which is still read, was recycled", out.StepID)
			}
			if a == arrays[step%2] {
				reusedInts++
			}
			arrays[step%2] = a
		}
		off := 0
		for i := range metas {
			m, r := &metas[i], &rmetas[i]
			if d := equalMetadata(r, m); d != "" {
				t.Fatalf("step %d, seq %d: recycled metadata %s", out.StepID, m.SeqID, d)
			}
			if &r.InputTokenIDs[0] != &rout.InputTokenIDs[off] || &r.SlotMapping[0] != &rout.SlotMapping[off] {
				t.Fatalf("step %d, seq %d: recycled inputs or slots are not views of the step's arrays", out.StepID, m.SeqID)
			}
			if seq := recycled.seqs[r.SeqID]; seq != nil && r.Grammar != seq.matcher {
				t.Fatalf("step %d, seq %d: recycled matcher %p, the sequence's %p", out.StepID, m.SeqID, r.Grammar, seq.matcher)
			}
			if r.src != nil && r.src.metaGen == r.gen {
				partial++
			}
			off += m.SeqlenQ
		}
		var cur *flying
		if out.StepID != 0 {
			sampled, err := model.run(out, metas)
			if err != nil {
				t.Fatal(err)
			}
			cur = &flying{out.StepID, sampled}
		}
		process := func(f *flying) {
			if f == nil {
				return
			}
			for _, s := range []*Scheduler{fresh, recycled} {
				if _, err := s.ProcessOutputs(f.id, f.sampled); err != nil {
					t.Fatal(err)
				}
			}
		}
		if zos {
			process(prev)
			prev = cur
		} else {
			process(cur)
		}
		if !fresh.HasUnfinished() && !recycled.HasUnfinished() && prev == nil && step > 60 {
			if partial == 0 {
				t.Fatal("no recycled element was rewritten in part")
			}
			if reusedInts == 0 {
				t.Fatal("no step's token and slot array was recycled with its metadata")
			}
			return
		}
	}
	t.Fatal("workload not done")
}

// TestPlainDecodeMatchesAddRows checks planPlainDecodes, the decode fast
// path, against the general addRows for every plain decode of a run:
// same metadata, same step record entry, same sequence state after.
func TestPlainDecodeMatchesAddRows(t *testing.T) {
	for _, zos := range []bool{false, true} {
		cfg := baseConfig()
		s, err := NewScheduler(cfg)
		if err != nil {
			t.Fatal(err)
		}
		model := newFakeModel(s.Config(), testVocab)
		for i := range 12 {
			p := longParams(30 + i)
			if _, err := s.Add(NewSequence(fmt.Sprint(i), seqOf(1+i, 2, 3, 4, 5, 6+i%3), p, time.Time{})); err != nil {
				t.Fatal(err)
			}
		}
		live := func(id SeqID) *Sequence { return s.seqs[id] }
		var bufs [2][]SequenceMetadata
		var pending *SchedulerOutputs
		var pendingSampled []SampledTokens
		checked, opened := 0, 0
		for step := 0; s.HasUnfinished() || pending != nil; step++ {
			before := map[SeqID]Sequence{}
			for _, seq := range s.running {
				before[seq.id] = *seq
			}
			var free []int // the free list, head first
			for b := s.bm.head; b >= 0; b = s.bm.next[b] {
				free = append(free, int(b))
			}
			out, metas := s.ScheduleInto(bufs[step%2])
			bufs[step%2] = metas
			taken := 0 // blocks the step's decodes opened so far
			for k := range metas {
				m := &metas[k]
				c, ok := before[m.SeqID]
				if !ok || m.Prefill || c.mayShare || c.numComputed > len(c.blockTable)*cfg.BlockSize {
					continue // not a plain decode
				}
				if c.numComputed == len(c.blockTable)*cfg.BlockSize {
					// It opened a block: the free list's next, as
					// AppendSlots takes it, appended to its table.
					table := live(m.SeqID).blockTable
					if len(table) != len(c.blockTable)+1 || !slices.Equal(table[:len(c.blockTable)], c.blockTable) ||
						taken >= len(free) || table[len(table)-1] != free[taken] || s.bm.refCount[free[taken]] != 1 {
						t.Fatalf("step %d, seq %d: opened a block: table %v -> %v, free list %v (%d taken)", out.StepID, m.SeqID, c.blockTable, table, free, taken)
					}
					taken++
					opened++
					c.setBlockTable(table[:len(table):len(table)])
				}
				b := &stepBuilder{id: out.StepID, out: &SchedulerOutputs{}, rec: &stepRecord{}, row: m.SampleRow, budget: 1 << 20,
					tokens: make([]int, 0, 4), slots: make([]int, 0, 4)}
				s.addRows(b, &c, 1, 0, false, true, nil, -1, -1)
				if d := equalMetadata(m, &b.metas[0]); d != "" {
					t.Fatalf("step %d, seq %d: fast path %s", out.StepID, m.SeqID, d)
				}
				rec := s.inflight[len(s.inflight)-1]
				i := slices.IndexFunc(rec.entries, func(e stepEntry) bool { return e.id == m.SeqID })
				got, want := rec.entries[i], b.rec.entries[0]
				if got.seq != live(m.SeqID) || want.seq != &c {
					t.Fatalf("step %d, seq %d: entries of another sequence", out.StepID, m.SeqID)
				}
				if want.seq = got.seq; got != want {
					t.Fatalf("step %d, seq %d: fast path entry %+v, want %+v", out.StepID, m.SeqID, got, want)
				}
				seq := live(m.SeqID)
				if seq.numComputed != c.numComputed || seq.numPending != c.numPending || seq.pendingStep != c.pendingStep ||
					seq.pendingRow != c.pendingRow || seq.scheduledStep != c.scheduledStep || seq.numPendingDrafts != c.numPendingDrafts {
					t.Fatalf("step %d, seq %d: fast path left %+v, want %+v", out.StepID, m.SeqID, *seq, c)
				}
				checked++
			}
			var sampled []SampledTokens
			if out.StepID != 0 {
				if sampled, err = model.run(out, metas); err != nil {
					t.Fatal(err)
				}
			}
			if zos && pending != nil {
				if _, err := s.ProcessOutputs(pending.StepID, pendingSampled); err != nil {
					t.Fatal(err)
				}
			}
			pending, pendingSampled = nil, nil
			if out.StepID != 0 {
				if zos {
					pending, pendingSampled = out, sampled
				} else if _, err := s.ProcessOutputs(out.StepID, sampled); err != nil {
					t.Fatal(err)
				}
			}
			if step > 1000 {
				t.Fatal("not done")
			}
		}
		if checked < 100 || opened < 10 {
			t.Fatalf("zos %v: %d plain decodes checked, %d of them opening a block", zos, checked, opened)
		}
	}
}

// TestTokenEnds checks the per-token finish check the Scheduler runs
// (tokenEnds, with its inlined quiet stretch) against CheckFinish, the
// rule post-processing applies, token by token.
func TestTokenEnds(t *testing.T) {
	const eos, stop, other = 0, 9, 5
	cases := []struct {
		name      string
		min, max  int
		ignoreEOS bool
		stopIDs   []int
		modelLen  int
	}{
		{"plain", 0, 6, false, nil, 64},
		{"min tokens", 3, 6, false, nil, 64},
		{"min tokens and stop ids", 3, 6, true, []int{stop}, 64},
		{"ignore eos", 0, 6, true, nil, 64},
		{"ignore eos, min tokens", 4, 6, true, nil, 64},
		{"context before max tokens", 0, 50, true, nil, 8},
		{"min above max", 9, 4, false, []int{stop}, 64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.MaxModelLen = c.modelLen
			cfg.EOSTokenIDs = []int{eos}
			s, err := NewScheduler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := DefaultSamplingParams()
			p.MinTokens, p.MaxTokens, p.IgnoreEOS, p.StopTokenIDs = c.min, c.max, c.ignoreEOS, c.stopIDs
			rule := RuleFor(&p, cfg.EOSTokenIDs, cfg.MaxModelLen)
			for _, tok := range []int{eos, stop, other} {
				seq := NewSequence("r", []int{1, 2, 3}, p, time.Time{})
				seq.quietLen = s.quietLen(seq)
				for len(seq.tokens) < c.modelLen {
					seq.tokens = append(seq.tokens, tok)
					got := s.tokenEnds(seq, tok)
					if want := CheckFinish(rule, seq.NumOutputTokens(), len(seq.tokens), tok); got != want {
						t.Fatalf("token %d, %d outputs: %v, want %v", tok, seq.NumOutputTokens(), got, want)
					}
				}
			}
		})
	}
}

// TestCommitLaterMatchesCommit runs the same commits one by one (commit)
// and queued (commitLater, then flushCommits), past the queue's bound,
// with forks sharing blocks and blocks whose content another block caches
// already: the prefix cache and the sequences end up the same.
func TestCommitLaterMatchesCommit(t *testing.T) {
	const bs = 4
	build := func() (*BlockManager, []*Sequence) {
		m, err := NewBlockManager(1024, bs, true)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []*Sequence
		for i := range maxQueuedCommits + 10 {
			// Every third sequence repeats its predecessor's tokens.
			base := i - i%3/2
			tokens := make([]int, 3*bs+1)
			for j := range tokens {
				tokens[j] = 1 + (base*7+j)%50
			}
			seq := newTestSeq(SeqID(len(seqs)+1), tokens...)
			if err := m.Allocate(seq); err != nil {
				t.Fatal(err)
			}
			seq.numComputed = len(tokens)
			seqs = append(seqs, seq)
			if i%5 == 0 { // a fork sharing every block
				c := newTestSeq(SeqID(len(seqs)+1), tokens...)
				m.Fork(seq, c)
				c.numComputed = seq.numComputed
				seqs = append(seqs, c)
			}
		}
		return m, seqs
	}
	one, seqsOne := build()
	queued, seqsQueued := build()
	for i := range seqsOne {
		upTo := (1 + i%3) * bs // one to three blocks
		one.commit(seqsOne[i], upTo)
		queued.commitLater(seqsQueued[i], upTo)
	}
	queued.flushCommits()
	if !slices.Equal(one.hashed, queued.hashed) || !slices.Equal(one.hash, queued.hash) ||
		!slices.Equal(one.parentHash, queued.parentHash) || !slices.Equal(one.tokenIDs, queued.tokenIDs) ||
		!slices.Equal(one.hashToBlock.slots, queued.hashToBlock.slots) {
		t.Fatal("queued commits left another prefix cache")
	}
	n := 0
	for i := range seqsOne {
		a, b := seqsOne[i], seqsQueued[i]
		if a.numHashedBlocks != b.numHashedBlocks || a.lastHash != b.lastHash {
			t.Fatalf("seq %d: queued %d blocks hashed, last %x; one by one %d, %x", a.id, b.numHashedBlocks, b.lastHash, a.numHashedBlocks, a.lastHash)
		}
		n += int(a.numHashedBlocks)
	}
	if one.hashToBlock.n == 0 || one.hashToBlock.n >= n {
		t.Fatalf("%d blocks cached of %d hashed: the case has no duplicate or shared block", one.hashToBlock.n, n)
	}
	if err := queued.checkInvariants(seqsQueued); err != nil {
		t.Fatal(err)
	}
}
