package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Environment variables that tune the backends of this package's tests and
// benchmarks, so that tools/gpu/check.sh can run one test binary under
// several settings (its ab phase's AB_ENVS, its profile phase). Production
// code reads none of them: optionsFromTestEnv turns them into Options, the
// one way the switches reach a backend.
const (
	profileEnv = "DEEPINFER_CUDA_PROFILE" // 1: the per-operation device profile (OpProfile)
	skipEnv    = "DEEPINFER_CUDA_SKIP"    // op,op,...: operations not queued (results are wrong)
)

// testEnvVar maps one variable onto Options; set is called with a non-empty
// value and leaves a field the caller already set alone.
type testEnvVar struct {
	name string
	set  func(o *Options, v string) error
}

// testEnv lists every variable optionsFromTestEnv reads. Integers keep the
// library's former reading: 0 means off where off is not the default
// (a negative option value), otherwise the value itself.
var testEnv = []testEnvVar{
	{"DEEPINFER_CUDA_GEMM", func(o *Options, v string) error {
		switch v {
		case "round":
		case "split":
			if o.GEMM == GEMMRound {
				o.GEMM = GEMMSplit
			}
		default:
			return fmt.Errorf("want round or split")
		}
		return nil
	}},
	{"DEEPINFER_CUDA_DEC_CHUNK", intEnv(func(o *Options) *int { return &o.DecodeChunk }, 0)},
	{"DEEPINFER_CUDA_SKINNY", intEnv(func(o *Options) *int { return &o.SkinnyRows }, 0)},
	{"DEEPINFER_CUDA_GEMV", intEnv(func(o *Options) *int { return &o.GEMVRows }, -1)},
	{"DEEPINFER_CUDA_GEMV_MAX", func(o *Options, v string) error { // Mi elements
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<40 {
			return fmt.Errorf("want a count of Mi elements")
		}
		if o.GEMVMaxElems == 0 {
			o.GEMVMaxElems = n << 20
			if n == 0 {
				o.GEMVMaxElems = -1
			}
		}
		return nil
	}},
	{"DEEPINFER_CUDA_GEMV_WIDE", offEnv(func(o *Options) *bool { return &o.DisableGEMVWide })},
	{"DEEPINFER_CUDA_PDL", offEnv(func(o *Options) *bool { return &o.DisablePDL })},
	{"DEEPINFER_CUDA_MLA_PREPARE", offEnv(func(o *Options) *bool { return &o.DisableFusedMLAPrepare })},
	{"DEEPINFER_CUDA_MOE_ADD", offEnv(func(o *Options) *bool { return &o.DisableMoEAdd })},
	{"DEEPINFER_CUDA_MOE_ROUTE", offEnv(func(o *Options) *bool { return &o.DisableFusedRoute })},
	{"DEEPINFER_CUDA_MOE_X16", offEnv(func(o *Options) *bool { return &o.DisableMoERoundedInput })},
	{"DEEPINFER_CUDA_EMBED_NORM", offEnv(func(o *Options) *bool { return &o.DisableEmbedNorm })},
	{"DEEPINFER_CUDA_GATED_GEMV", offEnv(func(o *Options) *bool { return &o.DisableGatedGEMV })},
	{"DEEPINFER_CUDA_PREFILL_GQA", offEnv(func(o *Options) *bool { return &o.DisablePrefillGQA })},
	{"DEEPINFER_CUDA_DEC_KM", offEnv(func(o *Options) *bool { return &o.DisableDecodeKM })},
	{"DEEPINFER_CUDA_DEC_STAGES", intEnv(func(o *Options) *int { return &o.DecodeStages }, 0)},
	{"DEEPINFER_CUDA_DEC_F8_STAGES", intEnv(func(o *Options) *int { return &o.DecodeF8Stages }, 0)},
	{"DEEPINFER_CUDA_DEC_F8_DIRECT", intEnv(func(o *Options) *int { return &o.DecodeF8Direct }, -1)},
	{"DEEPINFER_CUDA_DEC_CPB", intEnv(func(o *Options) *int { return &o.DecodeChunksPerBlock }, 0)},
	{"DEEPINFER_CUDA_DEC_BPS", intEnv(func(o *Options) *int { return &o.DecodeBlocksPerSM }, 0)},
	{"DEEPINFER_CUDA_DEC_KM_CPB", offEnv(func(o *Options) *bool { return &o.DecodeKMBlockPerChunk })}, // 0: a block a chunk
	{"DEEPINFER_CUDA_MLA_STAGED_MAX", intEnv(func(o *Options) *int { return &o.MLAStagedMax }, -1)},
	{"DEEPINFER_CUDA_MLA_PREFILL", offEnv(func(o *Options) *bool { return &o.DisableMLAPrefill })},
	{"DEEPINFER_CUDA_MLA_HINT", offEnv(func(o *Options) *bool { return &o.DisableMLAPrefillHint })},
	{"DEEPINFER_CUDA_MOE_MMA", offEnv(func(o *Options) *bool { return &o.DisableMoEMMA })},
	{"DEEPINFER_CUDA_MOE_GEMM", intEnv(func(o *Options) *int { return &o.MoEGEMMPairs }, -1)},
	{"DEEPINFER_CUDA_FP8_LT", offEnv(func(o *Options) *bool { return &o.DisableFP8LT })},
	{"DEEPINFER_CUDA_MOE_WGMMA", offEnv(func(o *Options) *bool { return &o.DisableMoEWGMMA })},
	{"DEEPINFER_CUDA_MLA_PREFILL_WGMMA", offEnv(func(o *Options) *bool { return &o.DisableMLAPrefillWGMMA })},
	{"DEEPINFER_CUDA_GEMM_PLANS", func(o *Options, v string) error {
		if v != "0" && v != "1" {
			return fmt.Errorf("want 0 (off, the default) or 1")
		}
		o.GEMMPlans = o.GEMMPlans || v == "1"
		return nil
	}},
	{"DEEPINFER_CUDA_ATTN_OUT16", offEnv(func(o *Options) *bool { return &o.DisableAttnOut16 })},
	{"DEEPINFER_CUDA_SAMPLE_SPLIT", intEnv(func(o *Options) *int { return &o.SampleSplitRows }, -1)},
	{"DEEPINFER_CUDA_SAMPLE_MIN_CHUNKS", intEnv(func(o *Options) *int { return &o.SampleMinChunks }, 0)},
	{"DEEPINFER_CUDA_NORM_NARROW", offEnv(func(o *Options) *bool { return &o.DisableNormNarrow })},
	{"DEEPINFER_CUDA_MLP_NARROW", intEnv(func(o *Options) *int { return &o.MLPNarrowRows }, -1)},
	{profileEnv, func(o *Options, v string) error {
		if v != "0" && v != "1" {
			return fmt.Errorf("want 0 or 1")
		}
		o.profile = o.profile || v == "1"
		return nil
	}},
	{skipEnv, func(o *Options, v string) error {
		if o.skip == nil {
			for op := range strings.SplitSeq(v, ",") {
				o.skip = append(o.skip, strings.TrimSpace(op))
			}
		}
		return nil
	}},
}

