package engine

import (
	"fmt"
	"math"
	"testing"
)

var (
	llama2_7B = ModelShape{NumLayers: 32, Hidden: 4096, NumHeads: 32, NumKVHeads: 32, HeadDim: 128,
		Intermediate: 11008, Vocab: 32000}
	qwen3_0_6B = ModelShape{NumLayers: 28, Hidden: 1024, NumHeads: 16, NumKVHeads: 8, HeadDim: 128,
		Intermediate: 3072, Vocab: 151936, TieWordEmbeddings: true}
	deepseekV3 = ModelShape{NumLayers: 61, Hidden: 7168, NumHeads: 128, Intermediate: 18432, Vocab: 129280,
		NumExperts: 256, NumExpertsPerTok: 8, NumSharedExperts: 1, MoEIntermediate: 2048, NumDenseLayers: 3,
		QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128}
)

// TestFlopsParamCounts checks the parameter counts against the published
// sizes (norms and MTP layers excluded, hence the tolerance).
func TestFlopsParamCounts(t *testing.T) {
	cases := []struct {
		name          string
		shape         ModelShape
		total, active float64
	}{
		{"llama-2-7b", llama2_7B, 6.74e9, 6.61e9}, // active: no embedding
		{"qwen3-0.6b", qwen3_0_6B, 0.596e9, 0.596e9},
		{"deepseek-v3", deepseekV3, 671e9, 37e9},
	}
	for _, c := range cases {
		e, err := NewFlopsEstimator(c.shape)
		if err != nil {
			t.Fatal(err)
		}
		if rel := math.Abs(e.TotalParams()-c.total) / c.total; rel > 0.02 {
			t.Errorf("%s: total %.4g, want %.4g", c.name, e.TotalParams(), c.total)
		}
		if rel := math.Abs(e.ActiveParams()-c.active) / c.active; rel > 0.03 {
			t.Errorf("%s: active %.4g, want %.4g", c.name, e.ActiveParams(), c.active)
		}
	}
}

func TestFlopsAttentionPairs(t *testing.T) {
	shape := ModelShape{NumLayers: 2, Hidden: 8, NumHeads: 2, NumKVHeads: 1, HeadDim: 4, Intermediate: 16, Vocab: 10}
	e, err := NewFlopsEstimator(shape)
	if err != nil {
		t.Fatal(err)
	}
	perPair := 2.0 * 2 * (4 + 4) * 2 // 2 * heads * (qk + v) * layers
	cases := []struct {
		name  string
		q, k  int
		pairs float64
	}{
		{"first decode", 1, 1, 1},
		{"decode at 9", 1, 10, 10},
		{"prefill of 4", 4, 4, 10},
		{"chunk of 2 after 3", 2, 5, 9},
	}
	for _, c := range cases {
		got := e.Sequence(c.q, c.k, 0)
		if got.AttentionFLOPs != perPair*c.pairs {
			t.Errorf("%s: attention %v, want %v", c.name, got.AttentionFLOPs, perPair*c.pairs)
		}
		// 2 * params per token: attention 8*8 + 2*8*4 + 8*8 = 192, MLP 3*8*16 = 384, per layer.
		if want := 2 * 2 * (192 + 384) * float64(c.q); got.LinearFLOPs != want {
			t.Errorf("%s: linear %v, want %v", c.name, got.LinearFLOPs, want)
		}
		if want := 2 * 1 * 4 * 2 * 2 * float64(c.k+c.q); got.KVBytes != want { // K+V, 1 head of 4, 2 bytes, 2 layers
			t.Errorf("%s: kv bytes %v, want %v", c.name, got.KVBytes, want)
		}
	}
	if got := e.Sequence(1, 1, 3).LMHeadFLOPs; got != 2*8*10*3 {
		t.Errorf("lm head of 3 rows: %v", got)
	}
}

