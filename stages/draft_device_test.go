package stages

import (
	"context"
	"slices"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu"
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
		ForwardResult: &ForwardResult{PreparedStep: &PreparedStep{ScheduledStep: &ScheduledStep{Outputs: &engine.SchedulerOutputs{StepID: 7}}}},
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
