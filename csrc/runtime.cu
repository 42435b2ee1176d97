// runtime.cu: the host runtime of libdeepinfer_cuda.so: device selection, the
// context's stream, events, the caching device allocator, pinned staging
// buffers, the cuBLAS handle and GEMM, CUDA Graph capture and replay, error
// strings, and di_get_api, the one exported symbol.
#include "internal.h"

#include <cstdlib>
#include <cstring>
#include <new>

#ifndef DI_ARCH
#define DI_ARCH "unknown"
#endif

// ---------------------------------------------------------------- errors

int di_fail(di_ctx *ctx, int code, const char *fmt, ...) {
	if (ctx) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
		va_end(ap);
	}
	return code;
}

int di_cuda_fail(di_ctx *ctx, cudaError_t e, const char *what) {
	int code = DI_ERR_CUDA;
	if (e == cudaErrorMemoryAllocation) code = DI_ERR_OOM;
	if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) code = DI_ERR_ARCH;
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) code = DI_ERR_NO_DEVICE;
	return di_fail(ctx, code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int di_check_launch(di_ctx *ctx, const char *op) {
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, op);
	return DI_OK;
}

static const char *cublas_status_name(cublasStatus_t s) {
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	default: return "CUBLAS_STATUS_UNKNOWN";
	}
}

static int cublas_fail(di_ctx *ctx, cublasStatus_t s, const char *what) {
	return di_fail(ctx, DI_ERR_CUBLAS, "%s: %s", what, cublas_status_name(s));
}

#define CK(call, what)                                   \
	do {                                                 \
		cudaError_t e_ = (call);                         \
		if (e_ != cudaSuccess) return di_cuda_fail(ctx, e_, what); \
	} while (0)

static void copy_err(char *err, int errlen, const char *msg) {
	if (err && errlen > 0) snprintf(err, (size_t)errlen, "%s", msg);
}

static int capturing(di_ctx *ctx) {
	cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	if (cudaStreamIsCapturing(ctx->stream, &st) != cudaSuccess) return 0;
	return st != cudaStreamCaptureStatusNone;
}

// ---------------------------------------------------------------- allocator

// Sizes are rounded so that recurring shapes hit the cache exactly: 512 bytes
// below 1 MiB, 2 MiB above.
static size_t round_size(size_t n) {
	if (n == 0) n = 1;
	if (n < (1u << 20)) return (n + 511) & ~size_t(511);
	return (n + (2u << 20) - 1) & ~size_t((2u << 20) - 1);
}

static void release_cached_locked(di_ctx *ctx) {
	for (auto &kv : ctx->free_blocks) {
		cudaFree(kv.second);
		ctx->stats.reserved -= kv.first;
	}
	ctx->free_blocks.clear();
}

static int alloc_impl(di_ctx *ctx, size_t bytes, void **out) {
	size_t n = round_size(bytes);
	const int cap = capturing(ctx);
	std::lock_guard<std::mutex> g(ctx->mem_mu);
	ctx->stats.num_allocs++;
	void *p = nullptr;
	auto take = [&](std::multimap<size_t, void *> &pool) {
		auto it = pool.find(n);
		if (it == pool.end()) return false;
		p = it->second;
		pool.erase(it);
		ctx->stats.num_cache_hits++;
		return true;
	};
	if (!(cap && take(ctx->graph_free)) && !take(ctx->free_blocks)) {
		cudaError_t e = cudaMalloc(&p, n);
		if (e == cudaErrorMemoryAllocation && !ctx->free_blocks.empty() && !cap) {
			cudaGetLastError(); // clear the non-sticky error
			// Cached blocks may still be in use by queued work: wait, then release.
			cudaStreamSynchronize(ctx->stream);
			release_cached_locked(ctx);
			e = cudaMalloc(&p, n);
		}
		if (e != cudaSuccess) {
			cudaGetLastError();
			size_t free_b = 0, total_b = 0;
			cudaMemGetInfo(&free_b, &total_b);
			return di_fail(ctx, e == cudaErrorMemoryAllocation ? DI_ERR_OOM : DI_ERR_CUDA,
			               "cudaMalloc of %.1f MiB: %s; the engine holds %.1f MiB in use and %.1f MiB "
			               "reserved, the device has %.1f MiB free of %.1f MiB",
			               n / 1048576.0, cudaGetErrorString(e), ctx->stats.in_use / 1048576.0,
			               ctx->stats.reserved / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
		}
		ctx->stats.reserved += n;
		ctx->stats.num_driver_allocs++;
	}
	if (ctx->fill_uninit) {
		cudaError_t e = cudaMemsetAsync(p, 0xFF, n, ctx->stream);
		if (e != cudaSuccess) {
			ctx->free_blocks.emplace(n, p);
			return di_cuda_fail(ctx, e, "alloc: fill_uninitialized: cudaMemsetAsync");
		}
	}
	if (cap) ctx->graph_owned[p] = n;
	ctx->live[p] = n;
	ctx->stats.in_use += n;
	if (ctx->stats.in_use > ctx->stats.peak) ctx->stats.peak = ctx->stats.in_use;
	*out = p;
	return DI_OK;
}

static int free_impl(di_ctx *ctx, void *p) {
	if (!p) return DI_OK;
	std::lock_guard<std::mutex> g(ctx->mem_mu);
	auto it = ctx->live.find(p);
	if (it == ctx->live.end()) return di_fail(ctx, DI_ERR_INVALID, "free of %p: not a live allocation", p);
	const size_t n = it->second;
	if (ctx->graph_owned.count(p)) ctx->graph_free.emplace(n, p);
	else ctx->free_blocks.emplace(n, p);
	ctx->stats.in_use -= n;
	ctx->live.erase(it);
	return DI_OK;
}

int di_scratch(di_ctx *ctx, size_t bytes, void **out) { return alloc_impl(ctx, bytes, out); }

void di_scratch_free(di_ctx *ctx, void *p) { free_impl(ctx, p); }

// ---------------------------------------------------------------- cuBLAS

static int cuda_type(di_ctx *ctx, int dtype, cudaDataType_t *t) {
	switch (dtype) {
	case DI_F32: *t = CUDA_R_32F; return DI_OK;
	case DI_BF16: *t = CUDA_R_16BF; return DI_OK;
	case DI_F16: *t = CUDA_R_16F; return DI_OK;
	}
	return di_fail(ctx, DI_ERR_UNSUPPORTED, "gemm: dtype %d", dtype);
}

int di_gemm(di_ctx *ctx, float *out, const void *x, const void *w, int dtype, int m, int n, int k) {
	return di_gemm_to(ctx, out, DI_F32, x, w, dtype, m, n, k);
}

// ---------------------------------------------------------------- cuBLASLt plans (di_options.gemm_plans)

// di_gemm_plan is cuBLASLt's descriptors and algorithm for one GEMM shape:
// (n, k, dtype, out_dtype, align) and a bucket mb of row counts, the
// algorithm chosen for mb rows. A call of m <= mb rows sets the row count
// of its b and d layouts to m.
struct di_gemm_plan : di_lt_desc {
	int n = 0, k = 0, mb = 0, dtype = -1, out_dtype = -1, align = 0;
};

#define DI_GEMM_PLANS 256 // plans kept: shapes past it replace the oldest

struct di_gemm_plans {
	di_gemm_plan plans[DI_GEMM_PLANS];
	int used = 0, next = 0;
};

#define GEMM_LT_OK(call) ((call) == CUBLAS_STATUS_SUCCESS)

void di_lt_desc_destroy(di_lt_desc &p) {
	if (p.op) cublasLtMatmulDescDestroy(p.op);
	if (p.a) cublasLtMatrixLayoutDestroy(p.a);
	if (p.b) cublasLtMatrixLayoutDestroy(p.b);
	if (p.d) cublasLtMatrixLayoutDestroy(p.d);
}

bool di_lt_pick_algo(di_ctx *ctx, di_lt_desc &p, int align) {
	cublasLtMatmulPreference_t pref = nullptr;
	const size_t wsb = ctx->cublas_workspace_bytes;
	const uint32_t al = (uint32_t)align;
	cublasLtMatmulHeuristicResult_t h = {};
	int found = 0;
	bool good = GEMM_LT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
	            GEMM_LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
	                                                            sizeof wsb));
	for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
	                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
		good = good && GEMM_LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
	good = good && GEMM_LT_OK(cublasLtMatmulAlgoGetHeuristic(ctx->lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &h, &found)) &&
	       found > 0;
	if (pref) cublasLtMatmulPreferenceDestroy(pref);
	if (good) p.algo = h.algo;
	return good;
}

