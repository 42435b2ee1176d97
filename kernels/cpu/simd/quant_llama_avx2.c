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
QL_ROUND_BF16_ENTRY(di_round_bf16_avx2)

#include <cpuid.h>
#include <string.h>

int di_cpu_is_amd(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid(0, &a, &b, &c, &d))
		return 0;
	char v[12];
	memcpy(v, &b, 4);
	memcpy(v + 4, &d, 4);
	memcpy(v + 8, &c, 4);
	return memcmp(v, "AuthenticAMD", 12) == 0;
}
