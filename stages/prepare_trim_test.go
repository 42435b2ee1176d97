package stages

import (
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
)

// trimScheduled drops the rows past each shifted decode's draft and
// nothing else: plain decodes, exact drafts and prefill chunks keep their
// rows, the outputs' counts follow, and the step it copies is unchanged.
func TestTrimScheduled(t *testing.T) {
	const k = 3
	ph := engine.PlaceholderToken
	shifted := func(id engine.SeqID, row, pos int) engine.SequenceMetadata {
		return engine.SequenceMetadata{SeqID: id, Shifted: true, InputFromRow: row, NumDrafts: k, SeqlenQ: 1 + k, SeqlenK: pos + 1 + k, PosStart: pos,
			InputTokenIDs: []int{ph, ph, ph, ph}, SlotMapping: []int{pos, pos + 1, pos + 2, pos + 3}, Sample: true}
	}
	exact := engine.SequenceMetadata{SeqID: 9, NumDrafts: 2, SeqlenQ: 3, SeqlenK: 13, PosStart: 10, InputTokenIDs: []int{5, 6, 7}, SlotMapping: []int{10, 11, 12}, Sample: true}
	prefill := engine.SequenceMetadata{SeqID: 10, Prefill: true, SeqlenQ: 4, SeqlenK: 4, InputTokenIDs: []int{1, 2, 3, 4}, SlotMapping: []int{0, 1, 2, 3}, InputFromRow: -1}
	seqs := []engine.SequenceMetadata{shifted(1, 0, 20), shifted(2, 2, 40), exact, shifted(3, 1, 60), prefill}
	out := &engine.SchedulerOutputs{StepID: 7, NumBatchedTokens: 3*(1+k) + 3 + 4, NumDecodeTokens: 3*(1+k) + 3, NumPrefillTokens: 4, NumDraftTokens: 3*k + 2, NumDecodeSeqs: 4}
	step := &ScheduledStep{Outputs: out, Seqs: seqs}
	before := *out
	beforeSeqs := []engine.SequenceMetadata{shifted(1, 0, 20), shifted(2, 2, 40), exact, shifted(3, 1, 60), prefill}

	got, err := trimScheduled(step, []int{1, k, 0}, nil) // rows 0, 1, 2: seqs 1, 3, 2
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ drafts, q, k int }{{1, 2, 22}, {0, 1, 41}, {2, 3, 13}, {k, 1 + k, 64}, {0, 4, 4}} {
		m := got.Seqs[i]
		if m.NumDrafts != want.drafts || m.SeqlenQ != want.q || m.SeqlenK != want.k || len(m.InputTokenIDs) != want.q || len(m.SlotMapping) != want.q || m.PosStart != seqs[i].PosStart {
			t.Errorf("seq %d: drafts %d, q %d, k %d, %d ids, %d slots; want drafts %d, q %d, k %d", m.SeqID, m.NumDrafts, m.SeqlenQ, m.SeqlenK, len(m.InputTokenIDs), len(m.SlotMapping), want.drafts, want.q, want.k)
		}
	}
	dropped := (k - 1) + k
	if o := got.Outputs; o.NumBatchedTokens != before.NumBatchedTokens-dropped || o.NumDecodeTokens != before.NumDecodeTokens-dropped ||
		o.NumDraftTokens != before.NumDraftTokens-dropped || o.NumPrefillTokens != 4 || o.NumDecodeSeqs != 4 || o.StepID != 7 {
		t.Errorf("outputs %+v after dropping %d rows of %+v", *o, dropped, before)
	}
	if !reflect.DeepEqual(*out, before) || !reflect.DeepEqual(step.Seqs, beforeSeqs) {
		t.Error("the step trimmed was modified")
	}

	// A placeholder source the step before did not draft for is an error
	// naming the sequence.
	if _, err := trimScheduled(step, []int{1, 1}, nil); err == nil || !strings.Contains(err.Error(), "sequence 2") {
		t.Errorf("drafts for 2 rows, a sequence reading row 2: err %v", err)
	}
}
