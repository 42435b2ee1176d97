package stages

import (
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// A draft is (numDrafts, numAccepted) as the verify stage reports it.
type specDraft struct{ drafts, accepted int }

func TestRecordSpec(t *testing.T) {
	tests := []struct {
		name    string
		in      []specDraft
		want    SpecStats
		rate    float64
		meanLen float64
		perPos  []float64
		line    string
	}{
		{name: "nothing", want: SpecStats{}, perPos: []float64{}},
		{name: "zero drafts count nothing", in: []specDraft{{0, 0}, {0, 0}}, want: SpecStats{}, perPos: []float64{}},
		{
			name:    "one draft, none accepted",
			in:      []specDraft{{3, 0}},
			want:    SpecStats{NumDrafts: 1, NumDraftTokens: 3, AcceptedPerPos: []int64{0, 0, 0}, DraftedPerPos: []int64{1, 1, 1}},
			meanLen: 1, perPos: []float64{0, 0, 0},
			line: "accept 0.00, mean len 1.0, per-pos 0.00/0.00/0.00",
		},
		{
			name: "fixed length k=4",
			in:   []specDraft{{4, 4}, {4, 2}, {4, 0}, {4, 1}, {0, 0}},
			want: SpecStats{NumDrafts: 4, NumDraftTokens: 16, NumAcceptedTokens: 7,
				AcceptedPerPos: []int64{3, 2, 1, 1}, DraftedPerPos: []int64{4, 4, 4, 4}},
			rate: 7.0 / 16, meanLen: 1 + 7.0/4, perPos: []float64{0.75, 0.5, 0.25, 0.25},
			line: "accept 0.44, mean len 2.8, per-pos 0.75/0.50/0.25/0.25",
		},
		{
			name: "varying lengths: a position is judged by the drafts that reached it",
			in:   []specDraft{{1, 1}, {2, 1}, {3, 3}},
			want: SpecStats{NumDrafts: 3, NumDraftTokens: 6, NumAcceptedTokens: 5,
				AcceptedPerPos: []int64{3, 1, 1}, DraftedPerPos: []int64{3, 2, 1}},
			rate: 5.0 / 6, meanLen: 1 + 5.0/3, perPos: []float64{1, 0.5, 1},
			line: "accept 0.83, mean len 2.7, per-pos 1.00/0.50/1.00",
		},
		{
			name: "accepted clamped to [0, drafts]",
			in:   []specDraft{{2, 5}, {2, -1}},
			want: SpecStats{NumDrafts: 2, NumDraftTokens: 4, NumAcceptedTokens: 2,
				AcceptedPerPos: []int64{1, 1}, DraftedPerPos: []int64{2, 2}},
			rate: 0.5, meanLen: 2, perPos: []float64{0.5, 0.5},
			line: "accept 0.50, mean len 2.0, per-pos 0.50/0.50",
		},
		{
			name: "positions past the 16th count in the totals only",
			in:   []specDraft{{20, 18}},
			want: SpecStats{NumDrafts: 1, NumDraftTokens: 20, NumAcceptedTokens: 18,
				AcceptedPerPos: repeat(1, MaxSpecPositions), DraftedPerPos: repeat(1, MaxSpecPositions)},
			rate: 0.9, meanLen: 19, perPos: repeatF(1, MaxSpecPositions),
			line: "accept 0.90, mean len 19.0, per-pos 1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00/1.00",
		},
	}
	for _, tc := range tests {
		var s Stats
		for _, d := range tc.in {
			s.RecordSpec(d.drafts, d.accepted)
		}
		got := s.Spec()
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Spec = %+v, want %+v", tc.name, got, tc.want)
		}
		if r := got.AcceptanceRate(); math.Abs(r-tc.rate) > 1e-12 {
			t.Errorf("%s: AcceptanceRate = %v, want %v", tc.name, r, tc.rate)
		}
		if m := got.MeanAcceptedLength(); math.Abs(m-tc.meanLen) > 1e-12 {
			t.Errorf("%s: MeanAcceptedLength = %v, want %v", tc.name, m, tc.meanLen)
		}
		if p := got.PerPosAcceptanceRate(); !reflect.DeepEqual(p, tc.perPos) {
			t.Errorf("%s: PerPosAcceptanceRate = %v, want %v", tc.name, p, tc.perPos)
		}
		if l := got.String(); l != tc.line {
			t.Errorf("%s: String = %q, want %q", tc.name, l, tc.line)
		}
	}
}