static void gemm_plan_clear(di_gemm_plan &p) {
	di_lt_desc_destroy(p);
	p = di_gemm_plan();
}

static void gemm_plans_free(di_ctx *ctx) {
	if (!ctx->gemm_plans) return;
	for (int i = 0; i < ctx->gemm_plans->used; i++) gemm_plan_clear(ctx->gemm_plans->plans[i]);
	delete ctx->gemm_plans;
	ctx->gemm_plans = nullptr;
}

// gemm_bucket is the bucket of m rows: m itself up to 16, above it m
// rounded up to a quarter of the power of two at or below it (four
// buckets an octave, at most a third more rows than m).
static int gemm_bucket(int m) {
	if (m <= 16) return m;
	int p = 16;
	while (p <= m / 2) p *= 2;
	const int q = p / 4;
	return (m + q - 1) / q * q;
}

// gemm_align is the largest power of two up to 16 that divides v.
static int gemm_align(uintptr_t v) {
	int a = 16;
	while (a > 1 && v % (uintptr_t)a) a /= 2;
	return a;
}

// gemm_plan returns the plan of the shape, made on first use (one
// heuristic query), or null without a cuBLASLt handle.
static di_gemm_plan *gemm_plan(di_ctx *ctx, int mb, int n, int k, int dtype, int out_dtype, int align,
                               cudaDataType_t t, cudaDataType_t to) {
	if (!ctx->lt) return nullptr;
	if (!ctx->gemm_plans) ctx->gemm_plans = new di_gemm_plans();
	di_gemm_plans *c = ctx->gemm_plans;
	for (int i = 0; i < c->used; i++) {
		di_gemm_plan &p = c->plans[i];
		if (p.mb == mb && p.n == n && p.k == k && p.dtype == dtype && p.out_dtype == out_dtype && p.align == align)
			return &p;
	}
	const int slot = c->used < DI_GEMM_PLANS ? c->used++ : (c->next++ % DI_GEMM_PLANS);
	di_gemm_plan &p = c->plans[slot];
	gemm_plan_clear(p);
	ctx->gemm_counts.plans++;
	p.mb = mb, p.n = n, p.k = k, p.dtype = dtype, p.out_dtype = out_dtype, p.align = align;
	// Row-major out[m,n] = x[m,k] w[n,k]^T, column-major as cublasGemmEx's
	// call below: D[n,m] = op(A)[n,k] B[k,m], A = w ([k,n], transposed).
	const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	bool good = GEMM_LT_OK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
	            GEMM_LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
	            GEMM_LT_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
	            GEMM_LT_OK(cublasLtMatrixLayoutCreate(&p.a, t, k, n, k)) &&
	            GEMM_LT_OK(cublasLtMatrixLayoutCreate(&p.b, t, k, mb, k)) &&
	            GEMM_LT_OK(cublasLtMatrixLayoutCreate(&p.d, to, n, mb, n)) && di_lt_pick_algo(ctx, p, align);
	p.ok = good;
	return &p;
}

