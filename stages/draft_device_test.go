package stages

import (
	"context"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/engine/models"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
	"github.com/deepinfer/deepinfer-go/kernels/opstest"
)

// deviceDrafter proposes fixed drafts through backend memory; it records
// whether the draft stage published the next step's inputs before it
// fetched the drafts.
type deviceDrafter struct {
	ops    kernels.Ops
	tokens []int32
	at     [][]int32
}

func (f *deviceDrafter) Propose(ctx context.Context, step *SampledStep) ([][]int, error) {
	dd, err := f.ProposeOnDevice(ctx, step)
	if err != nil {
		return nil, err
	}
	return dd.Host(f.ops)
}

func (f *deviceDrafter) ProposeOnDevice(context.Context, *SampledStep) (DeviceDrafts, error) {
	t, err := kernels.FromI32(f.ops, f.tokens, len(f.tokens))
	return DeviceDrafts{Tokens: t, At: f.at}, err
}

// A drafter whose drafts stay in backend memory: the stage builds the next
// step's input table from them on the backend, publishes it early, and
// still hands the host its drafts; rows with fewer drafts than k are
// padded with their last token.
func TestDraftStageDeviceDrafts(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	const k = 3
	f := &deviceDrafter{ops: ops, tokens: []int32{50, 60, 51, 61, 52}, at: [][]int32{{0, 2, 4}, {}, {1, 3}}}
	s := &draftStage{d: DraftDeps{Ops: ops, Speculative: Speculative{NumSpeculativeTokens: k}}, drafter: f}
	var early *SampledStep
	s.PublishLagged(func(v *SampledStep) { early = v })
	step := &SampledStep{
		ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: 7, DraftLimit: k}}}},
		Verified:      []VerifiedRow{{TokenIDs: []int{5}}, {TokenIDs: []int{6, 7}}, {TokenIDs: []int{8, 9, 10}}},
	}
	got, err := s.Process(context.Background(), step)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{50, 51, 52}, {}, {60, 61}}
	for r := range want {
		if !slices.Equal(got.Drafts[r], want[r]) {
			t.Errorf("drafts[%d] = %v, want %v", r, got.Drafts[r], want[r])
		}
	}
	if early == nil || early.Next != got.Next || early.Accepted != got.Accepted || early.Outputs.StepID != 7 {
		t.Fatalf("early publish = %+v, want the step's Next and Accepted", early)
	}
	next, err := kernels.ToI32(ops, got.Next)
	if err != nil {
		t.Fatal(err)
	}
	if w := []int32{5, 50, 51, 52, 7, 7, 7, 7, 10, 60, 61, 10}; !slices.Equal(next, w) {
		t.Errorf("next = %v, want %v", next, w)
	}
	acc, err := kernels.ToI32(ops, got.Accepted)
	if err != nil {
		t.Fatal(err)
	}
	if w := []int32{0, 1, 2}; !slices.Equal(acc, w) {
		t.Errorf("accepted = %v, want %v", acc, w)
	}
	// A draft index outside the tokens is an error, not a wrong draft.
	f.at = [][]int32{{0, 9}, {}, {}}
	if _, err := s.Process(context.Background(), step); err == nil {
		t.Error("a draft index past the tokens was accepted")
	}
}

