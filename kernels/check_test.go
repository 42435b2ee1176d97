package kernels

import (
	"errors"
	"strings"
	"testing"
)

type fakeTensor struct {
	shape []int
	dtype DType
}

func (f fakeTensor) Shape() []int { return f.shape }
func (f fakeTensor) DType() DType { return f.dtype }

func TestCheckShape(t *testing.T) {
	x := fakeTensor{shape: []int{3, 4}, dtype: BF16}
	tests := []struct {
		want   []int
		dtypes []DType
		is     error
	}{
		{[]int{3, 4}, nil, nil},
		{[]int{-1, 4}, FloatTypes, nil},
		{[]int{3, 5}, nil, ErrShape},
		{[]int{3}, nil, ErrShape},
		{[]int{3, 4}, []DType{F32}, ErrDType},
	}
	for _, tc := range tests {
		err := CheckShape("cpu", "linear", "w", x, tc.want, tc.dtypes...)
		if !errors.Is(err, tc.is) || (err == nil) != (tc.is == nil) {
			t.Errorf("CheckShape(%v, %v) = %v, want %v", tc.want, tc.dtypes, err, tc.is)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "cpu: linear: w is ") {
			t.Errorf("error %q does not name the backend, op and argument", err)
		}
	}
}

func TestRouteParamsValidate(t *testing.T) {
	ok := RouteParams{TopK: 2, Scoring: ScoringSigmoid, Method: TopKNoAuxTC, NumGroups: 4, TopKGroups: 2}
	tests := []struct {
		name string
		edit func(*RouteParams)
		want string
	}{
		{"valid", func(*RouteParams) {}, ""},
		{"top_k", func(p *RouteParams) { p.TopK = 0 }, "top_k out of range"},
		{"scoring", func(p *RouteParams) { p.Scoring = 0 }, "unknown scoring"},
		{"method", func(p *RouteParams) { p.Method = 0 }, "unknown top-k method"},
		{"groups", func(p *RouteParams) { p.NumGroups = 3 }, "n_group must divide"},
		{"kept groups", func(p *RouteParams) { p.TopKGroups = 5 }, "topk_group out of range"},
		{"too few kept", func(p *RouteParams) { p.TopK, p.TopKGroups = 5, 1 }, "top_k exceeds"},
		{"noaux group size", func(p *RouteParams) { p.NumGroups, p.TopKGroups, p.TopK = 8, 2, 2 }, "at least 2 experts per group"},
	}
	for _, tc := range tests {
		p := ok
		tc.edit(&p)
		err := p.Validate(8)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

type ownTensor struct{ fakeTensor }

func TestAsAndOpt(t *testing.T) {
	own := &ownTensor{fakeTensor{shape: []int{1}, dtype: F32}}
	if got, err := As[*ownTensor]("cpu", "add", "a", own); err != nil || got != own {
		t.Errorf("As(own) = %v, %v", got, err)
	}
	for _, bad := range []Tensor{nil, fakeTensor{}, (*ownTensor)(nil)} {
		if _, err := As[*ownTensor]("cpu", "add", "a", bad); !errors.Is(err, ErrForeignTensor) || !strings.HasPrefix(err.Error(), "cpu: add: a is ") {
			t.Errorf("As(%T) = %v", bad, err)
		}
	}
	for _, none := range []Tensor{nil, (*ownTensor)(nil)} {
		if got, err := Opt[*ownTensor]("cpu", "linear", "bias", none); err != nil || got != nil {
			t.Errorf("Opt(%T) = %v, %v", none, got, err)
		}
	}
	if _, err := Opt[*ownTensor]("cpu", "linear", "bias", fakeTensor{}); !errors.Is(err, ErrForeignTensor) {
		t.Errorf("Opt(foreign) = %v", err)
	}
}

func TestOpShapes(t *testing.T) {
	ten := func(d DType, shape ...int) *ownTensor { return &ownTensor{fakeTensor{shape: shape, dtype: d}} }
	var noBias *ownTensor
	if m, n, k, err := LinearShapes("cpu", ten(F32, 3, 5), ten(F32, 3, 4), ten(BF16, 5, 4), noBias); err != nil || m != 3 || n != 5 || k != 4 {
		t.Errorf("LinearShapes = %d %d %d %v", m, n, k, err)
	}
	if _, _, _, err := LinearShapes("cpu", ten(F32, 3, 5), ten(F32, 3, 4), ten(BF16, 5, 4), ten(F32, 4)); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "bias") {
		t.Errorf("wrong bias: %v", err)
	}
	if _, _, err := NormShapes("cuda", "rms_norm", ten(F32, 2, 8), ten(F32, 2, 8), ten(BF16, 8)); !errors.Is(err, ErrDType) {
		t.Errorf("BF16 norm weight: %v", err)
	}
	p := RouteParams{TopK: 2, Scoring: ScoringSoftmax, Method: TopKGreedy}
	if tk, e, err := RouteShapes("cpu", ten(I32, 3, 2), ten(F32, 3, 2), ten(F32, 3, 8), nil, p); err != nil || tk != 3 || e != 8 {
		t.Errorf("RouteShapes = %d %d %v", tk, e, err)
	}
	if _, _, err := RouteShapes("cpu", ten(I32, 3, 2), ten(F32, 3, 2), ten(F32, 3, 8), ten(F32, 7), p); !errors.Is(err, ErrShape) {
		t.Errorf("wrong route bias: %v", err)
	}
	mp := MLAParams{NumHeads: 2, NopeDim: 4, RopeDim: 2, KVLoraRank: 8, VHeadDim: 3}
	if tk, err := MLAShapes("cpu", ten(F32, 5, 6), ten(F32, 5, 12), ten(F32, 4, 16, 10), ten(BF16, 14, 8), mp); err != nil || tk != 5 {
		t.Errorf("MLAShapes = %d %v", tk, err)
	}
	if _, err := MLAShapes("cpu", ten(F32, 5, 6), ten(F32, 5, 12), ten(F32, 4, 16, 10), ten(BF16, 14, 8), MLAParams{}); !errors.Is(err, ErrShape) {
		t.Errorf("zero MLA params: %v", err)
	}
}

func TestEmbeddingAndMoEShapes(t *testing.T) {
	ten := func(d DType, shape ...int) *ownTensor { return &ownTensor{fakeTensor{shape: shape, dtype: d}} }
	if v, h, n, err := EmbeddingShapes("cpu", ten(F32, 3, 8), ten(BF16, 100, 8), ten(I32, 3)); err != nil || v != 100 || h != 8 || n != 3 {
		t.Errorf("EmbeddingShapes = %d %d %d %v", v, h, n, err)
	}
	if _, _, _, err := EmbeddingShapes("cpu", ten(F32, 3, 8), ten(BF16, 100, 8), ten(F32, 3)); !errors.Is(err, ErrDType) {
		t.Errorf("F32 ids: %v", err)
	}
	d, err := MoEShapes("cpu", ten(F32, 2, 8), ten(F32, 2, 8), ten(I32, 2, 3), ten(F32, 2, 3), ten(BF16, 4, 10, 8), ten(BF16, 4, 8, 5))
	if err != nil || d != (MoEDims{T: 2, Hidden: 8, NumExperts: 4, Inter: 5, TopK: 3}) {
		t.Errorf("MoEShapes = %+v %v", d, err)
	}
	if _, err := MoEShapes("cpu", ten(F32, 2, 8), ten(F32, 2, 8), ten(I32, 2, 3), ten(F32, 2, 3), ten(BF16, 4, 9, 8), ten(BF16, 4, 8, 4)); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "odd row count") {
		t.Errorf("odd gate_up: %v", err)
	}
}