// gemm_lt runs out = x w^T through the shape's plan; false: no plan, or
// cuBLASLt refused it (the caller runs cublasGemmEx).
static bool gemm_lt(di_ctx *ctx, void *out, int out_dtype, const void *x, const void *w, int dtype, int m, int n,
                    int k, cudaDataType_t t, cudaDataType_t to) {
	const size_t es = dtype == DI_F32 ? 4 : 2, eo = out_dtype == DI_F32 ? 4 : 2;
	int align = gemm_align((uintptr_t)out);
	for (uintptr_t v : {(uintptr_t)x, (uintptr_t)w, (uintptr_t)((size_t)k * es), (uintptr_t)((size_t)n * eo)})
		align = align < gemm_align(v) ? align : gemm_align(v);
	di_gemm_plan *p = gemm_plan(ctx, gemm_bucket(m), n, k, dtype, out_dtype, align, t, to);
	if (!p || !p->ok) return false;
	const uint64_t cols = (uint64_t)m;
	if (!GEMM_LT_OK(cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols)) ||
	    !GEMM_LT_OK(cublasLtMatrixLayoutSetAttribute(p->d, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols)))
		return false;
	const float alpha = 1.0f, beta = 0.0f;
	if (!GEMM_LT_OK(cublasLtMatmul(ctx->lt, p->op, &alpha, w, p->a, x, p->b, &beta, out, p->d, out, p->d, &p->algo,
	                               ctx->cublas_workspace, ctx->cublas_workspace_bytes, ctx->stream)))
		return false;
	ctx->gemm_counts.plan_calls++;
	return true;
}

int di_gemm_to(di_ctx *ctx, void *out, int out_dtype, const void *x, const void *w, int dtype, int m, int n, int k) {
	if (m == 0 || n == 0) return DI_OK;
	cudaDataType_t t, to;
	int rc = cuda_type(ctx, dtype, &t);
	if (rc == DI_OK) rc = cuda_type(ctx, out_dtype, &to);
	if (rc != DI_OK) return rc;
	if (k == 0) {
		const size_t esize = out_dtype == DI_F32 ? sizeof(float) : 2;
		CK(cudaMemsetAsync(out, 0, (size_t)m * n * esize, ctx->stream), "gemm: cudaMemsetAsync");
		return DI_OK;
	}
	if (ctx->gemm_plans_on && m > 16 && gemm_lt(ctx, out, out_dtype, x, w, dtype, m, n, k, t, to)) return DI_OK;
	const float alpha = 1.0f, beta = 0.0f;
	// Row-major out[m,n] = x[m,k] w[n,k]^T is column-major out^T[n,m] = w^T' x^T'
	// where w (row-major [n,k]) is column-major [k,n]: op(A) = A^T.
	cublasStatus_t s = cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, t, k, x, t,
	                                k, &beta, out, to, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (s != CUBLAS_STATUS_SUCCESS) {
		char what[128];
		snprintf(what, sizeof what, "cublasGemmEx m=%d n=%d k=%d dtype=%d", m, n, k, dtype);
		return cublas_fail(ctx, s, what);
	}
	return DI_OK;
}

// ---------------------------------------------------------------- context