// Argmax on the CPU backend takes the lowest id on ties and skips NaN, as
// the contract says (the CUDA kernel is checked against it on the GPU).
func TestArgmaxCPU(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	nan, inf := float32(0), float32(1)
	nan /= nan
	inf /= 0
	logits := []float32{
		1, 3, 3, 2, // tie: lowest id
		nan, 1, 2, nan, // NaN never wins
		-inf, -inf, -inf, -inf, // nothing above -Inf: 0
		-5, -1, -7, -1,
	}
	l, err := kernels.FromF32(ops, logits, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ops.Alloc(kernels.I32, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := kernels.ArgmaxInto(ops, out, l); err != nil {
		t.Fatal(err)
	}
	got, err := kernels.ToI32(ops, out)
	if err != nil {
		t.Fatal(err)
	}
	if w := []int32{1, 2, 0, 1}; !slices.Equal(got, w) {
		t.Errorf("argmax = %v, want %v", got, w)
	}
	if err := kernels.ArgmaxInto(ops, l, l); err == nil {
		t.Error("F32 out accepted")
	}
}

// A step planned with drafts off (DraftFree: DraftLimit 0, nothing to
// verify) passes through verify and draft without a backend call: both
// stages get nil Ops, which any call would dereference. The verify stage
// leaves the host verification for Await; the draft stage publishes the
// step at once with its device tokens and no input table or accepted
// counts (the next step reads its placeholders from those tokens,
// unshifted), then waits for the host and proposes nothing.
func TestDraftFreeStepPassesThrough(t *testing.T) {
	ops := cpu.New(cpu.Options{Threads: 1})
	defer ops.Close()
	tokens, err := kernels.FromI32(ops, []int32{7, 9}, 2)
	if err != nil {
		t.Fatal(err)
	}
	metas := []engine.SequenceMetadata{{SeqID: 1, SeqlenQ: 1, Sample: true, InputFromRow: -1}, {SeqID: 2, SeqlenQ: 1, Sample: true, InputFromRow: -1}}
	out := &engine.SchedulerOutputs{StepID: 5, NumSampleRows: 2, DraftLimit: 0}
	step := &SampledStep{
		ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: &ScheduledStep{Outputs: out, Seqs: metas},
			Rows: []RowRef{{Meta: &metas[0], SeqID: 1, Row: 0}, {Meta: &metas[1], SeqID: 2, Row: 1}}}},
		Tokens: tokens,
	}
	sampled := false
	step.pending = []func() error{func() error { // the host samples, arriving later
		sampled = true
		step.Samples = []Sample{{Token: 7}, {Token: 9}}
		return nil
	}}
	if !DraftFree(step) {
		t.Fatal("a step with draft limit 0 and no drafts is not draft-free")
	}
	v := &verify{d: VerifyDeps{Device: true}}
	if _, err := v.Process(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	if sampled || step.DeviceVerified != nil {
		t.Fatalf("verify waited for the host (%v) or verified on the device (%v)", sampled, step.DeviceVerified != nil)
	}
	var early *SampledStep
	s := &draftStage{d: DraftDeps{Speculative: Speculative{NumSpeculativeTokens: 3}}, drafter: &ngramDrafter{}}
	s.PublishLagged(func(p *SampledStep) {
		if sampled {
			t.Error("published after the host samples arrived")
		}
		early = p
	})
	got, err := s.Process(context.Background(), step)
	if err != nil {
		t.Fatal(err)
	}
	if early == nil || early.Tokens != tokens || early.Next != nil || early.Accepted != nil {
		t.Fatalf("early publish %+v: want the device tokens, no table, no accepted counts", early)
	}
	if got.Next != nil || got.Accepted != nil || len(got.Drafts) != 2 || len(got.Drafts[0])+len(got.Drafts[1]) != 0 {
		t.Errorf("draft-free step: next %v, accepted %v, drafts %v", got.Next, got.Accepted, got.Drafts)
	}
	if len(got.Verified) != 2 || got.Verified[0].TokenIDs[0] != 7 || got.Verified[1].TokenIDs[0] != 9 {
		t.Errorf("verified %+v, want one token each, the samples", got.Verified)
	}
	// With a draft limit the same step is not draft-free.
	out.DraftLimit = 3
	if DraftFree(step) {
		t.Error("a step with draft limit 3 is draft-free")
	}
}

// stepDrafter proposes, for row r of step s, the drafts 100*s+r and
// 100*s+r+50.
type stepDrafter struct{}

func (stepDrafter) Propose(_ context.Context, step *SampledStep) ([][]int, error) {
	out := make([][]int, len(step.Verified))
	for r := range out {
		s := int(step.Outputs.StepID)
		out[r] = []int{100*s + r, 100*s + r + 50}
	}
	return out, nil
}

// The draft stage uploads each step's next-input table into the buffer of
// the step three before it: after the first steps it allocates nothing,
// and the table the next forward pass reads (the step before's) keeps its
// values while the following steps are drafted.
func TestDraftTablesReused(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	ops := &opstest.Counting{Ops: c}
	s := &draftStage{d: DraftDeps{Ops: ops, Speculative: Speculative{NumSpeculativeTokens: 2}}, drafter: stepDrafter{}}
	want := func(id, r int) []int32 { return []int32{int32(id), int32(100*id + r), int32(100*id + r + 50)} }
	var steps []*SampledStep
	for id := 1; id <= 8; id++ {
		n := 1 + id%2
		metas := make([]engine.SequenceMetadata, n)
		rows := make([]RowRef, n)
		verified := make([]VerifiedRow, n)
		for r := range n {
			metas[r] = engine.SequenceMetadata{SeqID: engine.SeqID(r + 1), SeqlenQ: 1, Sample: true, InputFromRow: -1}
			rows[r] = RowRef{Meta: &metas[r], SeqID: metas[r].SeqID, Row: r}
			verified[r] = VerifiedRow{Ref: rows[r], TokenIDs: []int{id}}
		}
		out := &engine.SchedulerOutputs{StepID: engine.StepID(id), NumSampleRows: n, DraftLimit: 2}
		step := &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{
			ScheduledStep: &ScheduledStep{Outputs: out, Seqs: metas}, Rows: rows}}, Verified: verified}
		before := ops.Allocs
		if _, err := s.Process(context.Background(), step); err != nil {
			t.Fatal(err)
		}
		if id > 4 && ops.Allocs != before {
			t.Errorf("step %d allocated %d tensors, want none", id, ops.Allocs-before)
		}
		steps = append(steps, step)
		for _, j := range []int{id - 1, id} { // the step before's table and this one's
			if j < 1 {
				continue
			}
			next, err := kernels.ToI32(ops, steps[j-1].Next)
			if err != nil {
				t.Fatal(err)
			}
			for r := range len(steps[j-1].Verified) {
				if got := next[3*r : 3*r+3]; !slices.Equal(got, want(j, r)) {
					t.Fatalf("after step %d: step %d's table row %d is %v, want %v", id, j, r, got, want(j, r))
				}
			}
		}
	}
}

