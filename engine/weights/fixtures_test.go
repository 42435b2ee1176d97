package weights

import (
	"io/fs"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fixturesDir holds the parity fixtures written by tools/make_fixtures.py.
const fixturesDir = "../../testdata/models"

// fixtureSpec is what each fixture must be.
type fixtureSpec struct {
	name, arch, model_type string
	mtp                    bool
}

var fixtureSpecs = []fixtureSpec{
	{"llama", "LlamaForCausalLM", "llama", false},
	{"mistral", "MistralForCausalLM", "mistral", false},
	{"qwen3", "Qwen3ForCausalLM", "qwen3", false},
	{"deepseek-v2", "DeepseekV2ForCausalLM", "deepseek_v2", false},
	{"deepseek-v3", "DeepseekV3ForCausalLM", "deepseek_v3", true},
}

var (
	fixturePromptLens = []int{1, 7, 23}
	fixtureVariants   = []struct {
		name  string
		dtype DType
	}{{"f32", F32}, {"bf16", BF16}}
)

const (
	fixtureNewTokens = 32
	fixtureMaxBytes  = 2 << 20
)

// TestFixtures opens every parity fixture: both checkpoints parse, hold the
// embedding in the variant's dtype, and the reference file holds every tensor
// the model tests read, with the right shape and sane values.
func TestFixtures(t *testing.T) {
	for _, spec := range fixtureSpecs {
		t.Run(spec.name, func(t *testing.T) {
			dir := filepath.Join(fixturesDir, spec.name)
			checkFixtureSize(t, dir)
			var cfg *Config
			for _, v := range fixtureVariants {
				ck, err := Open(filepath.Join(dir, v.name))
				if err != nil {
					t.Fatal(err)
				}
				c := ck.Config
				if len(c.Architectures) != 1 || c.Architectures[0] != spec.arch || c.ModelType != spec.model_type {
					t.Errorf("%s: architectures %v model_type %q, want [%s] %q", v.name, c.Architectures, c.ModelType, spec.arch, spec.model_type)
				}
				embed, err := ck.Expect("model.embed_tokens.weight", c.VocabSize, c.HiddenSize)
				if err != nil {
					t.Error(err)
				} else if embed.DType != v.dtype {
					t.Errorf("%s: embed_tokens is %s, want %s", v.name, embed.DType, v.dtype)
				}
				if _, err := ck.Expect("model.norm.weight", c.HiddenSize); err != nil {
					t.Error(err)
				}
				if c.TieWordEmbeddings == ck.Has("lm_head.weight") {
					t.Errorf("%s: tie_word_embeddings %v but lm_head.weight present %v", v.name, c.TieWordEmbeddings, ck.Has("lm_head.weight"))
				}
				last := c.NumHiddenLayers - 1
				if !hasPrefix(ck.Names(), "model.layers.0.") || !hasPrefix(ck.Names(), "model.layers."+itoa(last)+".") {
					t.Errorf("%s: no tensors for layers 0 and %d", v.name, last)
				}
				if spec.mtp {
					checkMTPWeights(t, ck)
				} else if hasPrefix(ck.Names(), "model.layers."+itoa(c.NumHiddenLayers)+".") {
					t.Errorf("%s: tensors beyond num_hidden_layers", v.name)
				}
				checkFixtureConfig(t, spec.name, c)
				if cfg == nil {
					cfg = c
				} else if cfg.VocabSize != c.VocabSize || cfg.NumHiddenLayers != c.NumHiddenLayers || cfg.Rope != c.Rope {
					t.Errorf("f32 and bf16 configs differ")
				}
				if err := ck.Close(); err != nil {
					t.Error(err)
				}
			}
			if cfg != nil {
				checkReference(t, filepath.Join(dir, "reference.safetensors"), cfg, spec.mtp)
			}
		})
	}
}

func checkFixtureSize(t *testing.T, dir string) {
	t.Helper()
	total := int64(0)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > fixtureMaxBytes {
		t.Errorf("%s holds %d bytes, over %d", dir, total, fixtureMaxBytes)
	}
}

func checkMTPWeights(t *testing.T, ck *Checkpoint) {
	t.Helper()
	c := ck.Config
	if c.NumNextNPredictLayers != 1 {
		t.Fatalf("num_nextn_predict_layers = %d, want 1", c.NumNextNPredictLayers)
	}
	p := "model.layers." + itoa(c.NumHiddenLayers) + "."
	h, v := c.HiddenSize, c.VocabSize
	shapes := []struct {
		name  string
		shape []int
	}{
		{"enorm.weight", []int{h}},
		{"hnorm.weight", []int{h}},
		{"eh_proj.weight", []int{h, 2 * h}},
		{"shared_head.norm.weight", []int{h}},
		{"shared_head.head.weight", []int{v, h}},
		{"embed_tokens.weight", []int{v, h}},
		{"input_layernorm.weight", []int{h}},
		{"post_attention_layernorm.weight", []int{h}},
		{"self_attn.kv_b_proj.weight", []int{c.NumAttentionHeads * (c.QKNopeHeadDim + c.VHeadDim), c.KVLoraRank}},
		{"mlp.gate.weight", []int{c.NRoutedExperts, h}},
		{"mlp.gate.e_score_correction_bias", []int{c.NRoutedExperts}},
		{"mlp.experts." + itoa(c.NRoutedExperts-1) + ".down_proj.weight", []int{h, c.MoEIntermediateSize}},
		{"mlp.shared_experts.gate_proj.weight", []int{c.NSharedExperts * c.MoEIntermediateSize, h}},
	}
	for _, s := range shapes {
		if _, err := ck.Expect(p+s.name, s.shape...); err != nil {
			t.Error(err)
		}
	}
	bias, err := ck.Tensor(p + "mlp.gate.e_score_correction_bias")
	if err == nil && bias.DType != F32 {
		t.Errorf("e_score_correction_bias is %s, want F32 in every variant", bias.DType)
	}
}

func checkReference(t *testing.T, path string, cfg *Config, mtp bool) {
	t.Helper()
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata()["transformers"] == "" {
		t.Errorf("%s: no transformers version in metadata", path)
	}
	prompts := map[int][]int{}
	for _, v := range fixtureVariants {
		if inv_freq, err := f.Tensor(v.name + ".rope.inv_freq"); err != nil {
			t.Error(err)
		} else if len(inv_freq.Shape) != 1 || inv_freq.DType != F32 {
			t.Errorf("%s: %s is %s %v, want F32 [n]", path, inv_freq.Name, inv_freq.DType, inv_freq.Shape)
		}
		for i, L := range fixturePromptLens {
			pre := v.name + ".prompt." + itoa(i)
			ids := expectInts(t, f, pre+".ids", cfg.VocabSize, L)
			if prev, ok := prompts[i]; ok && !slices.Equal(prev, ids) {
				t.Errorf("%s: prompt %d differs between variants", path, i)
			}
			prompts[i] = ids
			expectLogits(t, f, pre+".logits", L, cfg.VocabSize)
			greedy := expectInts(t, f, v.name+".greedy."+itoa(i)+".ids", cfg.VocabSize, fixtureNewTokens)
			if margin, err := f.Expect(v.name+".greedy."+itoa(i)+".margin", fixtureNewTokens); err != nil {
				t.Error(err)
			} else {
				for _, m := range margin.Float32s() {
					if !(m >= 0) {
						t.Errorf("%s: greedy margin %v", path, m)
						break
					}
				}
			}
			if mtp {
				pre := v.name + ".mtp." + itoa(i)
				mtp_ids := expectInts(t, f, pre+".ids", cfg.VocabSize, L)
				if len(ids) == L && len(mtp_ids) == L && len(greedy) > 0 &&
					(!slices.Equal(mtp_ids[:L-1], ids[1:]) || mtp_ids[L-1] != greedy[0]) {
					t.Errorf("%s: mtp ids %v, want prompt[1:] + greedy[0]", pre, mtp_ids)
				}
				expectLogits(t, f, pre+".logits", L, cfg.VocabSize)
			}
		}
	}
}

func expectInts(t *testing.T, f *File, name string, vocab int, n int) []int {
	t.Helper()
	tensor, err := f.Expect(name, n)
	if err != nil {
		t.Error(err)
		return nil
	}
	if tensor.DType != I32 {
		t.Errorf("%s is %s, want I32", name, tensor.DType)
	}
	ids, err := tensor.Ints()
	if err != nil {
		t.Error(err)
		return nil
	}
	for _, id := range ids {
		if id < 0 || id >= vocab {
			t.Errorf("%s: id %d outside [0, %d)", name, id, vocab)
			break
		}
	}
	return ids
}

func expectLogits(t *testing.T, f *File, name string, rows, vocab int) {
	t.Helper()
	tensor, err := f.Expect(name, rows, vocab)
	if err != nil {
		t.Error(err)
		return
	}
	if tensor.DType != F32 {
		t.Errorf("%s is %s, want F32", name, tensor.DType)
	}
	vals := tensor.Float32s()
	for r := 0; r < rows; r++ {
		row := vals[r*vocab : (r+1)*vocab]
		lo, hi := row[0], row[0]
		for _, x := range row {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Errorf("%s: row %d holds %v", name, r, x)
				return
			}
			lo, hi = min(lo, x), max(hi, x)
		}
		if hi-lo < 0.1 {
			t.Errorf("%s: row %d is flat (range %v)", name, r, hi-lo)
		}
	}
}

