package llm

import (
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
)

// cudaOptions converts the config's cuda section, validated by the config
// loader, into the CUDA backend's options, with the KV caches' element
// type from cache.kv_cache_dtype (0: auto). Keys left at their defaults
// give zero fields, the backend's defaults. The backend's
// measurement-only switches have no key and stay at their defaults, but
// one: with speculative decoding of more than 3 drafts, linears of up to
// cuda.MaxGEMVRows rows (not 4) run on the GEMV kernel, so that a batch-1
// verify step's k+1 rows, padded to a captured graph size of up to 8,
// take the kernel a decode row takes and get its bits: greedy tokens then
// equal those without speculation wherever the weights are small enough
// for the GEMV above one row (Options.GEMVMaxElems). Larger weights and
// larger batches take cuBLAS, which agrees to rounding only.
func cudaOptions(cfg *config.Config) cuda.Options {
	c := cfg.CUDA
	o := cuda.Options{KVCacheDType: cfg.Cache.KVDType(), DecodeChunk: c.DecodeAttentionChunk, SkinnyRows: c.SkinnyGEMMRows,
		FillUninitialized: c.FillUninitializedMemory, GEMMPlans: c.GEMMPlans, DisableMoEWGMMA: c.MoEBatchInvariant}
	if c.GEMM == "split" {
		o.GEMM = cuda.GEMMSplit
	}
	if sp := cfg.Speculative; sp.Enabled() && sp.NumSpeculativeTokens+1 > 4 {
		o.GEMVRows = cuda.MaxGEMVRows
	}
	return o
}