func repeat(v int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func repeatF(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// The stats line's form: per-position rates with drafts of a fixed
// length (their accepted tokens sum to the total).
func TestSpecStatsString(t *testing.T) {
	sp := SpecStats{NumDrafts: 100, NumDraftTokens: 400, NumAcceptedTokens: 224,
		AcceptedPerPos: []int64{82, 64, 48, 30}, DraftedPerPos: []int64{100, 100, 100, 100}}
	if got, want := sp.String(), "accept 0.56, mean len 3.2, per-pos 0.82/0.64/0.48/0.30"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestSpecStatsSub(t *testing.T) {
	var s Stats
	s.RecordSpec(2, 1)
	prev := s.Spec()
	s.RecordSpec(4, 3)
	s.RecordSpec(4, 0)
	got := s.Spec().Sub(prev)
	want := SpecStats{NumDrafts: 2, NumDraftTokens: 8, NumAcceptedTokens: 3,
		AcceptedPerPos: []int64{1, 1, 1, 0}, DraftedPerPos: []int64{2, 2, 2, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Sub = %+v, want %+v", got, want)
	}
	if got := s.Spec().Sub(s.Spec()); got.NumDrafts != 0 || got.String() != "" {
		t.Errorf("Sub of itself = %+v (%q), want no drafts", got, got.String())
	}
	if got := (SpecStats{}).Sub(SpecStats{}); !reflect.DeepEqual(got, SpecStats{}) {
		t.Errorf("empty Sub = %+v", got)
	}
}

// Concurrent RecordSpec calls lose nothing and race with nothing (run
// with -race), and snapshots taken while they run keep Spec's invariants:
// never more accepted tokens than draft tokens, in total or at a
// position, nor more tokens than their drafts hold. (The invariants hold
// by the order of the atomics; a torn read needs a writer to stall between
// two of its adds, so this check catches a wrong order only by chance.)
func TestRecordSpecConcurrent(t *testing.T) {
	const workers, per, k = 8, 2000, 5
	var s Stats
	var wg sync.WaitGroup
	done := make(chan struct{})
	var readerErr string
	var readerWG sync.WaitGroup
	readerWG.Add(1)
	go func() {
		defer readerWG.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			sp := s.Spec()
			switch {
			case sp.NumAcceptedTokens > sp.NumDraftTokens:
				readerErr = "accepted > draft tokens"
			case sp.NumDraftTokens > k*sp.NumDrafts:
				readerErr = "more draft tokens than the drafts hold"
			case len(sp.AcceptedPerPos) != len(sp.DraftedPerPos):
				readerErr = "per-position slices of different lengths"
			default:
				for i := range sp.AcceptedPerPos {
					if sp.AcceptedPerPos[i] > sp.DraftedPerPos[i] {
						readerErr = "accepted > drafted at a position"
					}
				}
			}
			if readerErr != "" {
				t.Errorf("snapshot %+v: %s", sp, readerErr)
				return
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				// Worker w drafts k tokens and accepts (w+i)%(k+1).
				s.RecordSpec(k, (w+i)%(k+1))
			}
		}()
	}
	wg.Wait()
	close(done)
	readerWG.Wait()

	var want SpecStats
	want.AcceptedPerPos, want.DraftedPerPos = make([]int64, k), make([]int64, k)
	for w := range workers {
		for i := range per {
			a := (w + i) % (k + 1)
			want.NumDrafts++
			want.NumDraftTokens += k
			want.NumAcceptedTokens += int64(a)
			for p := range k {
				want.DraftedPerPos[p]++
				if p < a {
					want.AcceptedPerPos[p]++
				}
			}
		}
	}
	if got := s.Spec(); !reflect.DeepEqual(got, want) {
		t.Errorf("Spec = %+v, want %+v", got, want)
	}
}

// DecodeOutputTokens counts what decode steps emitted: every computed row
// but the drafts verification rejected.
func TestDecodeOutputTokens(t *testing.T) {
	tests := []struct {
		name   string
		rows   int64       // decode rows computed (a speculative step's drafts among them)
		drafts []specDraft // the verify stage's reports
		want   int64
	}{
		{name: "no speculation", rows: 40, want: 40},
		// Two sequences verifying 3 drafts each: 8 rows, 1+2 accepted, so
		// each emits its accepted drafts and one token of its own: 2+3.
		{name: "one step, two sequences", rows: 8, drafts: []specDraft{{3, 1}, {3, 2}}, want: 5},
		{name: "all accepted", rows: 5, drafts: []specDraft{{4, 4}}, want: 5},
		{name: "none accepted", rows: 5, drafts: []specDraft{{4, 0}}, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s Stats
			s.DecodeTokens.Add(tc.rows)
			for _, d := range tc.drafts {
				s.RecordSpec(d.drafts, d.accepted)
			}
			if got := s.DecodeOutputTokens(); got != tc.want {
				t.Errorf("DecodeOutputTokens() = %d, want %d", got, tc.want)
			}
		})
	}
}

// The exposed-host figure leaves out each gap's sampling and model
// drafting, and a step's drafting is taken by the gap it fell in only.
func TestExposedHostLeavesOutDrafting(t *testing.T) {
	var s Stats
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	s.RecordSample(us(100))
	s.RecordDraft(us(300))
	s.recordGap(us(1000)) // 1000 - 100 sampling - 300 drafting
	s.recordGap(us(1000)) // no drafting in this gap: 1000 - 100
	s.RecordDraft(us(2000))
	s.recordGap(us(1500)) // more drafting than gap: none exposed
	if got, want := time.Duration(s.ExposedNanos.Load()), us(600+900+0); got != want {
		t.Errorf("exposed %v, want %v", got, want)
	}
	if got, want := s.MeanDraft(), us(1150); got != want {
		t.Errorf("mean drafting %v, want %v", got, want)
	}
	if got := s.MeanExposedHost(); got != us(500) {
		t.Errorf("mean exposed %v, want 500µs", got)
	}
	var none *Stats
	none.RecordDraft(us(1)) // a drafter without stats
}

// The adaptive controller's draft limits: counted per limit (clamped to
// [0, MaxSpecPositions]), reported as shares in the stats line after the
// acceptance figures, alone when no draft was verified, and subtracted
// over an interval.
func TestRecordDraftLimit(t *testing.T) {
	var s Stats
	if got := s.Spec(); got.StepsAtLimit != nil || got.LimitShares() != nil {
		t.Errorf("no limits recorded: %v, %v", got.StepsAtLimit, got.LimitShares())
	}
	for _, l := range []int{0, 0, 0, -1} {
		s.RecordDraftLimit(l)
	}
	prev := s.Spec()
	if got, want := prev.String(), "limits 0 1.00"; got != want {
		t.Errorf("drafts off throughout: String = %q, want %q", got, want)
	}
	for _, l := range []int{2, 2, 1, 2} {
		s.RecordDraftLimit(l)
	}
	s.RecordDraftLimit(MaxSpecPositions + 5)
	got := s.Spec()
	want := make([]int64, MaxSpecPositions+1)
	want[0], want[1], want[2], want[MaxSpecPositions] = 4, 1, 3, 1
	if !reflect.DeepEqual(got.StepsAtLimit, want) {
		t.Errorf("StepsAtLimit = %v, want %v", got.StepsAtLimit, want)
	}
	s = Stats{}
	for _, l := range []int{0, 2, 2, 1, 2} {
		s.RecordDraftLimit(l)
	}
	s.RecordSpec(2, 1)
	sp := s.Spec()
	if got, want := sp.String(), "accept 0.50, mean len 2.0, per-pos 1.00/0.00, limits 0/1/2 0.20/0.20/0.60"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	s.RecordDraftLimit(0)
	if got, want := s.Spec().Sub(sp).StepsAtLimit, []int64{1, 0, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("Sub: StepsAtLimit = %v, want %v", got, want)
	}
}

// The loop's time per step kind: counts and means by kind, the difference
// of two snapshots, the summary line; nil-safe, and empty steps (or any
// other kind) are not counted.
func TestRecordStepTime(t *testing.T) {
	var nilStats *Stats
	nilStats.RecordStepTime(engine.StepDecode, time.Millisecond)
	var s Stats
	if got := s.StepTimes(); got != (StepTimes{}) || got.String() != "" {
		t.Fatalf("nothing recorded: %+v %q", got, got.String())
	}
	ms := time.Millisecond
	for _, r := range []struct {
		k engine.StepKind
		d time.Duration
	}{{engine.StepDecode, ms}, {engine.StepDecode, 3 * ms}, {engine.StepMixed, 10 * ms}, {engine.StepEmpty, ms}, {engine.StepDecode, -ms}} {
		s.RecordStepTime(r.k, r.d)
	}
	before := s.StepTimes()
	want := StepTimes{Decode: StepKindTime{2, 2 * ms}, Mixed: StepKindTime{1, 10 * ms}}
	if before != want || before.String() != "decode 2 x 2.00 ms, mixed 1 x 10.00 ms" {
		t.Fatalf("got %+v %q, want %+v", before, before.String(), want)
	}
	s.RecordStepTime(engine.StepDecode, 5*ms)
	s.RecordStepTime(engine.StepPrefill, 20*ms)
	diff := s.StepTimes().Sub(before)
	if want := (StepTimes{Decode: StepKindTime{1, 5 * ms}, Prefill: StepKindTime{1, 20 * ms}}); diff != want || diff.String() != "decode 1 x 5.00 ms, prefill 1 x 20.00 ms" {
		t.Errorf("difference %+v %q, want %+v", diff, diff.String(), want)
	}
}
