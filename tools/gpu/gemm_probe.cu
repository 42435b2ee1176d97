// gemm_probe: times the bf16 GEMMs of a decode step (out[m,n] = x[m,k] w[n,k]^T,
// float32 accumulation) with cublasGemmEx's default algorithm and with each of
// cublasLt's heuristic candidates, 200 launches back to back between events.
// Build: nvcc -O3 -arch=sm_90a gemm_probe.cu -lcublasLt -lcublas -o gemm_probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { auto s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("%s: %d\n", #x, (int)s_); exit(1); } } while (0)

static const int reps = 200;

// time_us is the device time of one f() call: reps calls captured into one
// CUDA graph and replayed, so that the host's launch cost is not measured.
template <typename F> static float time_us(cudaStream_t s, F f) {
	cudaEvent_t a, b;
	cudaEventCreate(&a); cudaEventCreate(&b);
	cudaGraph_t g; cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	for (int i = 0; i < reps; i++) f();
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiateWithFlags(&ge, g, 0));
	CK(cudaGraphLaunch(ge, s));
	cudaEventRecord(a, s);
	CK(cudaGraphLaunch(ge, s));
	cudaEventRecord(b, s);
	CK(cudaEventSynchronize(b));
	float ms; cudaEventElapsedTime(&ms, a, b);
	cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
	return ms * 1000 / reps;
}

__global__ void narrow_k(__nv_bfloat16 *o, const float *x, size_t n) {
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) o[i] = __float2bfloat16_rn(x[i]);
}

int main() {
	cudaStream_t s; CK(cudaStreamCreate(&s));
	cublasHandle_t h; CB(cublasCreate(&h)); CB(cublasSetStream(h, s));
	cublasLtHandle_t lt; CB(cublasLtCreate(&lt));
	size_t wsBytes = 32 << 20; void *ws; CK(cudaMalloc(&ws, wsBytes));
	CB(cublasSetWorkspace(h, ws, wsBytes));
	struct Shape { const char *name; int n, k; int outBF16; } shapes[] = {
	    {"qkv", 4096, 1024, 0}, {"o", 1024, 2048, 0}, {"gate_up", 6144, 1024, 1}, {"down", 1024, 3072, 0}, {"lm_head", 151936, 1024, 0}};
	// PROBE_M: a comma-separated list of row counts (default 64,128,192,256);
	// PROBE_OUT16=1 gives every shape 16-bit outputs.
	std::vector<int> ms = {64, 128, 192, 256};
	if (const char *v = getenv("PROBE_M")) {
		ms.clear();
		for (const char *p = v; *p;) { ms.push_back(atoi(p)); while (*p && *p != ',') p++; if (*p) p++; }
	}
	const bool out16 = getenv("PROBE_OUT16") && atoi(getenv("PROBE_OUT16"));
	int maxm = 0;
	for (int m : ms) maxm = m > maxm ? m : maxm;
	void *w, *x, *out; CK(cudaMalloc(&w, (size_t)151936 * 1024 * 2)); CK(cudaMalloc(&x, (size_t)maxm * 4096 * 2)); CK(cudaMalloc(&out, (size_t)(maxm > 256 ? maxm : 256) * 151936 * 4));
	CK(cudaMemset(w, 0, (size_t)151936 * 1024 * 2)); CK(cudaMemset(x, 0, (size_t)maxm * 4096 * 2));
	{
		float *xf; CK(cudaMalloc(&xf, 256 * 3072 * 4)); CK(cudaMemset(xf, 0, 256 * 3072 * 4));
		for (int n : {256 * 1024, 256 * 2048, 64 * 1024}) {
			float t = time_us(s, [&] { narrow_k<<<(n + 255) / 256, 256, 0, s>>>((__nv_bfloat16 *)x, xf, n); });
			printf("narrow f32->bf16 %d elements: %.2f us\n", n, t);
		}
	}
	printf("%-8s %4s %6s %5s | %9s | %9s %5s | floor us (780 TF, 4.2 TB/s) | candidates\n", "shape", "m", "n", "k", "default", "lt best", "idx");
	for (auto sh : shapes) for (int m : ms) {
		if (out16) sh.outBF16 = 1;
		if (sh.n > 100000 && m > 256) continue;
		const float alpha = 1, beta = 0;
		cudaDataType_t to = sh.outBF16 ? CUDA_R_16BF : CUDA_R_32F;
		float def = time_us(s, [&] {
			cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &alpha, w, CUDA_R_16BF, sh.k, x, CUDA_R_16BF, sh.k, &beta, out, to, sh.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		});
		cublasLtMatmulDesc_t op; CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
		cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
		CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
		CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
		cublasLtMatrixLayout_t la, lb, lc;
		CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.k, sh.n, sh.k));
		CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.k, m, sh.k));
		CB(cublasLtMatrixLayoutCreate(&lc, to, sh.n, m, sh.n));
		cublasLtMatmulPreference_t pref; CB(cublasLtMatmulPreferenceCreate(&pref));
		CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
		cublasLtMatmulHeuristicResult_t res[32]; int got = 0;
		CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, res, &got));
		float best = 1e9; int bi = -1; std::vector<float> all;
		for (int i = 0; i < got; i++) {
			float t = time_us(s, [&] {
				cublasLtMatmul(lt, op, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &res[i].algo, ws, wsBytes, s);
			});
			all.push_back(t);
			if (t < best) best = t, bi = i;
		}
		double fl = 2.0 * m * sh.n * sh.k, by = 2.0 * sh.n * sh.k + 2.0 * m * sh.k + (sh.outBF16 ? 2 : 4) * (double)m * sh.n;
		double floor = fl / 780e12 > by / 4.2e12 ? fl / 780e12 : by / 4.2e12;
		printf("%-8s %5d %6d %5d %s | %7.2fus | %7.2fus %5d | %6.2f | %4.0f TF/s |", sh.name, m, sh.n, sh.k, sh.outBF16 ? "bf16" : "f32 ", def, best, bi, floor * 1e6, fl / def / 1e6);
		for (size_t i = 0; i < all.size() && i < 10; i++) printf(" %.1f", all[i]);
		printf("\n");
		cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(op);
	}
	return 0;
}
