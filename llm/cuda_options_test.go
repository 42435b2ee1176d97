package llm

import (
	"reflect"
	"testing"

	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
)

// The config's cuda keys reach the backend's options; with speculative
// decoding a batch-1 verify step's k+1 rows, padded to a graph size of up
// to 8, stay on the GEMV kernel (its 8 rows).
func TestCUDAOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want cuda.Options
	}{
		{"defaults", "", cuda.Options{}},
		{"keys", "cache: {kv_cache_dtype: fp8}\ncuda: {gemm: split, decode_attention_chunk: 512, skinny_gemm_rows: 16, fill_uninitialized_memory: true, gemm_plans: true, moe_batch_invariant: true}\n",
			cuda.Options{GEMM: cuda.GEMMSplit, KVCacheDType: kernels.F8E4M3, DecodeChunk: 512, SkinnyRows: 16, FillUninitialized: true, GEMMPlans: true,
				DisableMoEWGMMA: true}},
		{"mtp k=3", "speculative: {method: mtp, num_speculative_tokens: 3}\n", cuda.Options{}},
		{"ngram k=4", "speculative: {method: ngram, num_speculative_tokens: 4}\n", cuda.Options{GEMVRows: cuda.MaxGEMVRows}},
		{"dspark k=6", "speculative: {method: dspark, num_speculative_tokens: 6, draft_model: d}\n", cuda.Options{GEMVRows: cuda.MaxGEMVRows}},
		{"k=12", "speculative: {method: ngram, num_speculative_tokens: 12}\n", cuda.Options{GEMVRows: cuda.MaxGEMVRows}},
		{"off", "speculative: {method: none, num_speculative_tokens: 12}\n", cuda.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("c.yaml", []byte("model: m\ndevice: cuda\n"+tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := cudaOptions(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("options %+v, want %+v", got, tc.want)
			}
		})
	}
}
