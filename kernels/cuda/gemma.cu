// gemma.cu: the elementwise operations of the Gemma family
// (kernels.GemmaOpser): scaling, the GeGLU activation with tanh-approximated
// GELU, and logit soft-capping. Each follows kernels/cpu's expression (the
// transcendental parts in float64, rounded to float32 once), so both
// backends agree to the last bit wherever the device's float64 tanh does.
// Cost: one pass over the input.
#include "common.cuh"

__global__ void di_scale_k(float *out, const float *x, size_t n, float s) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		out[i] = x[i] * s;
}

// gelu_tanh(g) * u per element, as kernels/cpu's geluTanh: PyTorch's
// gelu(approximate="tanh") in float64.
__global__ void di_gelu_tanh_mul_k(float *out, const float *gu, size_t rows, int n) {
	const size_t total = rows * (size_t)n;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
		const size_t r = i / n, j = i % n;
		const double v = gu[r * 2 * n + j];
		const float g = (float)(0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
		out[i] = g * gu[r * 2 * n + n + j];
	}
}

__global__ void di_softcap_k(float *x, size_t n, float c) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		x[i] = c * (float)tanh((double)(x[i] / c));
}

extern "C" int di_op_scale(di_ctx *ctx, di_dptr out, di_dptr x, uint64_t n, float s) {
	if (n == 0) return DI_OK;
	di_scale_k<<<di_grid(n, 256), 256, 0, ctx->stream>>>(DI_PTR(float, out), DI_PTR(const float, x), n, s);
	return di_check_launch(ctx, "scale");
}

extern "C" int di_op_gelu_tanh_mul(di_ctx *ctx, di_dptr out, di_dptr gate_up, int rows, int n) {
	if (rows == 0 || n == 0) return DI_OK;
	di_gelu_tanh_mul_k<<<di_grid((size_t)rows * n, 256), 256, 0, ctx->stream>>>(
	    DI_PTR(float, out), DI_PTR(const float, gate_up), (size_t)rows, n);
	return di_check_launch(ctx, "gelu_tanh_mul");
}

extern "C" int di_op_softcap(di_ctx *ctx, di_dptr x, uint64_t n, float c) {
	if (n == 0) return DI_OK;
	if (!(c > 0.f)) return di_fail(ctx, DI_ERR_INVALID, "softcap: cap %g, want > 0", (double)c);
	di_softcap_k<<<di_grid(n, 256), 256, 0, ctx->stream>>>(DI_PTR(float, x), n, c);
	return di_check_launch(ctx, "softcap");
}