func TestFlopsEstimateStep(t *testing.T) {
	e, err := NewFlopsEstimator(llama2_7B)
	if err != nil {
		t.Fatal(err)
	}
	metas := []SequenceMetadata{
		{SeqlenQ: 1, SeqlenK: 100, Sample: true, PromptLogprobsFrom: -1, PromptLogprobsTo: -1},
		{SeqlenQ: 16, SeqlenK: 16, Sample: false, PromptLogprobsFrom: 0, PromptLogprobsTo: 16},
	}
	c := e.Estimate(metas)
	a, b := e.Sequence(1, 100, 1), e.Sequence(16, 16, 16)
	if c.LinearFLOPs != a.LinearFLOPs+b.LinearFLOPs || c.AttentionFLOPs != a.AttentionFLOPs+b.AttentionFLOPs ||
		c.LMHeadFLOPs != a.LMHeadFLOPs+b.LMHeadFLOPs || c.KVBytes != a.KVBytes+b.KVBytes {
		t.Fatalf("step %+v is not the sum of %+v and %+v", c, a, b)
	}
	// A dense model reads every weight once per step, whatever the batch.
	if c.WeightBytes != e.WeightBytes(1) || c.WeightBytes != 2*(e.TotalParams()-float64(4096*32000)) {
		t.Fatalf("weight bytes %v, one token %v, params %v", c.WeightBytes, e.WeightBytes(1), e.TotalParams())
	}
	if mfu := c.MFU(0.01, c.FLOPs()/0.01/0.5); math.Abs(mfu-0.5) > 1e-12 {
		t.Fatalf("MFU %v, want 0.5", mfu)
	}
	if bw := c.BandwidthUtil(0.5, 2*c.Bytes()); math.Abs(bw-1) > 1e-12 {
		t.Fatalf("bandwidth use %v, want 1", bw)
	}
	if c.MFU(0, 1) != 0 || c.BandwidthUtil(1, 0) != 0 {
		t.Fatal("zero time or peak should give 0")
	}
}

func TestFlopsMoEWeightBytes(t *testing.T) {
	e, err := NewFlopsEstimator(deepseekV3)
	if err != nil {
		t.Fatal(err)
	}
	one, many := e.WeightBytes(1), e.WeightBytes(100000)
	// One token reads about the active weights; a big batch, nearly all.
	if rel := math.Abs(one/2-e.ActiveParams()) / e.ActiveParams(); rel > 0.05 {
		t.Errorf("one token reads %.4g params, active %.4g", one/2, e.ActiveParams())
	}
	if rel := math.Abs(many/2-(e.TotalParams()-e.embedParams)) / e.TotalParams(); rel > 0.01 {
		t.Errorf("big batch reads %.4g params, total %.4g", many/2, e.TotalParams())
	}
	if e.WeightBytes(64) <= one || e.WeightBytes(64) >= many || e.WeightBytes(0) != 0 {
		t.Error("weight bytes not increasing with the batch")
	}
}

func TestFlopsShapeErrors(t *testing.T) {
	cases := []ModelShape{
		{},
		{NumLayers: 1, Hidden: 8, NumHeads: 2, Vocab: 10},                // no head_dim
		{NumLayers: 1, Hidden: 8, NumHeads: 2, Vocab: 10, KVLoraRank: 4}, // MLA without dims
		{NumLayers: 1, Hidden: 8, NumHeads: 2, NumKVHeads: 1, HeadDim: 4, Vocab: 10, // top-k above experts
			NumExperts: 2, NumExpertsPerTok: 3, MoEIntermediate: 4},
		{NumLayers: 1, Hidden: 8, NumHeads: 2, NumKVHeads: 1, HeadDim: 4, Vocab: 10, NumDenseLayers: 2},
	}
	for i, s := range cases {
		if _, err := NewFlopsEstimator(s); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
}

func ExampleFlopsEstimator() {
	e, _ := NewFlopsEstimator(ModelShape{NumLayers: 32, Hidden: 4096, NumHeads: 32, NumKVHeads: 32,
		HeadDim: 128, Intermediate: 11008, Vocab: 32000}) // Llama-2-7B, bf16
	// 64 sequences decoding with 1000 tokens of context each.
	metas := make([]SequenceMetadata, 64)
	for i := range metas {
		metas[i] = SequenceMetadata{SeqlenQ: 1, SeqlenK: 1000, Sample: true, PromptLogprobsFrom: -1, PromptLogprobsTo: -1}
	}
	c := e.Estimate(metas)
	fmt.Printf("%.0f GFLOP, %.1f GB weights, %.1f GB KV\n", c.FLOPs()/1e9, c.WeightBytes/1e9, c.KVBytes/1e9)
	// Output: 879 GFLOP, 13.2 GB weights, 33.6 GB KV
}