static int api_device_count(int *n, char *err, int errlen) {
	int c = 0;
	cudaError_t e = cudaGetDeviceCount(&c);
	if (e != cudaSuccess) {
		char msg[512];
		snprintf(msg, sizeof msg, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
		copy_err(err, errlen, msg);
		*n = 0;
		return DI_ERR_NO_DEVICE;
	}
	*n = c;
	return DI_OK;
}

static void destroy_impl(di_ctx *ctx) {
	if (!ctx) return;
	cudaSetDevice(ctx->device);
	if (ctx->stream) cudaStreamSynchronize(ctx->stream);
	for (auto &s : ctx->stages) {
		if (s.done) cudaEventDestroy(s.done);
		if (s.host) cudaFreeHost(s.host);
	}
	{
		std::lock_guard<std::mutex> g(ctx->mem_mu);
		release_cached_locked(ctx);
		for (auto &kv : ctx->graph_free) cudaFree(kv.second);
		ctx->graph_free.clear();
		for (auto &kv : ctx->live) cudaFree(kv.first);
		ctx->live.clear();
	}
	di_fp8_lt_free(ctx);
	gemm_plans_free(ctx);
	if (ctx->lt) cublasLtDestroy(ctx->lt);
	if (ctx->cublas) cublasDestroy(ctx->cublas);
	if (ctx->cublas_workspace) cudaFree(ctx->cublas_workspace);
	if (ctx->check) cudaFree(ctx->check);
	if (ctx->skinny_sem) cudaFree(ctx->skinny_sem);
	if (ctx->check_host) cudaFreeHost(ctx->check_host);
	if (ctx->stream) cudaStreamDestroy(ctx->stream);
	delete ctx;
}

static int api_create(int device, di_ctx **out, char *err, int errlen) {
	*out = nullptr;
	int n = 0;
	if (api_device_count(&n, err, errlen) != DI_OK) return DI_ERR_NO_DEVICE;
	if (n == 0) {
		copy_err(err, errlen, "no CUDA device is visible (cudaGetDeviceCount returned 0)");
		return DI_ERR_NO_DEVICE;
	}
	if (device < 0 || device >= n) {
		char msg[128];
		snprintf(msg, sizeof msg, "device %d requested, %d visible", device, n);
		copy_err(err, errlen, msg);
		return DI_ERR_INVALID;
	}
	di_ctx *ctx = new (std::nothrow) di_ctx();
	if (!ctx) {
		copy_err(err, errlen, "out of host memory");
		return DI_ERR_OOM;
	}
	ctx->device = device;
	auto fail = [&](int code) {
		copy_err(err, errlen, ctx->err);
		destroy_impl(ctx);
		return code;
	};
	cudaError_t e = cudaSetDevice(device);
	if (e != cudaSuccess) return fail(di_cuda_fail(ctx, e, "cudaSetDevice"));
	// The library is built for one target; a device without an image fails here
	// rather than at the first kernel.
	e = di_probe_kernel();
	if (e != cudaSuccess) {
		cudaDeviceProp p;
		cudaGetDeviceProperties(&p, device);
		di_fail(ctx, e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ? DI_ERR_ARCH : DI_ERR_CUDA,
		        "library built for %s has no kernel for %s (sm_%d%d): %s; rebuild with CUDA_ARCH=%d%d csrc/build.sh",
		        DI_ARCH, p.name, p.major, p.minor, cudaGetErrorString(e), p.major, p.minor);
		return fail(e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ? DI_ERR_ARCH : DI_ERR_CUDA);
	}
	if ((e = cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaDeviceGetAttribute (multiprocessors)"));
	if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaStreamCreate"));
	if ((e = cudaMalloc(&ctx->check, sizeof(unsigned))) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaMalloc (check word)"));
	if ((e = cudaMemset(ctx->check, 0, sizeof(unsigned))) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaMemset (check word)"));
	if ((e = cudaHostAlloc((void **)&ctx->check_host, sizeof(unsigned), cudaHostAllocDefault)) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaHostAlloc (check word)"));
	if ((e = cudaMalloc(&ctx->skinny_sem, DI_SKINNY_SEMS * sizeof(unsigned))) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaMalloc (skinny GEMM counters)"));
	if ((e = cudaMemsetAsync(ctx->skinny_sem, 0, DI_SKINNY_SEMS * sizeof(unsigned), ctx->stream)) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaMemset (skinny GEMM counters)"));

	ctx->stage_bytes = 4u << 20;
	ctx->stages.resize(16);
	for (auto &s : ctx->stages) {
		if ((e = cudaHostAlloc(&s.host, ctx->stage_bytes, cudaHostAllocDefault)) != cudaSuccess)
			return fail(di_cuda_fail(ctx, e, "cudaHostAlloc (staging)"));
		if ((e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming)) != cudaSuccess)
			return fail(di_cuda_fail(ctx, e, "cudaEventCreate (staging)"));
	}
	cublasStatus_t s = cublasCreate(&ctx->cublas);
	if (s != CUBLAS_STATUS_SUCCESS) return fail(cublas_fail(ctx, s, "cublasCreate"));
	if ((s = cublasSetStream(ctx->cublas, ctx->stream)) != CUBLAS_STATUS_SUCCESS)
		return fail(cublas_fail(ctx, s, "cublasSetStream"));
	// A fixed workspace keeps cuBLAS from allocating during graph capture.
	const size_t ws = 32u << 20;
	if ((e = cudaMalloc(&ctx->cublas_workspace, ws)) != cudaSuccess)
		return fail(di_cuda_fail(ctx, e, "cudaMalloc (cuBLAS workspace)"));
	if ((s = cublasSetWorkspace(ctx->cublas, ctx->cublas_workspace, ws)) != CUBLAS_STATUS_SUCCESS)
		return fail(cublas_fail(ctx, s, "cublasSetWorkspace"));
	ctx->cublas_workspace_bytes = ws;
	if ((s = cublasLtCreate(&ctx->lt)) != CUBLAS_STATUS_SUCCESS) return fail(cublas_fail(ctx, s, "cublasLtCreate"));
	// Float32 GEMMs stay in float32 (no TF32), so the F32 path is exact enough
	// for 1e-4 parity; BF16/F16 GEMMs use the tensor cores either way.
	if ((s = cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS)
		return fail(cublas_fail(ctx, s, "cublasSetMathMode"));
	*out = ctx;
	return DI_OK;
}

static const char *api_last_error(di_ctx *ctx) { return ctx ? ctx->err : "no context"; }

static int api_device_info(di_ctx *ctx, di_device_info *out) {
	memset(out, 0, sizeof *out);
	cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, ctx->device), "cudaGetDeviceProperties");
	snprintf(out->name, sizeof out->name, "%s", p.name);
	snprintf(out->arch, sizeof out->arch, "%s", DI_ARCH);
	out->device = ctx->device;
	out->cc_major = p.major;
	out->cc_minor = p.minor;
	out->num_sms = p.multiProcessorCount;
	out->l2_bytes = (uint64_t)p.l2CacheSize;
	CK(cudaRuntimeGetVersion(&out->runtime_version), "cudaRuntimeGetVersion");
	CK(cudaDriverGetVersion(&out->driver_version), "cudaDriverGetVersion");
	cublasGetVersion(ctx->cublas, &out->cublas_version);
	size_t f = 0, t = 0;
	CK(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
	out->free_mem = f;
	out->total_mem = t;
	return DI_OK;
}

static int api_gemm_stats(di_ctx *ctx, di_gemm_stats *out) {
	*out = ctx->gemm_counts;
	return DI_OK;
}

static int api_mem_stats(di_ctx *ctx, di_mem_stats *out) {
	std::lock_guard<std::mutex> g(ctx->mem_mu);
	*out = ctx->stats;
	return DI_OK;
}

// api_set_options checks every field of o, then sets the context's switches
// (di_options' zeros are the DI_DEFAULT_* values): a bad field changes
// nothing.
static int api_set_options(di_ctx *ctx, const di_options *o) {
	if (!o) return di_fail(ctx, DI_ERR_INVALID, "set_options: no di_options");
	if (o->size != sizeof(di_options))
		return di_fail(ctx, DI_ERR_INVALID,
		               "di_options of %u bytes, this library's are %u: the caller was built against another header",
		               (unsigned)o->size, (unsigned)sizeof(di_options));
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "set_options during graph capture");
	int graphs;
	{
		std::lock_guard<std::mutex> g(ctx->mem_mu);
		graphs = ctx->num_graphs;
	}
	if (graphs > 0)
		return di_fail(ctx, DI_ERR_INVALID, "set_options: %d graphs exist and keep the switches they were captured with",
		               graphs);
	if (o->gemm_mode != DI_GEMM_ROUND && o->gemm_mode != DI_GEMM_SPLIT)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.gemm_mode %d", (int)o->gemm_mode);
	if (o->decode_chunk < 0 || o->decode_chunk % DI_DEC_CHUNK_ALIGN != 0)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_chunk %d: want 0 or a positive multiple of %d",
		               (int)o->decode_chunk, DI_DEC_CHUNK_ALIGN);
	if (o->skinny_rows < 0 || o->skinny_rows > DI_SKINNY_MAX_ROWS)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.skinny_rows %d: want 0 to %d", (int)o->skinny_rows,
		               DI_SKINNY_MAX_ROWS);
	if (o->gemv_rows > DI_GEMV_MAX_ROWS)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.gemv_rows %d: want at most %d", (int)o->gemv_rows,
		               DI_GEMV_MAX_ROWS);
	if (o->decode_stages != 0 && o->decode_stages != 2 && o->decode_stages != 3)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_stages %d: want 0, 2 or 3", (int)o->decode_stages);
	if (o->decode_f8_stages != 0 && (o->decode_f8_stages < 2 || o->decode_f8_stages > 4))
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_f8_stages %d: want 0 or 2 to 4",
		               (int)o->decode_f8_stages);
	if (o->decode_f8_direct > 0 && (o->decode_f8_direct < 2 || o->decode_f8_direct > 4))
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_f8_direct %d: want a negative value, 0 or 2 to 4",
		               (int)o->decode_f8_direct);
	if (o->decode_chunks_per_block < 0)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_chunks_per_block %d: want 0 or more",
		               (int)o->decode_chunks_per_block);
	if (o->decode_blocks_per_sm < 0)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.decode_blocks_per_sm %d: want 0 or more",
		               (int)o->decode_blocks_per_sm);
	if (o->sample_min_chunks < 0)
		return di_fail(ctx, DI_ERR_INVALID, "di_options.sample_min_chunks %d: want 0 or more", (int)o->sample_min_chunks);
	ctx->gemm_mode = o->gemm_mode;
	ctx->dec_chunk = o->decode_chunk > 0 ? o->decode_chunk : DI_DEFAULT_DEC_CHUNK;
	ctx->skinny = o->skinny_rows;
	ctx->gemv = o->gemv_rows > 0 ? o->gemv_rows : (o->gemv_rows < 0 ? 0 : DI_DEFAULT_GEMV_ROWS);
	ctx->gemv_max_elems = o->gemv_max_elems > 0 ? (size_t)o->gemv_max_elems
	                                            : (o->gemv_max_elems < 0 ? 0 : DI_DEFAULT_GEMV_MAX_ELEMS);
	ctx->pdl = o->disable_pdl ? 0 : 1;
	ctx->gemv_wide = o->disable_gemv_wide ? 0 : 1;
	ctx->prefill_gqa = o->disable_prefill_gqa ? 0 : 1;
	ctx->dec_km = o->disable_decode_km ? 0 : 1;
	ctx->dec_stages = o->decode_stages > 0 ? o->decode_stages : DI_DEFAULT_DEC_STAGES;
	ctx->dec_stages_f8 = o->decode_f8_stages > 0 ? o->decode_f8_stages : DI_DEFAULT_DEC_F8_STAGES;
	ctx->dec_f8_direct =
	    o->decode_f8_direct > 0 ? o->decode_f8_direct : (o->decode_f8_direct < 0 ? 0 : DI_DEFAULT_DEC_F8_DIRECT);
	ctx->dec_cpb = o->decode_chunks_per_block;
	ctx->dec_blocks_per_sm = o->decode_blocks_per_sm > 0 ? o->decode_blocks_per_sm : DI_DEFAULT_DEC_BLOCKS_PER_SM;
	ctx->dec_km_cpb = o->decode_km_block_per_chunk ? 0 : 1;
	ctx->mla_staged_max = o->mla_staged_max > 0 ? o->mla_staged_max : (o->mla_staged_max < 0 ? 0 : -1);
	ctx->moe_mma = o->disable_moe_mma ? 0 : 1;
	ctx->attn_out16 = o->disable_attn_out16 ? 0 : 1;
	ctx->sample_split =
	    o->sample_split_rows > 0 ? o->sample_split_rows : (o->sample_split_rows < 0 ? 0 : DI_DEFAULT_SAMPLE_SPLIT);
	ctx->sample_min_chunks = o->sample_min_chunks > 0 ? o->sample_min_chunks : DI_DEFAULT_SAMPLE_MIN_CHUNKS;
	ctx->moe_gemm_pairs =
	    o->moe_gemm_pairs > 0 ? o->moe_gemm_pairs : (o->moe_gemm_pairs < 0 ? 0 : DI_DEFAULT_MOE_GEMM_PAIRS);
	ctx->fp8_lt_on = o->disable_fp8_lt ? 0 : 1;
	ctx->moe_wg = o->disable_moe_wgmma ? 0 : 1;
	ctx->mla_pf_wg = o->disable_mla_prefill_wgmma ? 0 : 1;
	ctx->fill_uninit = o->fill_uninitialized ? 1 : 0;
	ctx->gemm_plans_on = o->gemm_plans ? 1 : 0;
	return DI_OK;
}