func hasPrefix(names []string, prefix string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, prefix) })
}

func itoa(i int) string { return strconv.Itoa(i) }

// checkFixtureConfig checks the settings each fixture was made to exercise,
// as parsed from the config.json that transformers 5 wrote (rope_parameters).
func checkFixtureConfig(t *testing.T, name string, c *Config) {
	t.Helper()
	type check struct {
		what      string
		got, want any
	}
	var checks []check
	switch name {
	case "llama":
		checks = []check{
			{"rope", c.Rope, Rope{Type: "llama3", Theta: 500000, Factor: 8, OriginalMaxPositionEmbeddings: 8192,
				LowFreqFactor: 1, HighFreqFactor: 4, BetaFast: 32, BetaSlow: 1, Truncate: true, PartialRotaryFactor: 1}},
			{"attention_bias", c.AttentionBias, true},
			{"eos", c.EOSTokenIDs, []int{2, 3}},
			{"kv heads", c.NumKeyValueHeads, 2},
		}
	case "mistral":
		checks = []check{
			{"rope type", c.Rope.Type, "linear"},
			{"rope factor", c.Rope.Factor, 2.0},
			{"rope theta", c.Rope.Theta, 1e6},
			{"sliding_window", c.SlidingWindow, 4096},
		}
	case "qwen3":
		checks = []check{
			{"rope type", c.Rope.Type, "default"},
			{"tie", c.TieWordEmbeddings, true},
			{"head_dim", c.HeadDim, 32},
			{"sliding_window", c.SlidingWindow, 0},
		}
	case "deepseek-v2":
		checks = []check{
			{"rope", c.Rope, Rope{Type: "yarn", Theta: 10000, Factor: 40, OriginalMaxPositionEmbeddings: 4096,
				BetaFast: 32, BetaSlow: 1, Mscale: 1, MscaleAllDim: 0.707, Truncate: true, PartialRotaryFactor: 1}},
			{"q_lora_rank", c.QLoraRank, 0},
			{"dims", []int{c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim, c.KVLoraRank}, []int{16, 8, 12, 32}},
			{"routing", []any{c.TopKMethod, c.ScoringFunc, c.NGroup, c.TopKGroup, c.NumExpertsPerTok, c.RoutedScalingFactor},
				[]any{"group_limited_greedy", "softmax", 4, 2, 2, 2.0}},
			{"moe layers", []bool{c.IsMoELayer(0), c.IsMoELayer(1)}, []bool{false, true}},
		}
	case "deepseek-v3":
		checks = []check{
			{"rope mscale", []float64{c.Rope.Mscale, c.Rope.MscaleAllDim, c.Rope.Factor}, []float64{1, 1, 40}},
			{"q_lora_rank", c.QLoraRank, 24},
			{"routing", []any{c.TopKMethod, c.ScoringFunc, c.NGroup, c.TopKGroup, c.NormTopKProb, c.RoutedScalingFactor},
				[]any{"noaux_tc", "sigmoid", 4, 2, true, 2.5}},
			{"rope_interleave", c.RopeInterleave, true},
			{"shared experts", c.NSharedExperts, 1},
		}
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s: %s = %v, want %v", name, ch.what, ch.got, ch.want)
		}
	}
}
