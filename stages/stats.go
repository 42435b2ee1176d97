package stages

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deepinfer/deepinfer-go/engine"
)

// Stats are the step loop's counters, updated by the stages and read by
// anyone (atomics).
type Stats struct {
	Steps         atomic.Int64
	PrefillTokens atomic.Int64                           // prompt tokens computed
	DecodeTokens  atomic.Int64                           // decode tokens computed
	DecodeSeqs    atomic.Int64                           // decodes computed (a sequence in a step; its drafts are more tokens)
	ForwardNanos  atomic.Int64                           // time inside the forward stage
	GapNanos      atomic.Int64                           // time between two forward passes
	ExposedNanos  atomic.Int64                           // the part of each gap that is not sampling: host time the device waits for
	Gaps          atomic.Int64                           // gaps measured (steps after the first of a busy period)
	Placeholders  atomic.Int64                           // inputs resolved from the previous step on the backend (ZOS)
	GraphSteps    atomic.Int64                           // steps the forward stage served by replaying a captured graph
	SampleNanos   atomic.Int64                           // sampling work (device work in the design: it sits between two forwards)
	lastSample    atomic.Int64                           // the latest step's sampling work, in nanoseconds
	DraftNanos    atomic.Int64                           // a model drafter's passes (RecordDraft): device work too
	DraftSteps    atomic.Int64                           // steps whose drafter ran model passes
	lastDraft     atomic.Int64                           // the model passes since the last gap, in nanoseconds
	forwardHigh   atomic.Int64                           // the largest ForwardTime reported
	stepTokens    [len(StepTokenBounds) + 1]atomic.Int64 // steps by their tokens; see StepTokenCounts
	flopBits      atomic.Uint64
	byteBits      atomic.Uint64

	// Device timeline (backends with kernels.DeviceTimer): see DeviceTimes.
	deviceTimed                         atomic.Bool
	devPairs, devBusy, devSpan          atomic.Int64
	decodePairs, decodeBusy, decodeSpan atomic.Int64
	devSample, decodeSample             atomic.Int64 // device sampling time (sampleTimer)
	forwardDeferred                     atomic.Bool  // the forward stage does not wait for the device
	deviceErr                           atomic.Pointer[string]

	// Speculative decoding (RecordSpec; see Spec).
	specDrafts, specDraftTokens, specAccepted atomic.Int64
	specDraftedPos, specAcceptedPos           [MaxSpecPositions]atomic.Int64
	specLimitSteps                            [MaxSpecPositions + 1]atomic.Int64 // RecordDraftLimit

	// Steps by kind (RecordStepTime; see StepTimes): count and time.
	kindSteps, kindNanos [3]atomic.Int64

	// The captured forward graphs' node counts by rows (RecordGraphNodes).
	graphMu    sync.Mutex
	graphNodes map[int]int
}

// GraphNodes is a captured forward graph's size: its decode rows and its
// nodes (kernel launches, copies and memsets: a census of the forward
// pass's launches).
type GraphNodes struct {
	Rows, Nodes int
}

// RecordGraphNodes records that the forward graph of rows decode rows has
// nodes nodes. Nil-safe and safe for concurrent use.
func (s *Stats) RecordGraphNodes(rows, nodes int) {
	if s == nil {
		return
	}
	s.graphMu.Lock()
	defer s.graphMu.Unlock()
	if s.graphNodes == nil {
		s.graphNodes = map[int]int{}
	}
	s.graphNodes[rows] = nodes
}

// GraphNodes returns the recorded forward graphs' sizes by ascending rows
// (nil on a nil Stats).
func (s *Stats) GraphNodes() []GraphNodes {
	if s == nil {
		return nil
	}
	s.graphMu.Lock()
	defer s.graphMu.Unlock()
	out := make([]GraphNodes, 0, len(s.graphNodes))
	for r, n := range s.graphNodes {
		out = append(out, GraphNodes{r, n})
	}
	slices.SortFunc(out, func(a, b GraphNodes) int { return a.Rows - b.Rows })
	return out
}

// StepKindTime is the steps of one kind and the mean time one took, from
// the completion of the step before it (or its planning, when the loop
// had gone idle) to its own completion: the loop's time for it, whatever
// overlaps inside (RecordStepTime).
type StepKindTime struct {
	Steps int64         `json:"steps"`
	Mean  time.Duration `json:"mean_ns"`
}