// ---------------------------------------------------------------- memory API

static int api_alloc(di_ctx *ctx, uint64_t bytes, di_dptr *out) {
	void *p = nullptr;
	int rc = alloc_impl(ctx, bytes, &p);
	*out = (di_dptr)(uintptr_t)p;
	return rc;
}

static int api_free(di_ctx *ctx, di_dptr p) { return free_impl(ctx, (void *)(uintptr_t)p); }

static int api_empty_cache(di_ctx *ctx) {
	std::lock_guard<std::mutex> g(ctx->mem_mu);
	if (ctx->num_graphs > 0) return DI_OK; // graphs may point into cached blocks
	CK(cudaStreamSynchronize(ctx->stream), "empty_cache: cudaStreamSynchronize");
	release_cached_locked(ctx);
	return DI_OK;
}

static int api_memset_zero(di_ctx *ctx, di_dptr p, uint64_t bytes) {
	if (bytes == 0) return DI_OK;
	CK(cudaMemsetAsync((void *)(uintptr_t)p, 0, bytes, ctx->stream), "cudaMemsetAsync");
	return DI_OK;
}

static int api_upload(di_ctx *ctx, di_dptr dst, const void *src, uint64_t bytes) {
	if (bytes == 0) return DI_OK;
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "upload during graph capture");
	const char *s = (const char *)src;
	char *d = (char *)(uintptr_t)dst;
	while (bytes > 0) {
		if (ctx->stage_off >= ctx->stage_bytes || (bytes > ctx->stage_bytes - ctx->stage_off && ctx->stage_off > 0)) {
			// Move to the next chunk, waiting for its last copy if still queued.
			ctx->cur_stage = (ctx->cur_stage + 1) % ctx->stages.size();
			ctx->stage_off = 0;
			CK(cudaEventSynchronize(ctx->stages[ctx->cur_stage].done), "upload: cudaEventSynchronize");
		}
		di_stage &st = ctx->stages[ctx->cur_stage];
		size_t room = ctx->stage_bytes - ctx->stage_off;
		size_t n = bytes < room ? bytes : room;
		char *h = (char *)st.host + ctx->stage_off;
		memcpy(h, s, n);
		CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, ctx->stream), "upload: cudaMemcpyAsync");
		CK(cudaEventRecord(st.done, ctx->stream), "upload: cudaEventRecord");
		ctx->stage_off += (n + 255) & ~size_t(255);
		s += n;
		d += n;
		bytes -= n;
	}
	return DI_OK;
}

