// sweep.h: what the MLA latent-kernel sweep's driver (sweep.cu) passes to
// each compiled variant (variant.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

// SweepArgs: one call of the latent attention over a paged cache (the
// library's di_mla_tc_k arguments) plus the combine's output.
struct SweepArgs {
	__half *po;   // [rows, heads, nsplit, 512] partial outputs
	float2 *pml;  // [rows, heads, nsplit] (max, sum)
	float *olat;  // [rows, heads, 512] combined output
	const void *ql;
	const unsigned char *cache;
	const int *cu, *seqlens_k, *block_tables;
	int num_seqs, max_blocks, block_size, num_blocks;
	int num_heads, rope, rows, nsplit;
	unsigned *check;
};

// A variant's entry points: run(cdt (0: F16 cache, 1: FP8 cache), d (output
// slices: 1, 2 or 4), mode (1: the latent kernel, 2: the combine, 3: both),
// args) returns a cudaError_t; info(cdt, regs, local bytes, shared bytes)
// describes its d = 1 kernel.
typedef int (*sweep_run_fn)(int, int, int, const SweepArgs *);
typedef int (*sweep_info_fn)(int, int *, int *, int *);