// StepTimes is the loop's time per step by kind: steps of decode rows
// alone (on CUDA, the ones a captured graph can serve), steps that carry
// prompt chunks beside decode rows (mixed), and steps of prompt chunks
// alone. A run whose mixed steps take several times a decode step's time
// (eager on a GPU) spends much of it there; see engine.admission_fraction.
type StepTimes struct {
	Decode  StepKindTime `json:"decode"`
	Mixed   StepKindTime `json:"mixed"`
	Prefill StepKindTime `json:"prefill"`
}

// Sub returns the times of the steps counted in s and not in o (o an
// earlier snapshot of the same Stats).
func (s StepTimes) Sub(o StepTimes) StepTimes {
	sub := func(a, b StepKindTime) StepKindTime {
		n := a.Steps - b.Steps
		if n <= 0 {
			return StepKindTime{}
		}
		return StepKindTime{Steps: n, Mean: (time.Duration(a.Steps)*a.Mean - time.Duration(b.Steps)*b.Mean) / time.Duration(n)}
	}
	return StepTimes{Decode: sub(s.Decode, o.Decode), Mixed: sub(s.Mixed, o.Mixed), Prefill: sub(s.Prefill, o.Prefill)}
}

// String is "decode 943 x 0.53 ms, mixed 683 x 2.20 ms" (kinds with no
// step left out; "" when none).
func (s StepTimes) String() string {
	var parts []string
	for _, k := range []struct {
		name string
		t    StepKindTime
	}{{"decode", s.Decode}, {"mixed", s.Mixed}, {"prefill", s.Prefill}} {
		if k.t.Steps > 0 {
			parts = append(parts, fmt.Sprintf("%s %d x %.2f ms", k.name, k.t.Steps, float64(k.t.Mean)/1e6))
		}
	}
	return strings.Join(parts, ", ")
}

// stepKindIndex maps a step kind to its slot in kindSteps (-1: none).
func stepKindIndex(k engine.StepKind) int {
	switch k {
	case engine.StepDecode:
		return 0
	case engine.StepMixed:
		return 1
	case engine.StepPrefill:
		return 2
	}
	return -1
}

// RecordStepTime counts one step of kind k that took d in the loop (see
// StepKindTime). Nil-safe and safe for concurrent use.
func (s *Stats) RecordStepTime(k engine.StepKind, d time.Duration) {
	if i := stepKindIndex(k); s != nil && i >= 0 && d >= 0 {
		s.kindSteps[i].Add(1)
		s.kindNanos[i].Add(int64(d))
	}
}

// StepTimes returns the steps and their mean loop time by kind so far.
func (s *Stats) StepTimes() StepTimes {
	var out StepTimes
	for i, t := range []*StepKindTime{&out.Decode, &out.Mixed, &out.Prefill} {
		if n := s.kindSteps[i].Load(); n > 0 {
			*t = StepKindTime{Steps: n, Mean: time.Duration(s.kindNanos[i].Load() / n)}
		}
	}
	return out
}