// intEnv sets an int field that is still zero to a non-negative value,
// with 0 read as zero (the field's value for "off").
func intEnv(field func(*Options) *int, zero int) func(*Options, string) error {
	return func(o *Options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a count (0 or more)")
		}
		if f := field(o); *f == 0 {
			*f = n
			if n == 0 {
				*f = zero
			}
		}
		return nil
	}
}

// offEnv sets a Disable field from 0 (off, the field true) or 1 (the
// default).
func offEnv(field func(*Options) *bool) func(*Options, string) error {
	return func(o *Options, v string) error {
		switch v {
		case "0":
			*field(o) = true
		case "1":
		default:
			return fmt.Errorf("want 0 (off) or 1 (on, the default)")
		}
		return nil
	}
}

// optionsFromTestEnv returns base with the switches of the variables in
// testEnv that are set and not empty, where base leaves the field at its
// zero value (a test's own choice wins). The values are checked by New
// (Options.Validate); a value that is not a number, or a bad name in
// skipEnv, is an error naming the variable.
func optionsFromTestEnv(base Options) (Options, error) {
	o, set := base, false
	for _, e := range testEnv {
		v := os.Getenv(e.name)
		if v == "" {
			continue
		}
		if err := e.set(&o, v); err != nil {
			return base, fmt.Errorf("%s=%q: %w", e.name, v, err)
		}
		set = true
	}
	if set {
		if err := o.Validate(); err != nil {
			return base, fmt.Errorf("the DEEPINFER_CUDA_* test variables: %w", err)
		}
	}
	return o, nil
}
