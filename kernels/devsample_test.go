package kernels

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSampleArgs(t *testing.T) {
	valid := func() SampleRow {
		return SampleRow{Temperature: 0.7, TopK: 5, TopP: 0.9, MinP: 0.1, RepetitionPenalty: 1.1,
			Edits: []LogitEdit{{Token: 3, Flags: EditMask}, {Token: 9, Bias: -2, Flags: EditBias | EditSeen, Count: 2}}}
	}
	nan := float32(math.NaN())
	tests := []struct {
		name   string
		logits Tensor
		edit   func(*SampleRow)
		is     error
		want   string // in the message
	}{
		{"valid", fakeTensor{[]int{2, 10}, F32}, func(*SampleRow) {}, nil, ""},
		{"greedy ignores temperature", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Greedy, r.Temperature = true, 0 }, nil, ""},
		{"top_k -1", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.TopK = -1 }, nil, ""},
		{"rows", fakeTensor{[]int{3, 10}, F32}, func(*SampleRow) {}, ErrShape, "logits"},
		{"dtype", fakeTensor{[]int{2, 10}, BF16}, func(*SampleRow) {}, ErrDType, "logits"},
		{"empty vocabulary", fakeTensor{[]int{2, 0}, F32}, func(*SampleRow) {}, ErrShape, "empty"},
		{"temperature 0", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Temperature = 0 }, ErrSampleParams, "temperature"},
		{"temperature NaN", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Temperature = nan }, ErrSampleParams, "temperature"},
		{"top_k", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.TopK = -2 }, ErrSampleParams, "top_k"},
		{"top_p 0", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.TopP = 0 }, ErrSampleParams, "top_p"},
		{"top_p above 1", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.TopP = 1.5 }, ErrSampleParams, "top_p"},
		{"min_p", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.MinP = -0.1 }, ErrSampleParams, "min_p"},
		{"repetition", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.RepetitionPenalty = 0 }, ErrSampleParams, "repetition_penalty"},
		{"presence", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.PresencePenalty = float32(math.Inf(1)) }, ErrSampleParams, "presence_penalty"},
		{"frequency", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.FrequencyPenalty = nan }, ErrSampleParams, "frequency_penalty"},
		{"token id", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[1].Token = 10 }, ErrOutOfRange, "edits[1]: token id 10"},
		{"negative token id", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[0].Token = -1 }, ErrOutOfRange, "edits[0]"},
		{"duplicate", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[1].Token = 3 }, ErrSampleParams, "appears twice"},
		{"count", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[1].Count = -1 }, ErrSampleParams, "count"},
		{"bias", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[1].Bias = nan }, ErrSampleParams, "bias"},
		{"unused bias", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[0].Bias = nan }, nil, ""},
		{"flags", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Edits[0].Flags = 8 }, ErrSampleParams, "flags"},
		{"num_logprobs negative", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.NumLogprobs = -1 }, ErrSampleParams, "num_logprobs"},
		{"logprobs on the device", fakeTensor{[]int{2, 10}, F32}, func(r *SampleRow) { r.Logprobs = true }, ErrSampleParams, "logprobs are not produced"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := valid()
			tc.edit(&bad)
			rows := []SampleRow{valid(), bad}
			for _, seen := range [][]bool{nil, make([]bool, 16)} {
				vocab, err := SampleArgs("cpu", tc.logits, rows, seen)
				if (err == nil) != (tc.is == nil) || !errors.Is(err, tc.is) {
					t.Fatalf("SampleArgs = %v, want %v", err, tc.is)
				}
				if err != nil {
					if !strings.HasPrefix(err.Error(), "cpu: sample: ") || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("error %q does not name the backend, the op and %q", err, tc.want)
					}
					continue
				}
				if vocab != 10 {
					t.Errorf("vocab %d, want 10", vocab)
				}
				for i, s := range seen {
					if s {
						t.Fatalf("seen[%d] left set", i)
					}
				}
			}
		})
	}
}

// TestSampleRowCheck covers what Check accepts beyond SampleArgs (the host
// sampler's logprobs) and its own scratch handling.
func TestSampleRowCheck(t *testing.T) {
	tests := []struct {
		name  string
		vocab int
		row   SampleRow
		is    error
		want  string // in the message
	}{
		{"greedy, no edits", 10, SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}, nil, ""},
		{"logprobs with top entries", 10, SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1, Logprobs: true, NumLogprobs: 20}, nil, ""},
		{"logprobs without top entries", 10, SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1, Logprobs: true}, nil, ""},
		{"top entries without logprobs", 10, SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1, NumLogprobs: 2}, ErrSampleParams, "num_logprobs is 2 but logprobs is off"},
		{"empty vocabulary", 0, SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1}, ErrSampleParams, "vocabulary size"},
		{"zero value", 10, SampleRow{}, ErrSampleParams, "temperature"},
		{"edits without scratch", 10, SampleRow{Greedy: true, TopP: 1, RepetitionPenalty: 1,
			Edits: []LogitEdit{{Token: 9, Flags: EditSeen}, {Token: 9, Flags: EditMask}}}, ErrSampleParams, "edits[1]: token id 9 appears twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, seen := range [][]bool{nil, make([]bool, 4), make([]bool, 16)} {
				err := tc.row.Check(tc.vocab, seen)
				if (err == nil) != (tc.is == nil) || !errors.Is(err, tc.is) {
					t.Fatalf("Check = %v, want %v", err, tc.is)
				}
				if err != nil && !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %q does not say %q", err, tc.want)
				}
				for i, s := range seen {
					if s {
						t.Fatalf("seen[%d] left set", i)
					}
				}
			}
		})
	}
}

func TestSampleRowError(t *testing.T) {
	tests := []struct {
		err  SampleRowError
		want string
	}{
		{SampleRowError{Row: 3, Reason: "NaN", Index: 17}, "sample row 3: logit 17 is NaN after its edits"},
		{SampleRowError{Row: 0, Reason: "all -Inf", Index: -1}, "sample row 0: every logit is -Inf"},
	}
	for _, tc := range tests {
		var err error = &tc.err
		if !errors.Is(err, ErrInvalidLogits) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%#v: %q (Is ErrInvalidLogits: %v), want prefix %q", tc.err, err, errors.Is(err, ErrInvalidLogits), tc.want)
		}
	}
	r := SampleRow{RepetitionPenalty: 1}
	if r.Penalized() {
		t.Error("neutral penalties reported active")
	}
	r.PresencePenalty = 0.5
	if !r.Penalized() {
		t.Error("presence penalty not reported active")
	}
}
