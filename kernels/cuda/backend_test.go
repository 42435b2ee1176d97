package cuda

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// These tests need no GPU: they check how New reports libraries it cannot
// use, with stand-ins compiled from testdata/fake_lib.c by the C compiler
// that cgo uses.

func cc(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	c := strings.Fields(string(out))
	if len(c) == 0 {
		t.Fatal("go env CC is empty")
	}
	return c[0]
}

// fakeLib compiles testdata/fake_lib.c in the given mode into a shared library.
func fakeLib(t *testing.T, mode int) string {
	t.Helper()
	so := filepath.Join(t.TempDir(), "libfake.so")
	args := []string{"-shared", "-fPIC", "-o", so, "-I", "../../csrc", "-DFAKE_MODE=" + string(rune('0'+mode)), "testdata/fake_lib.c"}
	if out, err := exec.Command(cc(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("compile fake library: %v\n%s", err, out)
	}
	return so
}

func TestNewReportsUnusableLibraries(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	notLib := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	if err := os.WriteFile(notLib, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		lib     func(t *testing.T) string
		want    error
		message []string // substrings the error must contain
	}{
		{"missing file", func(*testing.T) string { return missing }, ErrNoLibrary,
			[]string{missing, "csrc/build.sh", LibraryEnv, "device: cpu"}},
		{"not a shared object", func(*testing.T) string { return notLib }, ErrNoLibrary,
			[]string{notLib, "csrc/build.sh"}},
		{"no entry point", func(t *testing.T) string { return fakeLib(t, 3) }, ErrNoLibrary,
			[]string{"not a DeepInfer CUDA library", "di_get_api"}},
		{"other ABI version", func(t *testing.T) string { return fakeLib(t, 1) }, ErrABIMismatch,
			[]string{"ABI version 999", "rebuild"}},
		{"no device", func(t *testing.T) string { return fakeLib(t, 2) }, ErrNoDevice,
			[]string{"no CUDA-capable device", "nvidia-smi", "device: cpu"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{Library: tc.lib(t)})
			if err == nil {
				b.Close()
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %q does not wrap %v", err, tc.want)
			}
			for _, s := range tc.message {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// Options out of range are refused before the library is opened, with an
// error that names the field and wraps ErrUnsupported; zero options and
// every documented non-zero form pass.
func TestOptionsValidate(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libdeepinfer_cuda.so")
	for _, tc := range []struct {
		opts  Options
		field string // "" for valid options
	}{
		{Options{}, ""},
		{Options{GEMM: GEMMSplit, KVCacheDType: kernels.F8E4M3, DecodeChunk: 512, SkinnyRows: 64, GEMVRows: -1,
			GEMVMaxElems: -1, DecodeStages: 3, DecodeF8Stages: 4, DecodeF8Direct: -1, DecodeChunksPerBlock: 3,
			DecodeBlocksPerSM: 8, MLAStagedMax: -1, SampleSplitRows: -1, SampleMinChunks: 2, MLPNarrowRows: -1,
			DisablePDL: true, skip: []string{"attention", "silu_mul"}, profile: true}, ""},
		{Options{GEMVRows: MaxGEMVRows, DecodeF8Direct: 2}, ""},
		{Options{Device: -1}, "Device"},
		{Options{GEMM: 2}, "GEMM"},
		{Options{KVCacheDType: kernels.BF16}, "KVCacheDType"},
		{Options{DecodeChunk: -128}, "DecodeChunk = -128"},
		{Options{DecodeChunk: 64}, "DecodeChunk = 64"},
		{Options{DecodeChunk: 300}, "DecodeChunk = 300"},
		{Options{SkinnyRows: 65}, "SkinnyRows"},
		{Options{SkinnyRows: -1}, "SkinnyRows"},
		{Options{GEMVRows: MaxGEMVRows + 1}, "GEMVRows"},
		{Options{DecodeStages: 4}, "DecodeStages"},
		{Options{DecodeF8Stages: 1}, "DecodeF8Stages"},
		{Options{DecodeF8Direct: 5}, "DecodeF8Direct"},
		{Options{DecodeChunksPerBlock: -1}, "DecodeChunksPerBlock"},
		{Options{DecodeBlocksPerSM: -2}, "DecodeBlocksPerSM"},
		{Options{SampleMinChunks: -1}, "SampleMinChunks"},
		{Options{skip: []string{"attention", "gemv"}}, `skip "gemv": not an operation`},
	} {
		err := tc.opts.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%+v: %v, want valid", tc.opts, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Validate() = %v, want an error naming it, wrapping ErrUnsupported", tc.field, err)
			continue
		}
		tc.opts.Library = missing
		if b, err := New(tc.opts); err == nil || errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), tc.field) {
			if b != nil {
				b.Close()
			}
			t.Errorf("%s: New() = %v, want the option refused before the library is opened", tc.field, err)
		}
	}
}

// The library's half of Options: zero options are a zeroed di_options (the
// library's defaults) with its size; every switch reaches its field, and
// values are clamped to [-1, 2^30].
func TestCOptions(t *testing.T) {
	z := Options{}.cOptions()
	if z.size == 0 {
		t.Error("zero options: size not set")
	}
	z.size = 0
	if !reflect.ValueOf(z).IsZero() {
		t.Errorf("zero options: %+v, want all zero", z)
	}
	o := Options{GEMM: GEMMSplit, DecodeChunk: 512, SkinnyRows: 64, GEMVRows: -7, GEMVMaxElems: 1 << 33,
		DisablePDL: true, DisableGEMVWide: true, DisablePrefillGQA: true, DisableDecodeKM: true, DecodeStages: 3,
		DecodeF8Stages: 4, DecodeF8Direct: -3, DecodeChunksPerBlock: 1 << 40, DecodeBlocksPerSM: 8,
		DecodeKMBlockPerChunk: true, MLAStagedMax: -1, DisableMoEMMA: true, DisableAttnOut16: true,
		SampleSplitRows: 300, SampleMinChunks: 2, MoEGEMMPairs: -5}.cOptions()
	for name, got := range map[string][2]int64{
		"gemm_mode":                 {int64(o.gemm_mode), 1},
		"decode_chunk":              {int64(o.decode_chunk), 512},
		"skinny_rows":               {int64(o.skinny_rows), 64},
		"gemv_rows":                 {int64(o.gemv_rows), -1},
		"gemv_max_elems":            {int64(o.gemv_max_elems), 1 << 33},
		"disable_pdl":               {int64(o.disable_pdl), 1},
		"disable_gemv_wide":         {int64(o.disable_gemv_wide), 1},
		"disable_prefill_gqa":       {int64(o.disable_prefill_gqa), 1},
		"disable_decode_km":         {int64(o.disable_decode_km), 1},
		"decode_stages":             {int64(o.decode_stages), 3},
		"decode_f8_stages":          {int64(o.decode_f8_stages), 4},
		"decode_f8_direct":          {int64(o.decode_f8_direct), -1},
		"decode_chunks_per_block":   {int64(o.decode_chunks_per_block), 1 << 30},
		"decode_blocks_per_sm":      {int64(o.decode_blocks_per_sm), 8},
		"decode_km_block_per_chunk": {int64(o.decode_km_block_per_chunk), 1},
		"mla_staged_max":            {int64(o.mla_staged_max), -1},
		"disable_moe_mma":           {int64(o.disable_moe_mma), 1},
		"disable_attn_out16":        {int64(o.disable_attn_out16), 1},
		"sample_split_rows":         {int64(o.sample_split_rows), 300},
		"sample_min_chunks":         {int64(o.sample_min_chunks), 2},
		"moe_gemm_pairs":            {int64(o.moe_gemm_pairs), -1},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %d, want %d", name, got[0], got[1])
		}
	}
}