static int api_upload_widen(di_ctx *ctx, di_dptr dst, const void *src, int src_dtype, uint64_t n) {
	if (n == 0) return DI_OK;
	if (src_dtype != DI_BF16 && src_dtype != DI_F16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "upload_widen: source dtype %d", src_dtype);
	void *tmp = nullptr;
	int rc = alloc_impl(ctx, n * 2, &tmp);
	if (rc != DI_OK) return rc;
	rc = api_upload(ctx, (di_dptr)(uintptr_t)tmp, src, n * 2);
	if (rc == DI_OK) rc = di_op_widen(ctx, (float *)(uintptr_t)dst, tmp, src_dtype, n);
	free_impl(ctx, tmp);
	return rc;
}

// report_checks reads the device check word after the stream drained.
static int report_checks(di_ctx *ctx) {
	unsigned c = *ctx->check_host;
	if (c == 0) return DI_OK;
	CK(cudaMemsetAsync(ctx->check, 0, sizeof(unsigned), ctx->stream), "clear check word");
	CK(cudaStreamSynchronize(ctx->stream), "clear check word: cudaStreamSynchronize");
	*ctx->check_host = 0;
	char buf[512] = {0}; // room for every name
	static const char *names[] = {"embedding (token id)", "rope (position)", "write_cache (slot)",
	                              "attention (sequence layout or block table)",
	                              "mla_attention (sequence layout or block table)",
	                              "resolve_placeholders (row)", "logits (row)", "moe (expert id)",
	                              "sample (a logits row with NaN, +Inf or only -Inf)",
	                              "shift_accepted (row, count, sequence layout or block table)",
	                              "accept_drafts (token or draft index)"};
	for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
		if (c & (1u << i)) {
			strncat(buf, buf[0] ? ", " : "", sizeof buf - strlen(buf) - 1);
			strncat(buf, names[i], sizeof buf - strlen(buf) - 1);
		}
	}
	return di_fail(ctx, DI_ERR_DEVICE_CHECK, "index out of range met on the device by: %s", buf);
}

static int drain(di_ctx *ctx) {
	CK(cudaMemcpyAsync(ctx->check_host, ctx->check, sizeof(unsigned), cudaMemcpyDeviceToHost, ctx->stream),
	   "read check word");
	CK(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
	return report_checks(ctx);
}

static int api_download(di_ctx *ctx, void *dst, di_dptr src, uint64_t bytes) {
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "download during graph capture");
	if (bytes > 0)
		CK(cudaMemcpyAsync(dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost, ctx->stream),
		   "download: cudaMemcpyAsync");
	return drain(ctx);
}

static int api_download_async(di_ctx *ctx, void *dst, di_dptr src, uint64_t bytes) {
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "download_async during graph capture");
	if (bytes > 0)
		CK(cudaMemcpyAsync(dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost, ctx->stream),
		   "download_async: cudaMemcpyAsync");
	CK(cudaMemcpyAsync((char *)dst + bytes, ctx->check, sizeof(unsigned), cudaMemcpyDeviceToHost, ctx->stream),
	   "download_async: check word");
	return DI_OK;
}

static int api_copy(di_ctx *ctx, di_dptr dst, di_dptr src, uint64_t bytes) {
	if (bytes == 0) return DI_OK;
	CK(cudaMemcpyAsync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToDevice,
	                   ctx->stream),
	   "copy: cudaMemcpyAsync");
	return DI_OK;
}

