package stages

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models/random"
	"github.com/deepinfer/deepinfer-go/kernels"
)

// hostTimer is a kernels.DeviceTimer whose markers are timestamps of a
// clock read when they are recorded: the device of a backend that runs
// every call to completion (the CPU backend) seen as a stream.
type hostTimer struct {
	now       func() time.Duration
	failAfter int // Record fails after this many records (0: never)
	records   int
	open      int
}

type hostMarker struct {
	t        *hostTimer
	at       time.Duration
	recorded bool
}

func (h *hostTimer) NewDeviceMarker() (kernels.DeviceMarker, error) {
	h.open++
	return &hostMarker{t: h}, nil
}

func (m *hostMarker) Record() error {
	m.t.records++
	if m.t.failAfter > 0 && m.t.records > m.t.failAfter {
		return errors.New("event record failed")
	}
	m.at, m.recorded = m.t.now(), true
	return nil
}

func (m *hostMarker) Since(earlier kernels.DeviceMarker) (time.Duration, error) {
	e, ok := earlier.(*hostMarker)
	if !ok || e.t != m.t {
		return 0, kernels.ErrForeignMarker
	}
	if !e.recorded || !m.recorded {
		return 0, kernels.ErrMarkerNotRecorded
	}
	return m.at - e.at, nil
}

func (m *hostMarker) Close() error { m.t.open--; return nil }

// timedOps is a backend with host-clock markers.
type timedOps struct {
	kernels.Ops
	*hostTimer
}

// The ring's bookkeeping on a manual clock: each pair (N-1, N) is read
// when step N+1 finishes, busy is step N-1's start to end, span its start
// to step N's start; decode pairs need two decode steps; a host gap of a
// second or more (an idle engine) is not a pair.
func TestDeviceTimelinePairs(t *testing.T) {
	type step struct {
		idleBefore, busy time.Duration
		decode           bool
	}
	ms := time.Millisecond
	tests := []struct {
		name                    string
		steps                   []step
		wantAll, wantDecode     StepPairs
		wantIdle, wantDecodeIdl float64
	}{
		{
			name:  "two steps: nothing read yet",
			steps: []step{{0, 4 * ms, false}, {ms, 2 * ms, true}},
		},
		{
			name:  "prefill then decodes",
			steps: []step{{0, 4 * ms, false}, {ms, 2 * ms, true}, {ms, 2 * ms, true}, {ms, 2 * ms, true}},
			// Pairs (0,1): busy 4, span 5; (1,2): busy 2, span 3 (decode).
			wantAll:    StepPairs{N: 2, Busy: 6 * ms, Span: 8 * ms},
			wantDecode: StepPairs{N: 1, Busy: 2 * ms, Span: 3 * ms},
			wantIdle:   0.25, wantDecodeIdl: 1.0 / 3,
		},
		{
			name:  "an idle engine between steps is no pair",
			steps: []step{{0, 2 * ms, true}, {2 * time.Second, 2 * ms, true}, {0, 2 * ms, true}, {0, 2 * ms, true}},
			// (0,1) skipped: two seconds between them; (1,2): busy 2, span 2.
			wantAll:    StepPairs{N: 1, Busy: 2 * ms, Span: 2 * ms},
			wantDecode: StepPairs{N: 1, Busy: 2 * ms, Span: 2 * ms},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var clock time.Duration
			ht := &hostTimer{now: func() time.Duration { return clock }}
			st := &Stats{}
			tl, err := newDeviceTimeline(ht, st)
			if err != nil {
				t.Fatal(err)
			}
			origin := time.Now()
			tl.now = func() time.Time { return origin.Add(clock) } // host and device share the clock
			for _, s := range tc.steps {
				clock += s.idleBefore
				if err := tl.begin(s.decode); err != nil {
					t.Fatal(err)
				}
				clock += s.busy
				if err := tl.finish(); err != nil {
					t.Fatal(err)
				}
			}
			got := st.DeviceTimes()
			if !got.Timed || got.All != tc.wantAll || got.Decode != tc.wantDecode {
				t.Errorf("device times %+v, want all %+v, decode %+v", got, tc.wantAll, tc.wantDecode)
			}
			if f, ok := got.All.IdleFraction(); ok != (tc.wantAll.N > 0) || math.Abs(f-tc.wantIdle) > 1e-12 {
				t.Errorf("idle fraction %v, %v; want %v", f, ok, tc.wantIdle)
			}
			if f, ok := got.Decode.IdleFraction(); ok && math.Abs(f-tc.wantDecodeIdl) > 1e-12 {
				t.Errorf("decode idle fraction %v, want %v", f, tc.wantDecodeIdl)
			}
			tl.close()
			if ht.open != 0 {
				t.Errorf("%d markers left open", ht.open)
			}
		})
	}
}

