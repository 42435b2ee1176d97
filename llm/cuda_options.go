package llm

import (
	"github.com/deepinfer/deepinfer-go/engine/config"
	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cuda"
)

// cudaOptions converts the config's cuda section, validated by the config
// loader, into the CUDA backend's options, with kv the KV caches' element
// type (cache.kv_cache_dtype; 0: auto). Keys left at their defaults give
// zero fields, the backend's defaults. The backend's measurement-only
// switches have no key and stay at their defaults.
func cudaOptions(c config.CUDA, kv kernels.DType) cuda.Options {
	o := cuda.Options{KVCacheDType: kv, DecodeChunk: c.DecodeAttentionChunk, SkinnyRows: c.SkinnyGEMMRows,
		FillUninitialized: c.FillUninitializedMemory}
	if c.GEMM == "split" {
		o.GEMM = cuda.GEMMSplit
	}
	return o
}
