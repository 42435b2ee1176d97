// moe.cuh: the expert routing steps that moe.cu (the 16-bit and float32
// expert MLP) shares with fp8_moe.cu (the FP8 expert MLP): grouping the
// (token, k) pairs by expert on the device, the float32 SiLU-mul between
// the projections and the combine of each token's k outputs. Defined in
// moe.cu; not part of the ABI. Each launches one kernel on ctx's stream
// and returns di_check_launch(ctx, op).
#pragma once

#include "common.cuh"

// di_moe_group groups pairs routing ids by expert on the device (a stable
// counting sort, no host wait): offsets[e] .. offsets[e+1] are expert e's
// rows (num_experts + 1 ints), order[row] the pair at that row (an expert's
// pairs in pair order), row_of[pair] its row, or -1 for an id outside
// [0, num_experts) (which sets DI_CHECK_MOE in ctx->check and leaves the
// pair out). The result is the unique stable grouping, whichever kernels
// compute it: up to 1024 pairs (with (pairs + num_experts + 1) ints within
// 48 KiB of shared memory) one block in which each of num_experts threads
// scans all pairs ids; above, three launches over segments of 256 pairs a
// warp (count per segment and expert, prefix sums, placement), at most
// MOE_GROUP_MAX_EXPERTS experts, with num_experts * segments ints of
// scratch. di_moe_group_ok says whether a call can be grouped.
#define MOE_GROUP_MAX_EXPERTS 3072
bool di_moe_group_ok(size_t pairs, int num_experts);
int di_moe_group(di_ctx *ctx, int *offsets, int *order, int *row_of, const int *ids, int pairs, int num_experts,
                 const char *op);

// di_moe_act_f32 computes act[r, j] = silu(g[r, j]) * g[r, inter + j] in
// float32 for rows rows (g is [rows, 2*inter], act [rows, inter]): the silu
// in float64, rounded to float32, times up.
int di_moe_act_f32(di_ctx *ctx, float *act, const float *g, size_t rows, int inter, const char *op);

// di_moe_combine computes out[t] = sum_k w[t,k] ye[row_of[t*top_k+k]] for
// num_tokens tokens of hidden floats, a fused multiply-add per k in k
// order; pairs with row_of -1 (an id out of range) are left out.
int di_moe_combine(di_ctx *ctx, float *out, const float *ye, const int *row_of, const float *w, int num_tokens,
                   int top_k, int hidden, const char *op);