func TestDeviceTimesSub(t *testing.T) {
	a := DeviceTimes{Timed: true, All: StepPairs{10, 10 * time.Millisecond, 20 * time.Millisecond}, Decode: StepPairs{4, 4 * time.Millisecond, 5 * time.Millisecond}}
	b := DeviceTimes{Timed: true, All: StepPairs{4, 4 * time.Millisecond, 8 * time.Millisecond}, Decode: StepPairs{1, time.Millisecond, time.Millisecond}}
	d := a.Sub(b)
	if d.All != (StepPairs{6, 6 * time.Millisecond, 12 * time.Millisecond}) || d.Decode != (StepPairs{3, 3 * time.Millisecond, 4 * time.Millisecond}) {
		t.Errorf("Sub = %+v", d)
	}
	if d.All.MeanSpan() != 2*time.Millisecond || d.All.MeanBusy() != time.Millisecond {
		t.Errorf("means %v, %v", d.All.MeanSpan(), d.All.MeanBusy())
	}
	if _, ok := (StepPairs{}).IdleFraction(); ok {
		t.Error("no pairs gave an idle fraction")
	}
}

// The forward stage on the CPU backend with host-clock markers: one
// prefill and several decode steps of a tiny Llama. Every pair resolved so
// far is counted, busy time is never more than the span, and a marker
// that fails turns the timeline off without failing a step.
func TestForwardDeviceTimeline(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	for _, failAfter := range []int{0, 5} {
		t.Run(fmt.Sprintf("fail after %d records", failAfter), func(t *testing.T) {
			rt, _ := graphTestRuntime(t, dir, false)
			origin := time.Now()
			ht := &hostTimer{now: func() time.Duration { return time.Since(origin) }, failAfter: failAfter}
			rt.Ops = timedOps{Ops: rt.Ops, hostTimer: ht}
			rt.Stats = &Stats{}
			f := newForward(*rt)
			if err := f.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			if f.timeline == nil {
				t.Fatal("a backend with markers got no device timeline")
			}
			const numSteps = 6 // one prefill, five decodes
			runForwardSteps(t, rt, f, numSteps)
			got := rt.Stats.DeviceTimes()
			if failAfter > 0 {
				// Two records a step: the third step's end marker fails.
				if f.timeline != nil || !strings.Contains(got.Err, "event record failed") {
					t.Errorf("after a failing marker: timeline %v, error %q", f.timeline, got.Err)
				}
				if got.All.N != 0 || ht.open != 0 {
					t.Errorf("%d pairs counted, %d markers open; want none", got.All.N, ht.open)
				}
				return
			}
			// Pairs (1,2) .. (4,5) are read by steps 3..6; (5,6) waits for step 7.
			if got.All.N != numSteps-2 || got.Decode.N != numSteps-3 {
				t.Errorf("pairs: all %d, decode %d; want %d and %d", got.All.N, got.Decode.N, numSteps-2, numSteps-3)
			}
			if got.All.Busy <= 0 || got.All.Busy > got.All.Span || got.Decode.Busy > got.Decode.Span {
				t.Errorf("busy %v, span %v (decode %v / %v): want 0 < busy <= span", got.All.Busy, got.All.Span, got.Decode.Busy, got.Decode.Span)
			}
			idle, ok := got.Decode.IdleFraction()
			if !ok || idle <= 0 || idle >= 1 {
				t.Errorf("decode idle fraction %v, %v: want in (0, 1) with a sleep between steps", idle, ok)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if ht.open != 0 {
				t.Errorf("%d markers open after Close", ht.open)
			}
		})
	}
}

// Without markers (the CPU backend as is) there is no timeline.
func TestForwardWithoutDeviceTimer(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	rt, _ := graphTestRuntime(t, dir, false)
	rt.Stats = &Stats{}
	f := newForward(*rt)
	if err := f.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f.timeline != nil || rt.Stats.DeviceTimes().Timed {
		t.Error("the CPU backend got a device timeline")
	}
}

// runForwardSteps runs numSteps steps of two sequences (a prefill, then
// decodes) through prepare and f, with 200 us of host time between steps.
func runForwardSteps(t *testing.T, rt *ForwardDeps, f *forward, numSteps int) {
	t.Helper()
	seqs := []*graphSeq{
		{id: 1, tokens: []int{1, 5, 9, 3}, table: []int{0, 1, 2, 3}},
		{id: 2, tokens: []int{1, 2}, table: []int{4, 5, 6, 7}},
	}
	for k := range numSteps {
		step := &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: engine.StepID(k + 1), NumSampleRows: len(seqs)}}
		for i, s := range seqs {
			step.Seqs = append(step.Seqs, s.meta(i))
			n := len(s.tokens) - s.cached
			step.Outputs.NumBatchedTokens += n
			if s.cached == 0 {
				step.Outputs.NumPrefillTokens += n
			} else {
				step.Outputs.NumDecodeTokens += n
			}
		}
		prep, err := prepareFor(*rt).Process(t.Context(), step)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Process(t.Context(), prep); err != nil {
			t.Fatalf("step %d: %v", k+1, err)
		}
		time.Sleep(200 * time.Microsecond) // host time between steps: device idle
		for _, s := range seqs {
			s.cached = len(s.tokens)
			s.tokens = append(s.tokens, 7)
		}
	}
}

