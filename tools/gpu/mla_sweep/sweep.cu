// sweep.cu: times shapes of the MLA latent kernel (di_mla_tc_k) against an
// older revision's kernel and a device-to-device copy, in one process, on
// DeepSeek-V2-Lite's layer: 16 heads, kv_lora_rank 512, rope 64, 4096 keys a
// row in blocks of 64, batch 64 (8 and 1 too, and one row of 384 keys, a
// V2-Lite decode row at batch 1), over F16 and FP8 latent caches. Each
// variant is first checked against the baseline on rows of 253..4096 keys
// over a shuffled block table: max|diff| / max|baseline| of the combined
// output, whether its bits equal the baseline's and the first listed
// variant's (=1st: two revisions of one arithmetic), and whether its 1, 2
// and 4 output slices give the same bits. Built and run by run.sh.
//
//   sweep                 the whole table
//   sweep --ncu NAME CDT  one warm-up and one timed launch of variant NAME
//   sweep --ncu1 NAME CDT the same on the one row of 384 keys
//                         (CDT 0: F16, 1: FP8) at batch 64, for ncu
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "internal.h"
#include "sweep.h"

// The kernel files' host entry points call these; the sweep never does.
int di_fail(di_ctx *, int code, const char *, ...) { return code; }
int di_cuda_fail(di_ctx *, cudaError_t, const char *) { return DI_ERR_CUDA; }
int di_check_launch(di_ctx *, const char *) { return DI_OK; }
int di_scratch(di_ctx *, size_t, void **) { return DI_ERR_OOM; }
void di_scratch_free(di_ctx *, void *) {}

#define V(n)                                                                                                          \
	extern "C" int n(int, int, int, const SweepArgs *);                                                                 \
	extern "C" int n##_info(int, int *, int *, int *);
#include "variants.inc"
#undef V

struct Variant {
	const char *name;
	sweep_run_fn run;
	sweep_info_fn info;
};
static const Variant variants[] = {
#define V(n) {#n, n, n##_info},
#include "variants.inc"
#undef V
};
static const int num_variants = sizeof(variants) / sizeof(variants[0]);

#define CK(x)                                                                                                         \
	do {                                                                                                              \
		cudaError_t e_ = (x);                                                                                         \
		if (e_ != cudaSuccess) {                                                                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
			exit(1);                                                                                                  \
		}                                                                                                             \
	} while (0)

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}
__device__ __forceinline__ uint32_t hash64(uint64_t i, uint32_t seed) {
	return hash32((uint32_t)i ^ hash32((uint32_t)(i >> 32) ^ hash32(seed)));
}
// uniform in [-1, 1)
__device__ __forceinline__ float urand(uint64_t i, uint32_t seed) {
	return (float)(hash64(i, seed) >> 8) * (2.f / 16777216.f) - 1.f;
}

__global__ void fill_half(__half *p, size_t n, uint32_t seed, float scale) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2half_rn(urand(i, seed) * scale);
}

// fill_f8: packed 8-bit rows (kvl E4M3 bytes, never NaN; rope halves;
// kvl / 128 scales in [0.002, 0.004); zero padding to rb).
__global__ void fill_f8(unsigned char *c, size_t rows, int kvl, int rope, int rb, uint32_t seed) {
	for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
		unsigned char *row = c + r * rb;
		for (int e = threadIdx.x; e < kvl; e += blockDim.x) {
			uint32_t b = hash64(r * kvl + e, seed) & 0xffu;
			if ((b & 0x7fu) == 0x7fu) b &= 0xfeu;
			row[e] = (unsigned char)b;
		}
		__half *rp = reinterpret_cast<__half *>(row + kvl);
		for (int e = threadIdx.x; e < rope; e += blockDim.x) rp[e] = __float2half_rn(urand(r * rope + e, seed ^ 0x55u));
		float *sc = reinterpret_cast<float *>(row + kvl + 2 * rope);
		for (int e = threadIdx.x; e < kvl / 128; e += blockDim.x) sc[e] = 0.003f + 0.001f * urand(r * 8 + e, seed ^ 0x77u);
		for (int e = kvl + 2 * rope + 4 * (kvl / 128) + threadIdx.x; e < rb; e += blockDim.x) row[e] = 0;
	}
}

// read_probe: reads n 16-byte words, four loads in flight a thread, and
// keeps their xor so that nothing is optimized away.
__global__ void read_probe(const uint4 *p, size_t n, unsigned *sink) {
	uint32_t acc = 0;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
		uint4 v[4];
#pragma unroll
		for (int u = 0; u < 4; u++) v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
		for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
	}
	if (acc == 0x12345678u) atomicAdd(sink, 1u);
}