func TestLibraryCandidates(t *testing.T) {
	t.Setenv(LibraryEnv, "")
	got := candidates("")
	if len(got) < 1 || got[len(got)-1] != LibraryName {
		t.Errorf("candidates without a path end in %v, want the bare %s for the loader's search", got, LibraryName)
	}
	t.Setenv(LibraryEnv, "/x/lib.so")
	if got := candidates(""); len(got) != 1 || got[0] != "/x/lib.so" {
		t.Errorf("with %s set: %v", LibraryEnv, got)
	}
	if got := candidates("/y/lib.so"); len(got) != 1 || got[0] != "/y/lib.so" {
		t.Errorf("explicit path: %v", got)
	}
}

func TestGEMMModeString(t *testing.T) {
	for m, want := range map[GEMMMode]string{GEMMRound: "round", GEMMSplit: "split", 7: "GEMMMode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", int(m), got, want)
		}
	}
}

// The test environment's variables (optionsFromTestEnv) map onto Options
// as the library used to read them, fill only the fields a test left at
// zero, and name the variable of a bad value.
func TestOptionsFromTestEnv(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		base    Options
		want    Options
		wantErr string
	}{
		{env: nil, want: Options{}},
		{env: map[string]string{"DEEPINFER_CUDA_GEMM": "split", "DEEPINFER_CUDA_DEC_CHUNK": "512",
			"DEEPINFER_CUDA_SKINNY": "64", "DEEPINFER_CUDA_GEMV": "0", "DEEPINFER_CUDA_GEMV_MAX": "1024",
			"DEEPINFER_CUDA_PDL": "0", "DEEPINFER_CUDA_GEMV_WIDE": "0", "DEEPINFER_CUDA_PREFILL_GQA": "0",
			"DEEPINFER_CUDA_DEC_KM": "0", "DEEPINFER_CUDA_DEC_STAGES": "3", "DEEPINFER_CUDA_DEC_F8_STAGES": "4",
			"DEEPINFER_CUDA_DEC_F8_DIRECT": "0", "DEEPINFER_CUDA_DEC_CPB": "2", "DEEPINFER_CUDA_DEC_BPS": "8",
			"DEEPINFER_CUDA_DEC_KM_CPB": "0", "DEEPINFER_CUDA_MLA_STAGED_MAX": "0", "DEEPINFER_CUDA_MOE_MMA": "0",
			"DEEPINFER_CUDA_ATTN_OUT16": "0", "DEEPINFER_CUDA_SAMPLE_SPLIT": "0",
			"DEEPINFER_CUDA_SAMPLE_MIN_CHUNKS": "6", "DEEPINFER_CUDA_NORM_NARROW": "0", "DEEPINFER_CUDA_MOE_GEMM": "0",
			"DEEPINFER_CUDA_MLP_NARROW": "0", "DEEPINFER_CUDA_FP8_LT": "0", profileEnv: "1", skipEnv: "silu_mul, add_rms_norm"},
			want: Options{GEMM: GEMMSplit, DecodeChunk: 512, SkinnyRows: 64, GEMVRows: -1, GEMVMaxElems: 1024 << 20,
				DisablePDL: true, DisableGEMVWide: true, DisablePrefillGQA: true, DisableDecodeKM: true,
				DecodeStages: 3, DecodeF8Stages: 4, DecodeF8Direct: -1, DecodeChunksPerBlock: 2,
				DecodeBlocksPerSM: 8, DecodeKMBlockPerChunk: true, MLAStagedMax: -1, DisableMoEMMA: true,
				DisableAttnOut16: true, SampleSplitRows: -1, SampleMinChunks: 6, DisableNormNarrow: true,
				MLPNarrowRows: -1, MoEGEMMPairs: -1, DisableFP8LT: true, profile: true, skip: []string{"silu_mul", "add_rms_norm"}}},
		{env: map[string]string{"DEEPINFER_CUDA_GEMV": "8", "DEEPINFER_CUDA_GEMV_MAX": "0", "DEEPINFER_CUDA_PDL": "1",
			"DEEPINFER_CUDA_MLA_STAGED_MAX": "1000000", "DEEPINFER_CUDA_GEMM": "round", "DEEPINFER_CUDA_MOE_GEMM": "1"},
			want: Options{GEMVRows: 8, GEMVMaxElems: -1, MLAStagedMax: 1000000, MoEGEMMPairs: 1}},
		{env: map[string]string{"DEEPINFER_CUDA_DEC_CHUNK": "512", "DEEPINFER_CUDA_GEMV": "0"},
			base: Options{DecodeChunk: 256, GEMVRows: 2}, want: Options{DecodeChunk: 256, GEMVRows: 2}},
		{env: map[string]string{"DEEPINFER_CUDA_GEMM": "fast"}, wantErr: `DEEPINFER_CUDA_GEMM="fast"`},
		{env: map[string]string{"DEEPINFER_CUDA_PDL": "2"}, wantErr: `DEEPINFER_CUDA_PDL="2"`},
		{env: map[string]string{"DEEPINFER_CUDA_DEC_CPB": "-1"}, wantErr: `DEEPINFER_CUDA_DEC_CPB="-1"`},
		{env: map[string]string{"DEEPINFER_CUDA_DEC_CHUNK": "300"}, wantErr: "DecodeChunk = 300"},
		{env: map[string]string{skipEnv: "attention,gemv"}, wantErr: `skip "gemv": not an operation`},
	} {
		for _, e := range testEnv {
			t.Setenv(e.name, tc.env[e.name])
		}
		got, err := optionsFromTestEnv(tc.base)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one containing %q", tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: optionsFromTestEnv = %+v, %v; want %+v", tc.env, got, err, tc.want)
		}
	}
}