// The verify stage's device half puts each step's layout and outcome in
// the buffers of the step three before it: after the first steps it
// allocates and uploads nothing (the layout does not change), and the
// outcome the step before's draft stage and
// this step's forward pass read keeps its values.
func TestVerifyDeviceReusesBuffers(t *testing.T) {
	c := cpu.New(cpu.Options{Threads: 1})
	defer c.Close()
	ops := &opstest.Counting{Ops: c}
	v := &verify{d: VerifyDeps{Ops: ops, Device: true}}
	// Step id: sequence 0 verifies draft 10*id, which its first row's
	// token matches; sequence 1 verifies 10*id+1, which its token does not.
	want := func(id int) []int32 { return []int32{1, 0, int32(10*id + 7), 999, 1, 2} }
	var steps []*SampledStep
	for id := 1; id <= 7; id++ {
		metas := []engine.SequenceMetadata{
			{SeqID: 1, SeqlenQ: 2, NumDrafts: 1, Sample: true, SampleRow: 0, InputFromRow: -1, InputTokenIDs: []int{5, 10 * id}},
			{SeqID: 2, SeqlenQ: 2, NumDrafts: 1, Sample: true, SampleRow: 1, InputFromRow: -1, InputTokenIDs: []int{6, 10*id + 1}},
		}
		var rows []RowRef
		for r := range metas {
			for j := range 2 {
				rows = append(rows, RowRef{Meta: &metas[r], SeqID: metas[r].SeqID, Row: r, Offset: j})
			}
		}
		ids, err := kernels.FromI32(ops, []int32{5, int32(10 * id), 6, int32(10*id + 1)}, 4)
		if err != nil {
			t.Fatal(err)
		}
		tokens, err := kernels.FromI32(ops, []int32{int32(10 * id), int32(10*id + 7), 999, 3}, 4)
		if err != nil {
			t.Fatal(err)
		}
		out := &engine.SchedulerOutputs{StepID: engine.StepID(id), NumSampleRows: 2, DraftLimit: 1, NumDraftTokens: 2}
		step := &SampledStep{ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{
			ScheduledStep: &ScheduledStep{Outputs: out, Seqs: metas}, Rows: rows,
			Batch: &models.ForwardBatch{NumTokens: 4, InputIDs: ids}}}, Tokens: tokens}
		step.pending = []func() error{func() error { // the host samples, arriving later
			step.Samples = []Sample{{Token: 10 * id}, {Token: 10*id + 7}, {Token: 999}, {Token: 3}}
			return nil
		}}
		before, uploads := ops.Allocs, ops.Uploads
		if _, err := v.Process(context.Background(), step); err != nil {
			t.Fatal(err)
		}
		if id > 3 && ops.Allocs != before {
			t.Errorf("step %d allocated %d tensors, want none", id, ops.Allocs-before)
		}
		// The layout is the same every step: each buffer gets it once.
		// (The outcome is one upload a step here: the counting wrapper
		// hides the backend's DraftAccepter, so kernels.AcceptDraftsInto
		// accepts on the host and uploads.)
		wantUploads := 2
		if id > 3 {
			wantUploads = 1
		}
		if got := ops.Uploads - uploads; got != wantUploads {
			t.Errorf("step %d uploaded %d times, want %d (the layout only while its buffer is new)", id, got, wantUploads)
		}
		steps = append(steps, step)
		for _, j := range []int{id - 1, id} {
			if j < 1 {
				continue
			}
			got, err := kernels.ToI32(ops, steps[j-1].DeviceVerified)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want(j)) {
				t.Fatalf("after step %d: step %d's device verification %v, want %v", id, j, got, want(j))
			}
		}
	}
}