func addFloat(a *atomic.Uint64, v float64) {
	for {
		old := a.Load()
		if a.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// StepTokenBounds are the upper bounds of the buckets StepTokenCounts
// sorts steps into by their tokens (prompt and decode), vLLM's for its
// iteration-tokens histogram; a last bucket takes the steps past them.
var StepTokenBounds = [...]int{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

// StepTokenCounts returns how many forward passes had at most
// StepTokenBounds[i] tokens and more than the bound before (one entry per
// bound, then the steps past the last). Not cumulative. Cost: one atomic
// load per bucket.
func (s *Stats) StepTokenCounts() []int64 {
	out := make([]int64, len(s.stepTokens))
	for i := range s.stepTokens {
		out[i] = s.stepTokens[i].Load()
	}
	return out
}

// record counts one forward pass.
func (s *Stats) record(out *engine.SchedulerOutputs, cost engine.StepCost, d time.Duration) {
	tokens, b := out.NumPrefillTokens+out.NumDecodeTokens, 0
	for b < len(StepTokenBounds) && tokens > StepTokenBounds[b] {
		b++
	}
	s.stepTokens[b].Add(1)
	s.Steps.Add(1)
	s.PrefillTokens.Add(int64(out.NumPrefillTokens))
	s.DecodeTokens.Add(int64(out.NumDecodeTokens))
	s.DecodeSeqs.Add(int64(out.NumDecodeSeqs))
	s.ForwardNanos.Add(int64(d))
	addFloat(&s.flopBits, cost.FLOPs())
	addFloat(&s.byteBits, cost.Bytes())
}

// FLOPs is the estimated floating-point work of all forward passes so far.
func (s *Stats) FLOPs() float64 { return math.Float64frombits(s.flopBits.Load()) }

// Bytes is the estimated memory traffic of all forward passes so far.
func (s *Stats) Bytes() float64 { return math.Float64frombits(s.byteBits.Load()) }

// ForwardTime is the time spent in forward passes: the host's wait for them,
// or, when the forward stage leaves its work queued (asynchronous device
// sampling), their device time from the device timeline (every step but
// the last one or two, whose markers are read later).
//
// It never decreases: when the source switches from the host's clock to
// the device timeline (which trails it by a step or two), it holds its
// high-water mark until the timeline catches up.
func (s *Stats) ForwardTime() time.Duration {
	v := s.ForwardNanos.Load()
	if s.forwardDeferred.Load() && s.deviceTimed.Load() {
		v = s.devBusy.Load()
	}
	for {
		high := s.forwardHigh.Load()
		if v <= high {
			return time.Duration(high)
		}
		if s.forwardHigh.CompareAndSwap(high, v) {
			return time.Duration(v)
		}
	}
}

// recordGap counts the time between the end of a forward pass and the
// start of the next. A gap longer than a second is an idle engine, not
// host overhead, and is not counted.
// The sampling of the step before the gap (device work in the design) is
// not counted as exposed: by the time a forward pass starts, the previous
// step has been sampled in both modes (ZOS waits for its tokens).
//
// Nor are a model drafter's passes (RecordDraft): an MTP layer or a draft
// model runs between two forward passes of the target, on the device like
// them. They are taken once, by the gap they fell in (a step that drafts
// nothing leaves none to a later gap).
func (s *Stats) recordGap(d time.Duration) {
	draft := s.lastDraft.Swap(0)
	if d < time.Second {
		s.GapNanos.Add(int64(d))
		s.ExposedNanos.Add(max(0, int64(d)-s.lastSample.Load()-draft))
		s.Gaps.Add(1)
	}
}

// RecordDraft counts one step's model drafting d: the passes of a drafter
// that runs a model on the backend (MTP, a draft model, DSpark), from its
// start to its drafts queued or returned. Like sampling it is device work
// in the design, so the exposed-host figure leaves it out, and the stats
// line reports it on its own. A drafter that works on the host alone
// (prompt lookup) does not call it: its time is host time. Nil-safe and
// safe for concurrent use.
func (s *Stats) RecordDraft(d time.Duration) {
	if s == nil {
		return
	}
	s.DraftNanos.Add(int64(d))
	s.DraftSteps.Add(1)
	s.lastDraft.Add(int64(d))
}

// MeanDraft is the mean model drafting time of a step that drafted
// (RecordDraft), 0 when none did.
func (s *Stats) MeanDraft() time.Duration { return mean(&s.DraftNanos, &s.DraftSteps) }

// mean is total nanoseconds over n (0 when n is 0).
func mean(total, n *atomic.Int64) time.Duration {
	c := n.Load()
	if c == 0 {
		return 0
	}
	return time.Duration(total.Load() / c)
}

// RecordSample counts one step's sampling work d: the built-in samplers call it, and a
// sampler of another package may too, so that the stats line and the
// exposed-host figure (sampling is device work in the design) count it.
// Safe for concurrent use.
func (s *Stats) RecordSample(d time.Duration) {
	s.SampleNanos.Add(int64(d))
	s.lastSample.Store(int64(d))
}

// MeanExposedHost is the mean time between two forward passes that is
// neither forward, sampling nor model drafting work: the host time the
// device waits for.
func (s *Stats) MeanExposedHost() time.Duration { return mean(&s.ExposedNanos, &s.Gaps) }

// MeanGap is the mean host time between two forward passes.
func (s *Stats) MeanGap() time.Duration { return mean(&s.GapNanos, &s.Gaps) }

// StepPairs are device times summed over pairs of consecutive forward
// passes (step N and step N+1, with less than a second of host time
// between them, so that an idle engine is not counted).
type StepPairs struct {
	N int64 // pairs measured
	// Busy sums the device time of step N's forward pass: from the marker
	// recorded right before its work was queued to the one right after
	// (the model's layers and the LM head).
	Busy time.Duration
	// Span sums the device time from step N's start marker to step N+1's:
	// its forward pass plus whatever the device did or waited for before
	// step N+1 began (sampling, input uploads, idle time while the host
	// worked).
	Span time.Duration
}

// IdleFraction is 1 - Busy/Span: the share of the device's time between
// consecutive steps that is not forward work. It reports false when no
// pair was measured.
func (p StepPairs) IdleFraction() (float64, bool) {
	if p.N == 0 || p.Span <= 0 {
		return 0, false
	}
	return 1 - float64(p.Busy)/float64(p.Span), true
}

// MeanSpan is the mean device time from one step's start to the next's.
func (p StepPairs) MeanSpan() time.Duration {
	if p.N == 0 {
		return 0
	}
	return p.Span / time.Duration(p.N)
}

// MeanBusy is the mean device time of one forward pass.
func (p StepPairs) MeanBusy() time.Duration {
	if p.N == 0 {
		return 0
	}
	return p.Busy / time.Duration(p.N)
}

// DeviceTimes is a snapshot of the forward stage's device timeline: every
// pair of consecutive steps, and the pairs whose two steps are both pure
// decode steps. Measured only on backends that implement
// kernels.DeviceTimer; Timed is false otherwise.
//
// Busy is the forward passes' device time plus the device sampling
// kernels' (measured by the sample stage, summed over every step, so up to
// one step more than the pairs), so Span - Busy is the time the device had
// nothing to run.
type DeviceTimes struct {
	Timed  bool
	All    StepPairs
	Decode StepPairs
	// Err is why the timeline stopped, when a marker failed ("" if not).
	Err string
}

// Sub returns the pairs measured since prev (a snapshot taken earlier).
func (d DeviceTimes) Sub(prev DeviceTimes) DeviceTimes {
	sub := func(a, b StepPairs) StepPairs { return StepPairs{a.N - b.N, a.Busy - b.Busy, a.Span - b.Span} }
	return DeviceTimes{Timed: d.Timed, All: sub(d.All, prev.All), Decode: sub(d.Decode, prev.Decode), Err: d.Err}
}

// DeviceTimes returns the device timeline so far. Pairs are resolved one
// step late, so the last pair of a busy period appears once the next step
// has run. Cost: a few atomic loads.
func (s *Stats) DeviceTimes() DeviceTimes {
	d := DeviceTimes{
		Timed: s.deviceTimed.Load(),
		All: StepPairs{s.devPairs.Load(), time.Duration(s.devBusy.Load() + s.devSample.Load()),
			time.Duration(s.devSpan.Load())},
		Decode: StepPairs{s.decodePairs.Load(), time.Duration(s.decodeBusy.Load() + s.decodeSample.Load()),
			time.Duration(s.decodeSpan.Load())},
	}
	if e := s.deviceErr.Load(); e != nil {
		d.Err = *e
	}
	return d
}

// recordDeviceSample counts one step's sampling kernels as device work
// (see sampleTimer): Busy includes them.
func (s *Stats) recordDeviceSample(d time.Duration, decode bool) {
	s.devSample.Add(int64(d))
	if decode {
		s.decodeSample.Add(int64(d))
	}
}

// recordDevicePair counts one pair of consecutive steps.
func (s *Stats) recordDevicePair(busy, span time.Duration, decode bool) {
	s.devPairs.Add(1)
	s.devBusy.Add(int64(busy))
	s.devSpan.Add(int64(span))
	if decode {
		s.decodePairs.Add(1)
		s.decodeBusy.Add(int64(busy))
		s.decodeSpan.Add(int64(span))
	}
}

// deviceTimelineFailed records why the timeline stopped.
func (s *Stats) deviceTimelineFailed(err error) {
	msg := err.Error()
	s.deviceErr.Store(&msg)
}

// MaxSpecPositions is the number of draft positions whose acceptance
// RecordSpec counts one by one: the largest num_speculative_tokens the
// config allows.
const MaxSpecPositions = 16

// RecordSpec counts one verified draft: numDrafts draft tokens proposed
// for one sequence in one step and verified, of which the first
// numAccepted were accepted. The verify stage calls it once per sequence
// per step; numDrafts 0 (nothing drafted) counts nothing. numAccepted is
// clamped to [0, numDrafts]. Positions past MaxSpecPositions count in the
// totals only. Safe for concurrent use; cost: a few atomic adds per
// draft position.
//
// The counters are added in the reverse of the order Spec loads them, so
// that a snapshot taken during a call never shows more accepted tokens
// than drafted ones (in total or at a position) nor more tokens than its
// drafts account for.
func (s *Stats) RecordSpec(numDrafts, numAccepted int) {
	if numDrafts <= 0 {
		return
	}
	numAccepted = min(max(numAccepted, 0), numDrafts)
	s.specDrafts.Add(1)
	s.specDraftTokens.Add(int64(numDrafts))
	for i := range min(numDrafts, MaxSpecPositions) {
		s.specDraftedPos[i].Add(1)
	}
	for i := range min(numAccepted, MaxSpecPositions) {
		s.specAcceptedPos[i].Add(1)
	}
	s.specAccepted.Add(int64(numAccepted))
}

// RecordDraftLimit counts one step with decode rows planned with a draft
// limit of limit tokens (the adaptive controller's choice; clamped to
// [0, MaxSpecPositions]). Safe for concurrent use; cost: one atomic add.
func (s *Stats) RecordDraftLimit(limit int) {
	s.specLimitSteps[min(max(limit, 0), MaxSpecPositions)].Add(1)
}

// DecodeOutputTokens is the number of tokens decode steps emitted:
// DecodeTokens counts every row a decode step computed, a speculative
// step's draft rows among them, so the drafts verification rejected are
// taken off. Without speculative decoding it equals DecodeTokens.
func (s *Stats) DecodeOutputTokens() int64 {
	rejected := s.specDraftTokens.Load() - s.specAccepted.Load()
	return s.DecodeTokens.Load() - rejected
}

// SpecStats is a snapshot of the speculative-decoding counters (Stats.Spec),
// vLLM's spec-decode metrics.
type SpecStats struct {
	NumDrafts         int64 // verified drafts: sequence-steps that drafted at least one token
	NumDraftTokens    int64 // draft tokens proposed and verified
	NumAcceptedTokens int64 // draft tokens accepted
	// AcceptedPerPos[i] counts the drafts whose token at position i (from
	// 0) was accepted; DraftedPerPos[i] the drafts that had a token at
	// position i. Both end at the last position any draft reached (at most
	// MaxSpecPositions); nil when no draft was verified.
	AcceptedPerPos, DraftedPerPos []int64
	// StepsAtLimit[l] counts the steps with decode rows that the adaptive
	// draft-length controller planned with a limit of l drafts, up to the
	// largest limit it chose; nil without the controller.
	StepsAtLimit []int64
}

// Spec returns the speculative-decoding counters so far. Cost: a few
// dozen atomic loads and two small slices.
func (s *Stats) Spec() SpecStats {
	// Loaded in the reverse of RecordSpec's order (see there).
	var acc, drafted [MaxSpecPositions]int64
	out := SpecStats{NumAcceptedTokens: s.specAccepted.Load()}
	for i := range acc {
		acc[i] = s.specAcceptedPos[i].Load()
	}
	n := 0
	for i := range drafted {
		if drafted[i] = s.specDraftedPos[i].Load(); drafted[i] > 0 {
			n = i + 1
		}
	}
	out.NumDraftTokens = s.specDraftTokens.Load()
	out.NumDrafts = s.specDrafts.Load()
	var limits [MaxSpecPositions + 1]int64
	top := 0
	for i := range limits {
		if limits[i] = s.specLimitSteps[i].Load(); limits[i] > 0 {
			top = i + 1
		}
	}
	if top > 0 {
		out.StepsAtLimit = append([]int64(nil), limits[:top]...)
	}
	if n > 0 {
		out.AcceptedPerPos = append([]int64(nil), acc[:n]...)
		out.DraftedPerPos = append([]int64(nil), drafted[:n]...)
	}
	return out
}

// Sub returns the counts since prev (a snapshot taken earlier), for a
// report over an interval.
func (sp SpecStats) Sub(prev SpecStats) SpecStats {
	sub := func(a, b []int64) []int64 {
		if len(a) == 0 {
			return nil
		}
		out := append([]int64(nil), a...)
		for i := range min(len(a), len(b)) {
			out[i] -= b[i]
		}
		return out
	}
	return SpecStats{
		NumDrafts:         sp.NumDrafts - prev.NumDrafts,
		NumDraftTokens:    sp.NumDraftTokens - prev.NumDraftTokens,
		NumAcceptedTokens: sp.NumAcceptedTokens - prev.NumAcceptedTokens,
		AcceptedPerPos:    sub(sp.AcceptedPerPos, prev.AcceptedPerPos),
		DraftedPerPos:     sub(sp.DraftedPerPos, prev.DraftedPerPos),
		StepsAtLimit:      sub(sp.StepsAtLimit, prev.StepsAtLimit),
	}
}

// LimitShares returns StepsAtLimit as shares of its total (nil when it is
// empty).
func (sp SpecStats) LimitShares() []float64 {
	total := int64(0)
	for _, n := range sp.StepsAtLimit {
		total += n
	}
	if total == 0 {
		return nil
	}
	out := make([]float64, len(sp.StepsAtLimit))
	for i, n := range sp.StepsAtLimit {
		out[i] = float64(n) / float64(total)
	}
	return out
}

// AcceptanceRate is the share of draft tokens accepted (0 when none was
// drafted).
func (sp SpecStats) AcceptanceRate() float64 {
	if sp.NumDraftTokens <= 0 {
		return 0
	}
	return float64(sp.NumAcceptedTokens) / float64(sp.NumDraftTokens)
}

// MeanAcceptedLength is vLLM's "mean acceptance length": the tokens a
// sequence emits per verify step, 1 + accepted tokens per draft (the
// verify step's own token plus the accepted ones); 0 when no draft was
// verified.
func (sp SpecStats) MeanAcceptedLength() float64 {
	if sp.NumDrafts <= 0 {
		return 0
	}
	return 1 + float64(sp.NumAcceptedTokens)/float64(sp.NumDrafts)
}

// PerPosAcceptanceRate returns, for each draft position, the share of the
// drafts reaching it whose token there was accepted
// (AcceptedPerPos[i]/DraftedPerPos[i]; 0 where none reached it). With
// drafts of a fixed length k it is vLLM's per-position acceptance rate
// (accepted at position i / drafts); with drafts of varying length
// (ngram, a confidence threshold) a position is judged only by the drafts
// that reached it.
func (sp SpecStats) PerPosAcceptanceRate() []float64 {
	out := make([]float64, len(sp.AcceptedPerPos))
	for i, a := range sp.AcceptedPerPos {
		if i < len(sp.DraftedPerPos) && sp.DraftedPerPos[i] > 0 {
			out[i] = float64(a) / float64(sp.DraftedPerPos[i])
		}
	}
	return out
}

// String is the stats line's summary of sp, as
// "accept 0.62, mean len 2.9, per-pos 0.81/0.64/0.47/0.30, limits
// 0/1/2 0.10/0.70/0.20": the acceptance rate, the mean acceptance length,
// the per-position acceptance rates, and with the adaptive controller the
// shares of decode steps it planned at each draft limit (a run whose
// controller turned drafts off shows the last part only). Empty when
// there is nothing to say.
func (sp SpecStats) String() string {
	var b strings.Builder
	if sp.NumDrafts > 0 {
		fmt.Fprintf(&b, "accept %.2f, mean len %.1f, per-pos ", sp.AcceptanceRate(), sp.MeanAcceptedLength())
		for i, r := range sp.PerPosAcceptanceRate() {
			if i > 0 {
				b.WriteByte('/')
			}
			fmt.Fprintf(&b, "%.2f", r)
		}
	}
	if shares := sp.LimitShares(); shares != nil {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString("limits " + LimitSharesString(shares))
	}
	return b.String()
}

// LimitSharesString writes shares of steps by draft limit (LimitShares)
// as "0/1/2 0.10/0.70/0.20": the limits, then their shares; empty for
// none.
func LimitSharesString(shares []float64) string {
	if len(shares) == 0 {
		return ""
	}
	limits, parts := make([]string, len(shares)), make([]string, len(shares))
	for i, r := range shares {
		limits[i], parts[i] = strconv.Itoa(i), strconv.FormatFloat(r, 'f', 2, 64)
	}
	return strings.Join(limits, "/") + " " + strings.Join(parts, "/")
}