static int api_copy_2d(di_ctx *ctx, di_dptr dst, uint64_t dst_pitch, di_dptr src, uint64_t src_pitch,
                       uint64_t width_bytes, uint64_t rows) {
	if (width_bytes == 0 || rows == 0) return DI_OK;
	if (width_bytes > dst_pitch || width_bytes > src_pitch)
		return di_fail(ctx, DI_ERR_INVALID, "copy_2d: width %llu bytes exceeds a pitch (%llu, %llu)",
		               (unsigned long long)width_bytes, (unsigned long long)dst_pitch, (unsigned long long)src_pitch);
	CK(cudaMemcpy2DAsync((void *)(uintptr_t)dst, dst_pitch, (const void *)(uintptr_t)src, src_pitch, width_bytes, rows,
	                     cudaMemcpyDeviceToDevice, ctx->stream),
	   "copy_2d: cudaMemcpy2DAsync");
	return DI_OK;
}

// di_rects_k copies the rectangles of rs, one block a rectangle, in 4-byte
// words where the rectangle's addresses, pitches and width allow, else in
// bytes.
struct di_rect_set {
	di_rect r[DI_MAX_RECTS];
};

__global__ void __launch_bounds__(256) di_rects_k(di_rect_set rs) {
	const di_rect &c = rs.r[blockIdx.x];
	const uint64_t a = c.dst | c.src | c.dst_pitch | c.src_pitch | c.width_bytes;
	if ((a & 3) == 0) {
		const uint64_t w = c.width_bytes / 4, total = w * c.rows;
		for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) {
			const uint64_t row = i / w, col = i % w;
			((uint32_t *)(uintptr_t)(c.dst + row * c.dst_pitch))[col] =
			    ((const uint32_t *)(uintptr_t)(c.src + row * c.src_pitch))[col];
		}
		return;
	}
	const uint64_t total = c.width_bytes * c.rows;
	for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) {
		const uint64_t row = i / c.width_bytes, col = i % c.width_bytes;
		((uint8_t *)(uintptr_t)(c.dst + row * c.dst_pitch))[col] =
		    ((const uint8_t *)(uintptr_t)(c.src + row * c.src_pitch))[col];
	}
}

static int api_copy_rects(di_ctx *ctx, const di_rect *rects, int n) {
	if (n < 0 || n > DI_MAX_RECTS || (n > 0 && !rects))
		return di_fail(ctx, DI_ERR_INVALID, "copy_rects: %d rectangles (at most %d)", n, DI_MAX_RECTS);
	di_rect_set rs;
	int m = 0;
	for (int i = 0; i < n; i++) {
		const di_rect &c = rects[i];
		if (c.width_bytes > c.dst_pitch || c.width_bytes > c.src_pitch)
			return di_fail(ctx, DI_ERR_INVALID, "copy_rects: rectangle %d: width %llu bytes exceeds a pitch (%llu, %llu)",
			               i, (unsigned long long)c.width_bytes, (unsigned long long)c.dst_pitch,
			               (unsigned long long)c.src_pitch);
		if (c.width_bytes == 0 || c.rows == 0) continue;
		rs.r[m++] = c;
	}
	if (m == 0) return DI_OK;
	di_rects_k<<<m, 256, 0, ctx->stream>>>(rs);
	return di_check_launch(ctx, "copy_rects");
}

static int api_sync(di_ctx *ctx) {
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "sync during graph capture");
	return drain(ctx);
}

static int api_host_alloc(di_ctx *ctx, uint64_t bytes, void **out) {
	CK(cudaHostAlloc(out, bytes, cudaHostAllocDefault), "cudaHostAlloc");
	return DI_OK;
}

static int api_host_free(di_ctx *ctx, void *p) {
	CK(cudaFreeHost(p), "cudaFreeHost");
	return DI_OK;
}

// ---------------------------------------------------------------- events

static int api_event_create(di_ctx *ctx, void **ev) {
	cudaEvent_t e;
	CK(cudaEventCreate(&e), "cudaEventCreate");
	*ev = (void *)e;
	return DI_OK;
}

static int api_event_record(di_ctx *ctx, void *ev) {
	CK(cudaEventRecord((cudaEvent_t)ev, ctx->stream), "cudaEventRecord");
	return DI_OK;
}

static int api_event_synchronize(di_ctx *ctx, void *ev) {
	CK(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize");
	return DI_OK;
}

static int api_event_elapsed_ms(di_ctx *ctx, void *start, void *end, float *ms) {
	CK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end), "cudaEventElapsedTime");
	return DI_OK;
}

static int api_event_destroy(di_ctx *ctx, void *ev) {
	CK(cudaEventDestroy((cudaEvent_t)ev), "cudaEventDestroy");
	return DI_OK;
}

// ---------------------------------------------------------------- graphs

static int api_graph_begin(di_ctx *ctx) {
	if (capturing(ctx)) return di_fail(ctx, DI_ERR_CAPTURING, "graph_begin: already capturing");
	// Relaxed: the caching allocator may call cudaMalloc while capturing.
	CK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
	return DI_OK;
}

static int api_graph_end(di_ctx *ctx, void **exec, size_t *nodes) {
	cudaGraph_t g = nullptr;
	CK(cudaStreamEndCapture(ctx->stream, &g), "cudaStreamEndCapture");
	if (nodes) {
		*nodes = 0;
		const cudaError_t ne = cudaGraphGetNodes(g, nullptr, nodes);
		if (ne != cudaSuccess) {
			cudaGraphDestroy(g);
			return di_cuda_fail(ctx, ne, "cudaGraphGetNodes");
		}
	}
	cudaGraphExec_t x = nullptr;
#if CUDART_VERSION >= 12000
	cudaError_t e = cudaGraphInstantiate(&x, g, 0);
#else
	cudaError_t e = cudaGraphInstantiateWithFlags(&x, g, 0);
#endif
	cudaGraphDestroy(g);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "cudaGraphInstantiate");
	{
		std::lock_guard<std::mutex> lk(ctx->mem_mu);
		ctx->num_graphs++;
	}
	*exec = (void *)x;
	return DI_OK;
}