static int pick_d(size_t pairs) { return pairs <= 8 ? 4 : (pairs <= 32 ? 2 : 1); }

// nsplit as di_mla_nsplit gives it (unchanged by the sweep).
static int mla_nsplit(int max_keys, int num_heads) {
	const int short_keys = max_keys < 512 ? max_keys : 512;
	int n = (short_keys + 127) / 128;
	if (max_keys > 512) {
		const int mn = (32 * num_heads + 127) / 128 * 128, lo = mn > 128 ? mn : 128;
		const int k = (max_keys + lo - 1) / lo;
		if (k > n) n = k;
	}
	if (n < 1) n = 1;
	return n > 32 ? 32 : n;
}

struct Meta {
	int *cu, *seqlens, *bt;
	int per; // blocks a sequence's table holds
	std::vector<int> keys;
};
static Meta make_meta(int batch, int max_keys, int block_size, bool shuffled, std::mt19937 &rng) {
	const int per = max_keys / block_size, nblocks = batch * per;
	std::vector<int> cu(batch + 1), sk(batch), bt(nblocks), perm(nblocks);
	for (int i = 0; i < nblocks; i++) perm[i] = i;
	if (shuffled) std::shuffle(perm.begin(), perm.end(), rng);
	Meta m;
	for (int s = 0; s < batch; s++) {
		cu[s + 1] = s + 1;
		sk[s] = shuffled ? max_keys - 61 * s : max_keys;
		for (int j = 0; j < per; j++) bt[s * per + j] = perm[s * per + j];
	}
	m.keys = sk;
	m.per = per;
	CK(cudaMalloc(&m.cu, cu.size() * 4));
	CK(cudaMalloc(&m.seqlens, sk.size() * 4));
	CK(cudaMalloc(&m.bt, bt.size() * 4));
	CK(cudaMemcpy(m.cu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(m.seqlens, sk.data(), sk.size() * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(m.bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
	return m;
}

static float median(std::vector<float> v) {
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

// time_ms: the median over 5 trials of the mean time of reps calls.
template <typename F> static float time_ms(F f, int reps) {
	for (int w = 0; w < 3; w++) f();
	CK(cudaDeviceSynchronize());
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	std::vector<float> t;
	for (int trial = 0; trial < 5; trial++) {
		CK(cudaEventRecord(e0));
		for (int r = 0; r < reps; r++) f();
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		float ms = 0;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		t.push_back(ms / reps);
	}
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	return median(t);
}

static void run_or_die(const Variant &v, int cdt, int d, int mode, const SweepArgs *a) {
	const int e = v.run(cdt, d, mode, a);
	if (e != 0) {
		fprintf(stderr, "%s (cdt %d, d %d): %s\n", v.name, cdt, d, cudaGetErrorString((cudaError_t)e));
		exit(1);
	}
}

int main(int argc, char **argv) {
	const int B = 64, K = 4096, H = 16, KVL = 512, ROPE = 64, BS = 64;
	const char *ncu_name = nullptr;
	int ncu_cdt = 0;
	bool ncu_short = false;
	if (argc >= 4 && (strcmp(argv[1], "--ncu") == 0 || strcmp(argv[1], "--ncu1") == 0))
		ncu_name = argv[2], ncu_cdt = atoi(argv[3]), ncu_short = argv[1][5] == '1';
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	const int rb16 = (KVL + ROPE) * 2, rb8 = (KVL + 2 * ROPE + 4 * (KVL / 128) + 15) / 16 * 16;
	const size_t rows_cache = (size_t)B * K;
	unsigned char *c16, *c8;
	__half *ql;
	__half *po;
	float2 *pml;
	float *olat;
	unsigned *check, *sink;
	const int nsplit = mla_nsplit(K, H);
	CK(cudaMalloc(&c16, rows_cache * rb16));
	CK(cudaMalloc(&c8, rows_cache * rb8));
	CK(cudaMalloc(&ql, (size_t)B * H * (KVL + ROPE) * 2));
	CK(cudaMalloc(&po, (size_t)B * H * nsplit * KVL * 2));
	CK(cudaMalloc(&pml, (size_t)B * H * nsplit * sizeof(float2)));
	CK(cudaMalloc(&olat, (size_t)B * H * KVL * 4));
	CK(cudaMalloc(&check, 4));
	CK(cudaMalloc(&sink, 4));
	CK(cudaMemset(check, 0, 4));
	fill_half<<<4096, 256>>>(reinterpret_cast<__half *>(c16), rows_cache * (KVL + ROPE), 1, 1.f);
	fill_f8<<<8192, 256>>>(c8, rows_cache, KVL, ROPE, rb8, 2);
	fill_half<<<256, 256>>>(ql, (size_t)B * H * (KVL + ROPE), 3, 0.1f);
	CK(cudaGetLastError());
	std::mt19937 rng(7);
	const Meta flat = make_meta(B, K, BS, false, rng), mixed = make_meta(B, K, BS, true, rng);
	// A decode row of DeepSeek-V2-Lite's engine benchmark (256 + 128 keys):
	// batch 1 there is latency, not bandwidth.
	const int KS = 384;
	const Meta short1 = make_meta(1, KS, BS, false, rng);
	auto args = [&](const Meta &m, int cdt, int rows, int splits = 0) {
		SweepArgs a;
		a.po = po, a.pml = pml, a.olat = olat, a.ql = ql, a.cache = cdt ? c8 : c16;
		a.cu = m.cu, a.seqlens_k = m.seqlens, a.block_tables = m.bt;
		a.num_seqs = (int)m.keys.size(), a.max_blocks = m.per, a.block_size = BS, a.num_blocks = B * (K / BS);
		a.num_heads = H, a.rope = ROPE, a.rows = rows, a.nsplit = splits ? splits : nsplit, a.check = check;
		return a;
	};
	CK(cudaDeviceSynchronize());

	if (ncu_name) {
		for (int v = 0; v < num_variants; v++) {
			if (strcmp(variants[v].name, ncu_name) != 0) continue;
			const SweepArgs a = ncu_short ? args(short1, ncu_cdt, 1, mla_nsplit(KS, H)) : args(flat, ncu_cdt, B);
			const int d = ncu_short ? pick_d(1) : 1, mode = ncu_short ? 3 : 1; // the short row: with its combine
			run_or_die(variants[v], ncu_cdt, d, mode, &a);
			run_or_die(variants[v], ncu_cdt, d, mode, &a);
			CK(cudaDeviceSynchronize());
			return 0;
		}
		fprintf(stderr, "no variant %s\n", ncu_name);
		return 1;
	}

	// The ceilings: a device-to-device copy (bytes read + written) and a plain read of the F16 cache.
	double copy_gbs, read_gbs;
	{
		const size_t n = (size_t)1 << 30;
		void *a, *b;
		CK(cudaMalloc(&a, n));
		CK(cudaMalloc(&b, n));
		CK(cudaMemset(a, 1, n));
		const float ms = time_ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); }, 10);
		copy_gbs = 2.0 * n / (ms / 1e3) / 1e9;
		CK(cudaFree(a));
		CK(cudaFree(b));
		const size_t words = rows_cache * rb16 / 16;
		const float mr = time_ms([&] { read_probe<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4 *>(c16), words, sink); }, 10);
		read_gbs = words * 16.0 / (mr / 1e3) / 1e9;
	}
	printf("device %s, %d SMs; cudaMemcpy D2D 1 GiB: %.0f GB/s (read + written); plain read of the F16 cache (%.0f MB): %.0f GB/s\n",
	       prop.name, prop.multiProcessorCount, copy_gbs, rows_cache * rb16 / 1e6, read_gbs);

	struct Row {
		std::string name;
		int regs, local, smem;
		float us64k, us64, us8, us1, us1s;
		double err;
		bool same_base, same_d, same_first;
	};
	for (int cdt = 0; cdt < 2; cdt++) {
		const int rb = cdt ? rb8 : rb16;
		const size_t n_ol = (size_t)B * H * KVL;
		std::vector<float> ref(n_ol), got(n_ol), got1(n_ol), first; // first: variant 1's output (d = 1)
		// The reference: variant 0 (the baseline) over the mixed rows.
		{
			const SweepArgs a = args(mixed, cdt, B);
			CK(cudaMemset(olat, 0xff, n_ol * 4));
			run_or_die(variants[0], cdt, 1, 3, &a);
			CK(cudaMemcpy(ref.data(), olat, n_ol * 4, cudaMemcpyDeviceToHost));
		}
		double ref_max = 0;
		for (float v : ref) ref_max = std::max(ref_max, (double)fabsf(v));
		std::vector<Row> rows;
		for (int v = 0; v < num_variants; v++) {
			Row r;
			r.name = variants[v].name;
			variants[v].info(cdt, &r.regs, &r.local, &r.smem);
			r.err = 0;
			r.same_base = r.same_d = r.same_first = true;
			for (int d : {1, 2, 4}) {
				const SweepArgs a = args(mixed, cdt, B);
				CK(cudaMemset(olat, 0xff, n_ol * 4));
				CK(cudaMemset(po, 0xff, (size_t)B * H * nsplit * KVL * 2));
				run_or_die(variants[v], cdt, d, 3, &a);
				CK(cudaDeviceSynchronize());
				CK(cudaMemcpy(got.data(), olat, n_ol * 4, cudaMemcpyDeviceToHost));
				double md = 0;
				for (size_t k = 0; k < n_ol; k++) {
					const double df = fabs((double)got[k] - (double)ref[k]);
					md = std::isnan(df) ? INFINITY : std::max(md, df);
				}
				r.err = std::max(r.err, md / ref_max);
				if (memcmp(got.data(), ref.data(), n_ol * 4) != 0) r.same_base = false;
				if (d == 1) {
					got1 = got;
					if (v == 1) first = got;
					if (v >= 1) r.same_first = memcmp(got.data(), first.data(), n_ol * 4) == 0;
				} else if (memcmp(got.data(), got1.data(), n_ol * 4) != 0) r.same_d = false;
			}
			const SweepArgs a64 = args(flat, cdt, B), a8 = args(flat, cdt, 8), a1 = args(flat, cdt, 1);
			r.us64k = 1e3f * time_ms([&] { run_or_die(variants[v], cdt, pick_d(B), 1, &a64); }, 20);
			r.us64 = 1e3f * time_ms([&] { run_or_die(variants[v], cdt, pick_d(B), 3, &a64); }, 20);
			r.us8 = 1e3f * time_ms([&] { run_or_die(variants[v], cdt, pick_d(8), 3, &a8); }, 50);
			r.us1 = 1e3f * time_ms([&] { run_or_die(variants[v], cdt, pick_d(1), 3, &a1); }, 50);
			const SweepArgs a1s = args(short1, cdt, 1, mla_nsplit(KS, H));
			r.us1s = 1e3f * time_ms([&] { run_or_die(variants[v], cdt, pick_d(1), 3, &a1s); }, 50);
			rows.push_back(r);
			CK(cudaDeviceSynchronize());
		}
		unsigned chk = 0;
		CK(cudaMemcpy(&chk, check, 4, cudaMemcpyDeviceToHost));
		auto gbs = [&](int batch, float us) { return batch * (double)K * rb / (us * 1e-6) / 1e9; };
		printf("\n%s cache (%d bytes a row), batch 64 x 4096 keys = %.1f MB; copy %.0f GB/s; check word %u\n",
		       cdt ? "FP8" : "F16", rb, B * (double)K * rb / 1e6, copy_gbs, chk);
		printf("%-22s %4s %5s %6s | %-25s | %-25s | %-14s | %-14s | %-10s | %-8s %-5s %-5s %-5s\n", "variant", "regs", "spill",
		       "smem", "b64 kernel: us GB/s %copy", "b64 +combine: us GB/s %", "b8 +comb GB/s", "b1 +comb GB/s", "b1 384k us",
		       "err", "=base", "=d", "=1st");
		auto v_first = [&](const Row &r) {
			return r.name == variants[0].name || (num_variants > 1 && r.name == variants[1].name) ? "-"
			                                                                                     : (r.same_first ? "yes" : "NO");
		};
		for (const Row &r : rows)
			printf("%-22s %4d %5d %6d | %7.1f %6.0f %5.1f%%     | %7.1f %6.0f %5.1f%%     | %6.0f %5.1f%% | %6.0f %5.1f%% | %10.1f | %.2e %-5s %-5s %-5s\n",
			       r.name.c_str(), r.regs, r.local, r.smem, r.us64k, gbs(B, r.us64k), 100 * gbs(B, r.us64k) / copy_gbs,
			       r.us64, gbs(B, r.us64), 100 * gbs(B, r.us64) / copy_gbs, gbs(8, r.us8), 100 * gbs(8, r.us8) / copy_gbs,
			       gbs(1, r.us1), 100 * gbs(1, r.us1) / copy_gbs, r.us1s, r.err, r.same_base ? "yes" : "NO", r.same_d ? "yes" : "NO",
			       v_first(r));
		const Row *best = nullptr;
		for (const Row &r : rows)
			if (r.err < 1e-2 && r.same_d && r.name != variants[0].name && (!best || r.us64 < best->us64)) best = &r;
		if (best) printf("BEST %s %s %.1f\n", cdt ? "FP8" : "F16", best->name.c_str(), best->us64);
	}
	return 0;
}