// asyncTimedOps is timedOps whose backend also samples asynchronously on
// the "device" (never called here): the forward stage then leaves its work
// queued, and the forward time comes from the device timeline.
type asyncTimedOps struct{ timedOps }

func (asyncTimedOps) SampleTokens(kernels.Tensor, []kernels.SampleRow) (kernels.Tensor, []int32, error) {
	return nil, nil, errors.New("not used")
}

func (asyncTimedOps) SampleTokensAsync(kernels.Tensor, []kernels.SampleRow) (kernels.Tensor, func() ([]int32, error), error) {
	return nil, nil, errors.New("not used")
}

func TestForwardDeferredSync(t *testing.T) {
	dir := t.TempDir()
	if err := random.WriteLlama(dir, random.TinyLlama, 11); err != nil {
		t.Fatal(err)
	}
	for _, async := range []bool{false, true} {
		rt, _ := graphTestRuntime(t, dir, false)
		origin := time.Now()
		timed := timedOps{Ops: rt.Ops, hostTimer: &hostTimer{now: func() time.Duration { return time.Since(origin) }}}
		rt.Ops = timed
		if async {
			rt.Ops = asyncTimedOps{timed}
		}
		rt.Stats = &Stats{}
		f := newForward(*rt)
		if err := f.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if f.deferSync() != async {
			t.Fatalf("async sampler %v: deferSync %v", async, f.deferSync())
		}
		runForwardSteps(t, rt, f, 6)
		st := rt.Stats
		busy := st.DeviceTimes().All.Busy
		switch {
		case async && (st.ForwardTime() != busy || busy <= 0 || st.Gaps.Load() != 0):
			t.Errorf("deferred: forward time %v, device busy %v, %d host gaps; want the busy time and no gaps", st.ForwardTime(), busy, st.Gaps.Load())
		case !async && (st.ForwardTime() != time.Duration(st.ForwardNanos.Load()) || st.Gaps.Load() == 0):
			t.Errorf("waiting: forward time %v (host %v), %d host gaps; want the host time and gaps", st.ForwardTime(), time.Duration(st.ForwardNanos.Load()), st.Gaps.Load())
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The sample stage's timer adds the device time of each sampling launch to
// the timeline's busy time (all steps, and decode steps when the step is
// one), and stays off without markers or without a timeline.
func TestSampleTimer(t *testing.T) {
	var clock time.Duration
	ht := &hostTimer{now: func() time.Duration { return clock }}
	rt := SampleDeps{Ops: timedOps{hostTimer: ht}, Stats: &Stats{}}
	var st sampleTimer
	if st.begin(rt) {
		t.Fatal("timed without a device timeline")
	}
	rt.Stats.deviceTimed.Store(true)
	for i, decode := range []bool{false, true, true} {
		if !st.begin(rt) {
			t.Fatalf("launch %d: not timed", i)
		}
		clock += 3 * time.Millisecond
		st.end()
		st.read(rt, decode)
	}
	d := rt.Stats.DeviceTimes()
	if d.All.Busy != 9*time.Millisecond || d.Decode.Busy != 6*time.Millisecond {
		t.Errorf("busy %v (decode %v), want 9ms (6ms)", d.All.Busy, d.Decode.Busy)
	}
	if ht.open != 2 {
		t.Errorf("%d markers open, want the timer's 2", ht.open)
	}

	var none sampleTimer
	cpu := SampleDeps{Ops: nil, Stats: &Stats{}}
	cpu.Stats.deviceTimed.Store(true)
	if none.begin(cpu) || !none.off {
		t.Error("a backend without markers was timed")
	}
}