static int api_graph_replay(di_ctx *ctx, void *exec) {
	CK(cudaGraphLaunch((cudaGraphExec_t)exec, ctx->stream), "cudaGraphLaunch");
	return DI_OK;
}

static int api_graph_destroy(di_ctx *ctx, void *exec) {
	CK(cudaStreamSynchronize(ctx->stream), "graph_destroy: cudaStreamSynchronize");
	CK(cudaGraphExecDestroy((cudaGraphExec_t)exec), "cudaGraphExecDestroy");
	std::lock_guard<std::mutex> lk(ctx->mem_mu);
	if (--ctx->num_graphs == 0 && !capturing(ctx)) {
		// No graph left: the graphs' pool returns to the general cache.
		ctx->free_blocks.insert(ctx->graph_free.begin(), ctx->graph_free.end());
		ctx->graph_free.clear();
		ctx->graph_owned.clear();
	}
	return DI_OK;
}

// ---------------------------------------------------------------- the table

extern "C" __attribute__((visibility("default"))) int di_get_api(uint32_t abi_version, di_api *out) {
	if (!out) return DI_ERR_INVALID;
	if (abi_version != DI_ABI_VERSION) {
		out->abi_version = DI_ABI_VERSION;
		return DI_ERR_UNSUPPORTED;
	}
	memset(out, 0, sizeof *out);
	out->abi_version = DI_ABI_VERSION;
	out->size = sizeof(di_api);
	out->device_count = api_device_count;
	out->create = api_create;
	out->destroy = destroy_impl;
	out->last_error = api_last_error;
	out->device_info = api_device_info;
	out->mem_stats = api_mem_stats;
	out->gemm_stats = api_gemm_stats;
	out->set_options = api_set_options;
	out->alloc = api_alloc;
	out->free = api_free;
	out->empty_cache = api_empty_cache;
	out->memset_zero = api_memset_zero;
	out->upload = api_upload;
	out->upload_widen = api_upload_widen;
	out->download = api_download;
	out->download_async = api_download_async;
	out->copy = api_copy;
	out->copy_2d = api_copy_2d;
	out->copy_rects = api_copy_rects;
	out->sync = api_sync;
	out->host_alloc = api_host_alloc;
	out->host_free = api_host_free;
	out->event_create = api_event_create;
	out->event_record = api_event_record;
	out->event_synchronize = api_event_synchronize;
	out->event_elapsed_ms = api_event_elapsed_ms;
	out->event_destroy = api_event_destroy;
	out->graph_begin = api_graph_begin;
	out->graph_end = api_graph_end;
	out->graph_replay = api_graph_replay;
	out->graph_destroy = api_graph_destroy;
	out->embedding = di_op_embedding;
	out->rms_norm = di_op_rms_norm;
	out->linear = di_op_linear;
	out->linear_input_dtype = di_op_linear_input_dtype;
	out->silu_mul = di_op_silu_mul;
	out->gated_mlp = di_op_gated_mlp;
	out->add = di_op_add;
	out->concat = di_op_concat;
	out->split_columns = di_op_split_columns;
	out->rope = di_op_rope;
	out->write_cache = di_op_write_cache;
	out->attention = di_op_attention;
	out->mla_attention = di_op_mla_attention;
	out->moe_route = di_op_moe_route;
	out->moe = di_op_moe;
	out->resolve_placeholders = di_op_resolve_placeholders;
	out->logits = di_op_logits;
	out->sample = di_op_sample;
	out->qkv_prepare = di_op_qkv_prepare;
	out->shift_accepted = di_op_shift_accepted;
	out->token_mask = di_op_token_mask;
	out->argmax = di_op_argmax;
	out->accept_drafts = di_op_accept_drafts;
	/* sliding-window rings, attention sinks, Gemma and gpt-oss operations */
	out->attention_sinks = di_op_attention_sinks;
	out->ring_attention = di_op_ring_attention;
	out->scale = di_op_scale;
	out->gelu_tanh_mul = di_op_gelu_tanh_mul;
	out->softcap = di_op_softcap;
	out->moe_clamped_swiglu = di_op_moe_clamped_swiglu;
	/* FP8 block-scaled weights */
	out->fp8_linear = di_op_fp8_linear;
	out->fp8_moe = di_op_fp8_moe;
	out->fp8_dequant = di_op_fp8_dequant;
	out->fp8_lt_peak = di_op_fp8_lt_peak;
	// MLA over 16- and 8-bit latent caches.
	out->mla_write_cache = di_op_mla_write_cache;
	out->mla_prepare = di_op_mla_prepare;
	out->moe_set_add = di_op_moe_set_add;
	out->moe_set_route = di_op_moe_set_route;
	out->embed_norm_concat = di_op_embed_norm_concat;
	out->gated_linear = di_op_gated_linear;
	out->mla_attention_tc = di_op_mla_attention_tc;
	out->mla_latent_attention = di_op_mla_latent_attention;
	/* MXFP4 expert weights */
	out->moe_clamped_swiglu_mxfp4 = di_op_moe_clamped_swiglu_mxfp4;
	/* block-quantized weights */
	out->quant_linear = di_op_quant_linear;
	out->quant_logits = di_op_quant_logits;
	out->quant_embedding = di_op_quant_embedding;
	out->quant_moe = di_op_quant_moe;
	out->quant_dequant = di_op_quant_dequant;
	/* MLA prefill rows in the non-absorbed form */
	out->mla_attention_pf = di_op_mla_attention_pf;
	return DI_OK;
}
