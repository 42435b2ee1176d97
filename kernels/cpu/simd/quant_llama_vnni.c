//go:build cgo

// LinearQuantLlama for AVX-512 VNNI (with VL/BW/F, AVX2, FMA, F16C): the
// Q8_0/Q4_0 int8 dot products are vpdpbusd on 256-bit vectors, and the 32
// vector registers of EVEX hold wider K-quant tiles.

#define QTARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define QVNNI 1
#define QL_KCOLS_PREFILL 4
#include "quant_llama.h"

QL_ENTRY(di_linear_qllama_vnni)
QL_QUANT_ENTRY(di_quantize_q8k_vnni)
QL_QUANT_Q8_0_ENTRY(di_quantize_q8_0_vnni)
