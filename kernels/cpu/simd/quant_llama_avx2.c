//go:build cgo

// LinearQuantLlama for AVX2 + FMA + F16C: int8 products with vpmaddubsw and
// vpmaddwd.

#define QTARGET __attribute__((target("avx2,fma,f16c")))
#define QVNNI 0
#define QL_KCOLS_PREFILL 2
#include "quant_llama.h"

QL_ENTRY(di_linear_qllama_avx2)
QL_QUANT_ENTRY(di_quantize_q8k_avx2)
QL_QUANT_Q8_0_ENTRY(di_quantize_q8_0_avx2)
