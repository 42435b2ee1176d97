// sample.cu: sampling on the device (kernels.DeviceSampler): one token per
// logits row, so that a step's logits never leave the device.
//
// The algorithm is the host reference sampler's (kernels/sampling, whose
// package doc gives the order of operations), step by step:
//
//  1. The row's edits (mask, bias, penalties) are applied in place, one
//     thread per edited token, in the host's unfused float32 arithmetic
//     (__fadd_rn and friends, so nvcc cannot contract them into FMAs).
//  2. One pass takes the maximum (the lowest id on ties) and finds NaN, +Inf
//     and rows that are all -Inf (reported per row and by DI_CHECK_SAMPLE).
//     A greedy row ends here: its token is exact.
//  3. The cut: min-p's ceil32(zmax + T ln(min_p)) (the product comes from
//     the host, so only the add and the rounding run here) and top-k's K-th
//     largest logit, an exact radix select on the host's sort keys (11, 11
//     and 10 bits; the first digit's histogram is built in pass 2).
//  4. The survivors (logit >= cut) get the host's float64 weights
//     exp((z - zmax) * (1/T)), rounded to 64-bit integers in units of
//     2^-43 (a weight below e^-31 is 0). Every sum below is an exact
//     integer sum, so its value does not depend on the order of the
//     additions: the result is deterministic and batch-invariant, and
//     parallel scans give the sequential walk's answer.
//  5. Top-p: the host's 512 bins of 1/16 nat, its boundary bin with its
//     margins, its kept rule (a token is kept while the mass before it in
//     the order by logit descending, ties by lower id, is below top_p times
//     the total) and its walk order for the draw: the tokens of the bins
//     surely kept in index order, then the rest in sorted order.
//  6. The draw: u = Philox4x32-10(seed, step) as kernels/sampling.Uniform,
//     target = floor(u * kept), and the first token of the walk whose
//     running mass exceeds the target. In index order that is a scan over
//     per-warp masses and one warp's walk; in sorted order a weighted radix
//     select (3 passes of 11/11/10 bits over order keys, mass histograms),
//     then the position among tokens of equal logit by id.
//
// Where the tokens can differ from the host's: the host sums float64
// weights in walk order, this kernel sums them rounded to 2^-43; and CUDA's
// exp may differ from Go's math.Exp in the last bit. Both move a token's
// interval of the CDF by about 1e-12 of the total or less, so a random row's
// token differs only when the draw or the top-p limit falls that close to
// an interval's end (kernels/cuda's TestGPUSample measures the agreement).
// Greedy rows, the edits, the cut and the top-p bins are exact.
//
// One block of DS_THREADS threads per row. Each pass over the row splits it
// into one contiguous chunk per warp (lanes read consecutive elements, 16
// bytes at a time when the row is aligned); a random row whose survivors
// fit max_candidates is compacted, in index order, into shared memory
// first, so its later passes do not read the row again.
//
// One block a row would leave most of the device idle for a call of few
// rows, and for many rows give some multiprocessors two whole rows of
// float64 exponentials while others have one: the rows are cut into chunks
// (DsSplit; ctx->sample_split, ctx->sample_min_chunks), whose blocks apply
// the edits and take the statistics of step 2 (di_sample_stats_k) and then
// the survivors' integer masses (di_sample_mass_k); the row's block reads
// those instead of passing over the row, and for a row without top-k or
// top-p walks only the chunk where the draw falls. Exact integer masses
// make the token the same as one block's.
#include <math_constants.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "common.cuh"

typedef unsigned long long u64;

#define DS_THREADS 512
#define DS_WARPS (DS_THREADS / 32)
#define DS_RADIX 2048                // buckets of an 11-bit digit
#define DS_BINS 512                  // top-p bins, as kernels/sampling's topPNumBins
#define DS_MAX_CANDIDATES 4096       // survivors held in shared memory
#define DS_Q_ONE 8796093022208.0     // 2^43: the integer weight of probability ratio 1
#define DS_Q_MIN_LOG (-31.0)         // exp(-31) * 2^43 < 0.5: weight 0
#define DS_MAX_CHUNKS 64             // spans of a row in split mode

// ---------------------------------------------------------------- helpers

// ds_sort_key maps a float to a key of the same order (-Inf lowest, -0 just
// below +0), as kernels/sampling's sortKey; ds_from_key inverts it.
__device__ __forceinline__ unsigned ds_sort_key(float v) {
	const unsigned b = __float_as_uint(v);
	return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float ds_from_key(unsigned k) {
	return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// ds_order_key is the key of the top-p order, where -0 and +0 are equal
// (the host's sort compares values, then ids).
__device__ __forceinline__ unsigned ds_order_key(float v) { return ds_sort_key(v == 0.f ? 0.f : v); }

// ds_max is Go's max for two non-NaN float32s (+0 above -0).
__device__ __forceinline__ float ds_max(float a, float b) {
	return (a > b || (a == b && !signbit(a))) ? a : b;
}

// ds_ceil32 is the smallest float f with (double)f >= x (kernels/sampling's ceil32).
__device__ __forceinline__ float ds_ceil32(double x) {
	float f = __double2float_rn(x);
	if ((double)f < x) f = nextafterf(f, CUDART_INF_F);
	return f;
}

// ds_uniform is kernels/sampling.Uniform(seed, step, DrawSample): Philox4x32-10
// with key (seed lo, seed hi) and counter (step lo, step hi, 0, 0); the
// first two output words, high first, give 53 bits.
__device__ __forceinline__ double ds_uniform(u64 seed, u64 step) {
	unsigned c0 = (unsigned)step, c1 = (unsigned)(step >> 32), c2 = 0, c3 = 0;
	unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
#pragma unroll
	for (int round = 0; round < 10; round++) {
		if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
		const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
		const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
		const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
		c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
	}
	const u64 bits = (((u64)c0 << 32) | c1) >> 11;
	return (double)bits * 1.1102230246251565404236316680908203125e-16; // 2^-53
}

// What every pass of a random row needs.
struct DsRow {
	double zmax, inv_temp;
	float cut;
	int top_p;                      // top-p is on
	int first_sorted, boundary;     // top-p bins: [0, first_sorted) walk in index order,
	                                // [first_sorted, boundary] in sorted order
};

// ds_weight is the survivor's weight exp((z - zmax) * (1/T)) (the host's
// float64 expression) in units of 2^-43, rounded to nearest.
__device__ __forceinline__ u64 ds_weight(float v, const DsRow &c) {
	const double d = ((double)v - c.zmax) * c.inv_temp;
	if (!(d >= DS_Q_MIN_LOG)) return 0;
	return __double2ull_rn(exp(d) * DS_Q_ONE);
}

// ds_bin is kernels/sampling's topPBin.
__device__ __forceinline__ int ds_bin(float v, const DsRow &c) {
	const double d = (c.zmax - (double)v) * c.inv_temp * 16.0;
	return d >= DS_BINS - 1 ? DS_BINS - 1 : (int)d;
}

__device__ __forceinline__ u64 ds_warp_incl(u64 v) {
	const int lane = threadIdx.x & 31;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const u64 t = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= o) v += t;
	}
	return v;
}

// ---------------------------------------------------------------- sources

// The items of a row: the logits row in global memory (item i is token i),
// read V elements per lane at a time, or the survivors compacted into
// shared memory in index order with their weights.
template <int V> struct DsGlobal {
	static constexpr int VEC = V;
	const float *z;
	int n;
	int base = 0; // the id of item 0
	// span is items [lo, lo+n) as a source of their own; lo must keep z's
	// 16-byte alignment (a multiple of 4 items), which ds_chunk's bounds do.
	__device__ __forceinline__ DsGlobal span(int lo, int m) const { return DsGlobal{z + lo, m, base + lo}; }
	__device__ __forceinline__ void load(int i, int hi, float (&v)[V]) const {
		if constexpr (V == 4) {
			if (i + 3 < hi) {
				const float4 f = *reinterpret_cast<const float4 *>(z + i);
				v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
				return;
			}
		}
#pragma unroll
		for (int k = 0; k < V; k++) v[k] = i + k < hi ? z[i + k] : -CUDART_INF_F;
	}
	__device__ __forceinline__ int id(int i) const { return base + i; }
	__device__ __forceinline__ u64 weight(int, float v, const DsRow &c) const { return ds_weight(v, c); }
};

struct DsCands {
	static constexpr int VEC = 1;
	const float *z;
	const int *ids;
	const u64 *q;
	int n;
	__device__ __forceinline__ DsCands span(int lo, int m) const { return DsCands{z + lo, ids + lo, q + lo, m}; }
	__device__ __forceinline__ void load(int i, int hi, float (&v)[1]) const { v[0] = i < hi ? z[i] : -CUDART_INF_F; }
	__device__ __forceinline__ int id(int i) const { return ids[i]; }
	__device__ __forceinline__ u64 weight(int i, float, const DsRow &) const { return q[i]; }
};

// ds_chunk is warp w's share [lo, hi) of n items: contiguous chunks in warp
// order, each a multiple of 32*V items.
template <int V> __device__ __forceinline__ void ds_chunk(int n, int w, int &lo, int &hi) {
	constexpr int STEP = 32 * V;
	const int c = (n + DS_WARPS * STEP - 1) / (DS_WARPS * STEP) * STEP;
	lo = min(n, w * c);
	hi = min(n, lo + c);
}

// ds_each calls f(i, v) for every item this thread owns, in increasing i;
// the warps together visit every item once.
template <class S, class F> __device__ __forceinline__ void ds_each(const S &s, F &&f) {
	constexpr int V = S::VEC;
	const int lane = threadIdx.x & 31;
	int lo, hi;
	ds_chunk<V>(s.n, threadIdx.x >> 5, lo, hi);
	// Unrolled so that several loads of each lane are in flight at once.
#pragma unroll 4
	for (int base = lo; base < hi; base += 32 * V) {
		const int i = base + lane * V;
		float v[V];
		s.load(i, hi, v);
#pragma unroll
		for (int k = 0; k < V; k++)
			if (i + k < hi) f(i + k, v[k]);
	}
}

// ---------------------------------------------------------------- shared state

struct DsShared {
	u64 red[32];
	u64 wm[DS_WARPS]; // per-warp masses (or counts) of the last predicate
	float bv[DS_WARPS];
	int bi[DS_WARPS], nan_i[DS_WARPS];
	int walk_warp, token, digit;
	u64 walk_t, before;
	int boundary, first_sorted;
	u64 mass_r1, sorted_mass;
};

// Dynamic shared memory: hist (u64[DS_RADIX]), bins (u64[DS_BINS]),
// candidate weights (u64[cap]), minid (unsigned[DS_RADIX]), candidate
// logits (float[cap]) and ids (int[cap]).
static size_t ds_smem_bytes(int cap) {
	return sizeof(u64) * (DS_RADIX + DS_BINS + (size_t)cap) + sizeof(unsigned) * DS_RADIX + 8 * (size_t)cap;
}

// ds_find_desc: over buckets h[0, nb) taken from the highest down, the first
// at which the running sum reaches target (>= 1); -1 when the total is
// below it. *before is the sum of the buckets above the one found. Called
// by a whole warp; nb is a multiple of 32.
__device__ int ds_find_desc(const u64 *h, int nb, u64 target, u64 *before) {
	const int lane = threadIdx.x & 31, per = nb / 32;
	const int top = nb - lane * per; // lane covers [top - per, top), walked downwards
	u64 s = 0;
	for (int b = top - 1; b >= top - per; b--) s += h[b];
	const u64 incl = ds_warp_incl(s);
	const unsigned hit = __ballot_sync(0xffffffffu, incl >= target);
	if (!hit) return -1;
	const int l = __ffs(hit) - 1;
	int found = -1;
	u64 bf = 0;
	if (lane == l) {
		u64 a = incl - s;
		for (int b = top - 1; b >= top - per; b--) {
			if (a + h[b] >= target) {
				found = b, bf = a;
				break;
			}
			a += h[b];
		}
	}
	*before = __shfl_sync(0xffffffffu, bf, l);
	return __shfl_sync(0xffffffffu, found, l);
}

// ds_warp_mass stores in sh.wm each warp's mass of the items that pred keeps.
template <class S, class P> __device__ void ds_warp_mass(const S &s, P pred, const DsRow &c, DsShared &sh) {
	u64 m = 0;
	ds_each(s, [&](int i, float v) {
		if (pred(v)) m += s.weight(i, v, c);
	});
	m = di_warp_sum(m);
	__syncthreads();
	if ((threadIdx.x & 31) == 0) sh.wm[threadIdx.x >> 5] = m;
	__syncthreads();
}

// ds_walk_warp finds, from the per-warp masses in sh.wm, the warp chunk
// where the running mass first exceeds t: it returns the warp (-1 when the
// total is at most t) and the mass left to walk inside its chunk in *rest.
__device__ int ds_walk_warp(u64 t, u64 *rest, DsShared &sh) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	__syncthreads(); // every thread has read the previous sh.walk_*
	if (warp == 0) {
		const u64 m = lane < DS_WARPS ? sh.wm[lane] : 0;
		const u64 incl = ds_warp_incl(m);
		const unsigned hit = __ballot_sync(0xffffffffu, incl > t);
		const int l = hit ? __ffs(hit) - 1 : -1;
		if (lane == 0) sh.walk_warp = l;
		if (lane == l) sh.walk_t = t - (incl - m);
	}
	__syncthreads();
	*rest = sh.walk_t;
	return sh.walk_warp;
}

// ds_walk returns the first item, in index order, among those pred keeps
// whose running mass exceeds t (the inverse-CDF walk), or -1 when their
// total is at most t. sh.wm holds the per-warp masses of pred. Two levels,
// so that no warp walks a long span alone: the warp chunk holding the
// draw is cut into one sub-chunk a warp, every warp takes its sub-chunk's
// mass (its weights a second time: 1/DS_WARPS of the items), and one warp
// walks the sub-chunk holding the draw. The masses are exact integers, so
// the token is the one a single walk over the items finds.
template <class S, class P> __device__ int ds_walk(const S &s, P pred, const DsRow &c, u64 t, DsShared &sh) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	constexpr int V = S::VEC;
	u64 rest;
	int w = ds_walk_warp(t, &rest, sh);
	if (w < 0) return -1; // uniform over the block
	int lo, hi;
	ds_chunk<V>(s.n, w, lo, hi);
	const S part = s.span(lo, hi - lo);
	ds_warp_mass(part, pred, c, sh);
	w = ds_walk_warp(rest, &rest, sh);
	if (w < 0) return -1; // cannot happen: the chunk's mass exceeds rest
	if (warp == 0 && lane == 0) sh.token = -1;
	__syncthreads();
	if (warp == w) {
		ds_chunk<V>(part.n, w, lo, hi);
		const u64 tt = rest;
		u64 acc = 0;
		for (int base = lo; base < hi; base += 32 * V) {
			const int i = base + lane * V;
			float v[V];
			part.load(i, hi, v);
			u64 q[V], sum = 0;
#pragma unroll
			for (int k = 0; k < V; k++) {
				q[k] = (i + k < hi && pred(v[k])) ? part.weight(i + k, v[k], c) : 0;
				sum += q[k];
			}
			const u64 incl = ds_warp_incl(sum);
			const unsigned hit = __ballot_sync(0xffffffffu, acc + incl > tt);
			if (hit) {
				if (lane == __ffs(hit) - 1) {
					u64 a = acc + incl - sum;
#pragma unroll
					for (int k = 0; k < V; k++) {
						a += q[k];
						if (a > tt) {
							sh.token = part.id(i + k);
							break;
						}
					}
				}
				break;
			}
			acc += __shfl_sync(0xffffffffu, incl, 31);
		}
	}
	__syncthreads();
	const int tok = sh.token;
	__syncthreads();
	return tok;
}

// ds_select returns, among the items pred keeps ordered by logit descending
// (-0 equal to +0) and then by id, the first whose running mass exceeds t:
// its id in *token and the running mass through it in *incl. It returns
// false when their total is at most t. A weighted radix select over the
// order keys (3 passes), then the position among the tokens of equal logit.
template <class S, class P>
__device__ bool ds_select(const S &s, P pred, const DsRow &c, u64 t, int *token, u64 *incl, u64 *hist,
                          unsigned *minid, DsShared &sh) {
	unsigned prefix = 0;
	u64 above = 0;
	int d = -1;
#pragma unroll 1
	for (int pass = 0; pass < 3; pass++) {
		const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
		const int nb = pass == 2 ? 1024 : DS_RADIX;
		const int high = pass == 0 ? 0 : shift + (pass == 2 ? 10 : 11); // digits already chosen
		for (int b = threadIdx.x; b < nb; b += blockDim.x) {
			hist[b] = 0;
			if (pass == 2) minid[b] = UINT_MAX;
		}
		__syncthreads();
		ds_each(s, [&](int i, float v) {
			if (!pred(v)) return;
			const unsigned key = ds_order_key(v);
			if (pass > 0 && (key >> high) != (prefix >> high)) return;
			const u64 q = s.weight(i, v, c);
			if (q == 0) return;
			const int b = (key >> shift) & (nb - 1);
			atomicAdd(&hist[b], q);
			if (pass == 2) atomicMin(&minid[b], (unsigned)s.id(i));
		});
		__syncthreads();
		if (threadIdx.x < 32) {
			u64 before;
			const int f = ds_find_desc(hist, nb, t - above + 1, &before);
			if (threadIdx.x == 0) sh.digit = f, sh.before = before;
		}
		__syncthreads();
		d = sh.digit;
		if (d < 0) return false; // only in pass 0: the items' total is <= t
		above += sh.before;
		prefix |= (unsigned)d << shift;
	}
	const float zs = ds_from_key(prefix);
	const u64 qs = ds_weight(zs, c); // every item of the last bucket has this logit and weight
	const u64 rem = t - above, p = rem / qs;
	int tok = (int)minid[d];
	if (p > 0) { // not the lowest id of its logit: walk the tied items in index order
		auto tied = [&](float v) { return pred(v) && ds_order_key(v) == prefix; };
		ds_warp_mass(s, tied, c, sh);
		tok = ds_walk(s, tied, c, rem, sh);
	}
	__syncthreads(); // hist and minid are reused by the caller
	*token = tok;
	*incl = above + (p + 1) * qs;
	return true;
}

// ---------------------------------------------------------------- the draw

// ds_draw samples a random row from its survivors (items >= c.cut) in s:
// top-p, then the draw. fallback is returned if the walk finds nothing
// (it cannot, with exact sums).
template <class S>
__device__ int ds_draw(const S &s, DsRow &c, const di_sample_row &p, int fallback, u64 *hist, unsigned *minid,
                       u64 *bins, DsShared &sh) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	// The survey: the total mass, per-warp masses and the top-p bins.
	if (c.top_p) {
		for (int b = threadIdx.x; b < DS_BINS; b += blockDim.x) bins[b] = 0;
		__syncthreads();
	}
	{
		u64 m = 0;
		ds_each(s, [&](int i, float v) {
			if (v < c.cut) return;
			const u64 q = s.weight(i, v, c);
			m += q;
			if (c.top_p && q) atomicAdd(&bins[ds_bin(v, c)], q);
		});
		m = di_warp_sum(m);
		__syncthreads();
		if (lane == 0) sh.wm[warp] = m;
		__syncthreads();
	}
	u64 total = 0;
	for (int w = 0; w < DS_WARPS; w++) total += sh.wm[w];

	u64 kept = total, mass_r1 = total;
	if (c.top_p) {
		// kernels/sampling's topP: the boundary bin is the first whose
		// cumulative mass reaches limit*(1+margin); the bins before it are
		// kept in index order unless their mass is within the margin of
		// the limit, in which case every bin up to the boundary is sorted.
		const double limit = p.top_p * (double)total;
		if (warp == 0) {
			const int per = DS_BINS / 32, b0 = lane * per;
			u64 sum = 0;
			for (int b = b0; b < b0 + per; b++) sum += bins[b];
			const u64 incl = ds_warp_incl(sum);
			const double hi_t = limit * p.top_p_hi;
			int found = -1;
			u64 below = 0, a = incl - sum;
			for (int b = b0; b < b0 + per; b++) {
				if ((double)(a + bins[b]) >= hi_t) {
					found = b, below = a;
					break;
				}
				a += bins[b];
			}
			const unsigned hit = __ballot_sync(0xffffffffu, found >= 0);
			int boundary = DS_BINS - 1;
			if (hit) {
				boundary = __shfl_sync(0xffffffffu, found, __ffs(hit) - 1);
				below = __shfl_sync(0xffffffffu, below, __ffs(hit) - 1);
			} else {
				below = __shfl_sync(0xffffffffu, incl, 31); // the host's loop ran through every bin
			}
			const int first_sorted = (double)below >= limit * p.top_p_lo ? 0 : boundary;
			u64 sorted = 0;
			for (int b = max(b0, first_sorted); b < min(b0 + per, boundary + 1); b++) sorted += bins[b];
			sorted = di_warp_sum(sorted);
			if (lane == 0) {
				sh.boundary = boundary, sh.first_sorted = first_sorted;
				sh.mass_r1 = first_sorted == boundary ? below : 0;
				sh.sorted_mass = sorted;
			}
		}
		__syncthreads();
		c.boundary = sh.boundary, c.first_sorted = sh.first_sorted;
		mass_r1 = sh.mass_r1;
		const u64 sorted_mass = sh.sorted_mass;
		// Sorted tokens are kept while the mass before them is below the
		// limit: through the first at which mass_r1 + running >= limit.
		const u64 lim = __double2ull_ru(limit);
		const u64 r_keep = lim > mass_r1 ? lim - mass_r1 - 1 : 0;
		kept = mass_r1 + sorted_mass;
		if (sorted_mass > r_keep) {
			const DsRow cc = c;
			auto sorted_pred = [cc](float v) {
				if (v < cc.cut) return false;
				const int b = ds_bin(v, cc);
				return b >= cc.first_sorted && b <= cc.boundary;
			};
			int tok;
			u64 incl;
			if (ds_select(s, sorted_pred, c, r_keep, &tok, &incl, hist, minid, sh)) kept = mass_r1 + incl;
		}
	}

	// The draw: target = floor(u * kept); the first token of the walk whose
	// running mass exceeds it.
	const double u = ds_uniform(p.seed, p.step);
	u64 t = __double2ull_rd(u * (double)kept);
	if (t >= kept) t = kept - 1;
	const DsRow cc = c;
	int token = -1;
	if (t < mass_r1) {
		auto r1 = [cc](float v) { return v >= cc.cut && (!cc.top_p || ds_bin(v, cc) < cc.first_sorted); };
		if (c.top_p) ds_warp_mass(s, r1, c, sh);
		token = ds_walk(s, r1, c, t, sh);
	} else {
		auto sorted_pred = [cc](float v) {
			if (v < cc.cut) return false;
			const int b = ds_bin(v, cc);
			return b >= cc.first_sorted && b <= cc.boundary;
		};
		u64 incl;
		if (!ds_select(s, sorted_pred, c, t - mass_r1, &token, &incl, hist, minid, sh)) token = -1;
	}
	return token >= 0 ? token : fallback;
}

// ---------------------------------------------------------------- split rows

// ds_apply_edits applies row p's edits whose tokens lie in [lo, hi), one
// thread per edit, in the host sampler's float32 arithmetic; flag reports
// edits outside the vocabulary.
__device__ __forceinline__ void ds_apply_edits(float *z, const di_sample_row &p, const di_sample_edit *edits, int vocab,
                                               int lo, int hi, bool flag, unsigned *check) {
	for (int j = threadIdx.x; j < p.num_edits; j += blockDim.x) {
		const di_sample_edit e = edits[p.edit_begin + j];
		if (e.token < 0 || e.token >= vocab) {
			if (flag) atomicOr(check, DI_CHECK_SAMPLE);
			continue;
		}
		if (e.token < lo || e.token >= hi) continue;
		float x = z[e.token];
		if (e.flags & DI_EDIT_MASK) x = -CUDART_INF_F;
		if (e.flags & DI_EDIT_BIAS) x = __fadd_rn(x, e.bias);
		if ((e.flags & DI_EDIT_SEEN) && p.penalized) {
			if (p.repetition_penalty != 1.f)
				x = x > 0.f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
			if (e.count > 0) {
				x = __fsub_rn(x, __fmul_rn(p.frequency_penalty, __int2float_rn(e.count)));
				x = __fsub_rn(x, p.presence_penalty);
			}
		}
		z[e.token] = x;
	}
}

// DsStat is a span's maximum (the lowest id among equal maxima; bi INT_MAX
// when every value is -Inf or NaN) and its lowest NaN id. Combining spans
// with ds_stat_merge in any grouping gives the row's: the same values as
// one pass over the row.
struct DsStat {
	float bv;
	int bi, nan_i;
};

// ds_stat_empty is the statistics of no values.
__device__ __forceinline__ DsStat ds_stat_empty() { return DsStat{-CUDART_INF_F, INT_MAX, INT_MAX}; }

__device__ __forceinline__ void ds_stat_add(DsStat &s, int i, float v) { // i increasing
	if (v > s.bv) s.bv = v, s.bi = i;
	else if (v != v) s.nan_i = min(s.nan_i, i);
}

__device__ __forceinline__ void ds_stat_merge(DsStat &s, float bv, int bi, int nan_i) {
	if (bv > s.bv || (bv == s.bv && bi < s.bi)) s.bv = bv, s.bi = bi;
	s.nan_i = min(s.nan_i, nan_i);
}

// ds_block_stat merges the block's threads' statistics (DS_THREADS threads).
__device__ __forceinline__ DsStat ds_block_stat(DsStat s, DsShared &sh) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		ds_stat_merge(s, __shfl_xor_sync(0xffffffffu, s.bv, o), __shfl_xor_sync(0xffffffffu, s.bi, o),
		              __shfl_xor_sync(0xffffffffu, s.nan_i, o));
	if (lane == 0) sh.bv[warp] = s.bv, sh.bi[warp] = s.bi, sh.nan_i[warp] = s.nan_i;
	__syncthreads();
	DsStat t = ds_stat_empty();
	for (int w = 0; w < (int)(blockDim.x >> 5); w++) ds_stat_merge(t, sh.bv[w], sh.bi[w], sh.nan_i[w]);
	return t;
}

// ds_row_stat merges a row's chunk statistics, in chunk order.
__device__ __forceinline__ DsStat ds_row_stat(const DsStat *stats, int chunks) {
	DsStat t = ds_stat_empty();
	for (int k = 0; k < chunks; k++) ds_stat_merge(t, stats[k].bv, stats[k].bi, stats[k].nan_i);
	return t;
}

// DsSplit is what the chunk kernels hand to di_sample_k when a call's rows
// are few: each row cut into `chunks` spans of `chunk` tokens (a multiple
// of 128), one block per span, for the passes over the whole row: the
// statistics (and the edits) in di_sample_stats_k, the survivors' exact
// integer masses in di_sample_mass_k. di_sample_k then draws a row
// without top-k or top-p from the chunk masses and one chunk's walk: the
// same token as its one-block passes (the masses are exact integers, so
// the order of the sums does not matter), with the float64 exponentials
// spread over the device instead of one multiprocessor.
struct DsSplit {
	int chunks, chunk;
	DsStat *stats; // [rows][chunks]
	u64 *mass;     // [rows][chunks]
};

template <int V>
__global__ void __launch_bounds__(DS_THREADS)
    di_sample_stats_k(float *logits, int vocab, const di_sample_row *rows, const di_sample_edit *edits, DsSplit split,
                      unsigned *check) {
	__shared__ DsShared sh;
	const int k = blockIdx.x, r = blockIdx.y;
	const di_sample_row p = rows[r];
	float *z = logits + (size_t)r * vocab;
	const int lo = k * split.chunk, hi = min(vocab, lo + split.chunk);
	ds_apply_edits(z, p, edits, vocab, lo, hi, k == 0, check);
	__syncthreads();
	DsStat st = ds_stat_empty();
	ds_each(DsGlobal<V>{z + lo, hi - lo}, [&](int i, float v) { ds_stat_add(st, lo + i, v); });
	st = ds_block_stat(st, sh);
	if (threadIdx.x == 0) split.stats[(size_t)r * split.chunks + k] = st;
}

template <int V>
__global__ void __launch_bounds__(DS_THREADS)
    di_sample_mass_k(const float *logits, int vocab, const di_sample_row *rows, DsSplit split) {
	__shared__ u64 wm[DS_WARPS];
	const int k = blockIdx.x, r = blockIdx.y;
	const di_sample_row p = rows[r];
	const DsStat st = ds_row_stat(split.stats + (size_t)r * split.chunks, split.chunks);
	const bool top_k = p.top_k > 0 && p.top_k < vocab && !p.greedy;
	const bool ok = st.nan_i == INT_MAX && st.bi != INT_MAX && st.bv != CUDART_INF_F;
	u64 m = 0;
	if (ok && !p.greedy && !top_k && !(p.top_p < 1.0)) { // as di_sample_k's cut and weights
		DsRow c;
		c.zmax = (double)st.bv, c.inv_temp = p.inv_temp;
		float cut = -FLT_MAX;
		if (p.use_min_p) cut = ds_max(cut, ds_ceil32(c.zmax + p.t_log_min_p));
		const int lo = k * split.chunk, hi = min(vocab, lo + split.chunk);
		ds_each(DsGlobal<V>{logits + (size_t)r * vocab + lo, hi - lo}, [&](int, float v) {
			if (v >= cut) m += ds_weight(v, c);
		});
	}
	m = di_warp_sum(m);
	if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
	__syncthreads();
	if (threadIdx.x == 0) {
		u64 t = 0;
		for (int w = 0; w < DS_WARPS; w++) t += wm[w];
		split.mass[(size_t)r * split.chunks + k] = t;
	}
}

// ---------------------------------------------------------------- the kernel

template <int V>
__global__ void __launch_bounds__(DS_THREADS, 2) // two rows per SM (the shared memory fits two)
    di_sample_k(int *out, float *logits, int num_rows, int vocab, const di_sample_row *rows,
                const di_sample_edit *edits, int cap, DsSplit split, unsigned *check) {
	extern __shared__ __align__(16) unsigned char ds_dyn[];
	__shared__ DsShared sh;
	u64 *hist = reinterpret_cast<u64 *>(ds_dyn);
	u64 *bins = hist + DS_RADIX;
	u64 *cq = bins + DS_BINS;
	unsigned *minid = reinterpret_cast<unsigned *>(cq + cap);
	float *cz = reinterpret_cast<float *>(minid + DS_RADIX);
	int *cid = reinterpret_cast<int *>(cz + cap);

	const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const di_sample_row p = rows[r];
	float *z = logits + (size_t)r * vocab;

	// 1. Edits, one thread per edited token (ids are distinct within a row);
	// in split mode the chunks' blocks have applied them.
	const bool in_chunks = split.chunks > 1;
	if (!in_chunks) {
		ds_apply_edits(z, p, edits, vocab, 0, vocab, true, check);
		__syncthreads();
	}

	// 2. Maximum (lowest id on ties), NaN and +Inf; top-k's first digit. In
	// split mode from the chunks' statistics.
	const DsGlobal<V> g{z, vocab};
	const bool top_k = p.top_k > 0 && p.top_k < vocab && !p.greedy;
	if (top_k) {
		for (int b = threadIdx.x; b < DS_RADIX; b += blockDim.x) hist[b] = 0;
		__syncthreads();
	}
	DsStat st;
	// Without min-p and top-k the cut is -FLT_MAX before the maximum is
	// known: this pass also counts the survivors (step 4's count, per warp).
	const bool counted = !top_k && !p.use_min_p && !in_chunks;
	if (in_chunks && !top_k) {
		st = ds_row_stat(split.stats + (size_t)r * split.chunks, split.chunks);
	} else {
		st = ds_stat_empty();
		int n = 0;
		ds_each(g, [&](int i, float v) {
			ds_stat_add(st, i, v);
			if (top_k) atomicAdd(&hist[ds_sort_key(v) >> 21], 1ull);
			if (counted) n += v >= -FLT_MAX;
		});
		st = ds_block_stat(st, sh);
		if (counted) {
			n = di_warp_sum(n);
			if (lane == 0) sh.wm[warp] = (u64)n;
			__syncthreads();
		}
	}
	const float bv = st.bv;
	const int bi = st.bi, nan_i = st.nan_i;
	int status = DI_SAMPLE_OK, index = -1;
	if (nan_i != INT_MAX) status = DI_SAMPLE_NAN, index = nan_i;
	else if (bi == INT_MAX) status = DI_SAMPLE_ALL_NEGINF;
	else if (bv == CUDART_INF_F) status = DI_SAMPLE_POSINF, index = bi;
	if (status != DI_SAMPLE_OK || p.greedy) {
		if (threadIdx.x == 0) {
			out[r] = status == DI_SAMPLE_OK ? bi : 0;
			out[num_rows + r] = status;
			out[2 * num_rows + r] = index;
			if (status != DI_SAMPLE_OK) atomicOr(check, DI_CHECK_SAMPLE);
		}
		return;
	}

	// 3. The cut: min-p, then top-k's K-th largest logit (counting repeats).
	DsRow c;
	c.zmax = (double)bv, c.inv_temp = p.inv_temp, c.top_p = p.top_p < 1.0;
	c.first_sorted = 0, c.boundary = DS_BINS - 1;
	float cut = -FLT_MAX;
	if (p.use_min_p) cut = ds_max(cut, ds_ceil32(c.zmax + p.t_log_min_p));
	if (top_k) {
		u64 k = (u64)p.top_k;
		unsigned prefix = 0;
#pragma unroll 1
		for (int pass = 0; pass < 3; pass++) {
			const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
			const int nb = pass == 2 ? 1024 : DS_RADIX;
			if (pass > 0) {
				const int high = shift + (pass == 2 ? 10 : 11);
				for (int b = threadIdx.x; b < nb; b += blockDim.x) hist[b] = 0;
				__syncthreads();
				ds_each(g, [&](int, float v) {
					const unsigned key = ds_sort_key(v);
					if ((key >> high) == (prefix >> high)) atomicAdd(&hist[(key >> shift) & (nb - 1)], 1ull);
				});
			}
			__syncthreads();
			if (threadIdx.x < 32) {
				u64 before;
				const int f = ds_find_desc(hist, nb, k, &before);
				if (threadIdx.x == 0) sh.digit = max(f, 0), sh.before = before;
			}
			__syncthreads();
			k -= sh.before;
			prefix |= (unsigned)sh.digit << shift;
			__syncthreads();
		}
		cut = ds_max(cut, ds_from_key(prefix));
	}
	c.cut = cut;

	// Split mode, no top-k or top-p: the chunks' exact masses locate the
	// draw's chunk; its tokens are walked in index order as below.
	if (in_chunks && !top_k && !c.top_p) {
		const u64 *m = split.mass + (size_t)r * split.chunks;
		u64 total = 0;
		for (int k = 0; k < split.chunks; k++) total += m[k];
		const double u = ds_uniform(p.seed, p.step);
		u64 t = __double2ull_rd(u * (double)total);
		if (t >= total) t = total - 1;
		int k = 0;
		while (k + 1 < split.chunks && t >= m[k]) t -= m[k++];
		const int lo = k * split.chunk, hi = min(vocab, lo + split.chunk);
		const DsGlobal<V> part{z + lo, hi - lo};
		const DsRow cc = c;
		auto kept = [cc](float v) { return v >= cc.cut; };
		ds_warp_mass(part, kept, c, sh);
		const int tok = ds_walk(part, kept, c, t, sh);
		if (threadIdx.x == 0) {
			out[r] = tok >= 0 ? lo + tok : bi;
			out[num_rows + r] = DI_SAMPLE_OK;
			out[2 * num_rows + r] = -1;
		}
		return;
	}

	// 4. Survivors: compacted into shared memory when they fit.
	if (!counted) {
		int n = 0;
		ds_each(g, [&](int, float v) { n += v >= cut; });
		n = di_warp_sum(n);
		__syncthreads();
		if (lane == 0) sh.wm[warp] = (u64)n;
		__syncthreads();
	}
	u64 count = 0, off = 0;
	for (int w = 0; w < DS_WARPS; w++) {
		if (w == warp) off = count;
		count += sh.wm[w];
	}
	int token;
	if (count <= (u64)cap) {
		int lo, hi;
		ds_chunk<V>(vocab, warp, lo, hi);
		for (int base = lo; base < hi; base += 32 * V) {
			const int i = base + lane * V;
			float v[V];
			g.load(i, hi, v);
			int k = 0;
#pragma unroll
			for (int j = 0; j < V; j++) k += (i + j < hi && v[j] >= cut);
			int incl = k;
#pragma unroll
			for (int o = 1; o < 32; o <<= 1) {
				const int t = __shfl_up_sync(0xffffffffu, incl, o);
				if (lane >= o) incl += t;
			}
			int pos = (int)off + incl - k;
#pragma unroll
			for (int j = 0; j < V; j++)
				if (i + j < hi && v[j] >= cut) cz[pos] = v[j], cid[pos] = i + j, pos++;
			off += __shfl_sync(0xffffffffu, incl, 31);
		}
		__syncthreads();
		for (int i = threadIdx.x; i < (int)count; i += blockDim.x) cq[i] = ds_weight(cz[i], c);
		__syncthreads();
		const DsCands s{cz, cid, cq, (int)count};
		token = ds_draw(s, c, p, bi, hist, minid, bins, sh);
	} else {
		token = ds_draw(g, c, p, bi, hist, minid, bins, sh);
	}
	if (threadIdx.x == 0) {
		out[r] = token;
		out[num_rows + r] = DI_SAMPLE_OK;
		out[2 * num_rows + r] = -1;
	}
}

template <int V> static int ds_launch(di_ctx *ctx, int *out, float *logits, int num_rows, int vocab,
                                      const di_sample_row *rows, const di_sample_edit *edits, int cap, bool all_greedy) {
	const size_t shmem = ds_smem_bytes(cap);
	cudaError_t e = cudaFuncSetAttribute(di_sample_k<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem);
	if (e != cudaSuccess) return di_cuda_fail(ctx, e, "sample: cudaFuncSetAttribute");
	// The whole-row passes spread over chunks (DsSplit): about two blocks a
	// multiprocessor in all for a few rows, at least sample_min_chunks a row
	// for many, so that no multiprocessor takes two whole rows while others
	// take one (Qwen3's vocabulary at 256 rows, T=1, the call with its
	// copies: 269 -> 258 us; offline engine unchanged within noise).
	// A call of greedy rows alone needs one pass over each row (the edits,
	// the maximum and the checks): up to DI_SAMPLE_GREEDY_WHOLE tokens a
	// block takes it in about one round of vector loads a thread, less
	// than the two extra launches of the split (the default model's 8192
	// tokens at batch 1: three kernels of 3.2, 5.9 and 5.2 us under ncu).
	int chunks = 1, chunk = vocab;
	if (num_rows <= ctx->sample_split && !(all_greedy && vocab <= DI_SAMPLE_GREEDY_WHOLE)) {
		chunks = min(DS_MAX_CHUNKS, max(ctx->sample_min_chunks, 2 * ctx->sm_count / num_rows));
		chunk = ((vocab + chunks - 1) / chunks + 127) / 128 * 128;
		chunks = (vocab + chunk - 1) / chunk;
	}
	void *scratch = nullptr;
	DsSplit split = {chunks, chunk, nullptr, nullptr};
	int rc = DI_OK;
	if (chunks > 1) {
		const size_t n = (size_t)num_rows * chunks;
		rc = di_scratch(ctx, n * (sizeof(DsStat) + sizeof(u64)), &scratch);
		if (rc != DI_OK) return rc;
		split.mass = (u64 *)scratch;
		split.stats = (DsStat *)(split.mass + n);
		const dim3 grid(chunks, num_rows);
		di_sample_stats_k<V><<<grid, DS_THREADS, 0, ctx->stream>>>(logits, vocab, rows, edits, split, ctx->check);
		if (!all_greedy) // greedy rows have no mass (di_sample_k reads none for them)
			di_sample_mass_k<V><<<grid, DS_THREADS, 0, ctx->stream>>>(logits, vocab, rows, split);
		rc = di_check_launch(ctx, "sample (chunks)");
	}
	if (rc == DI_OK) {
		di_sample_k<V><<<num_rows, DS_THREADS, shmem, ctx->stream>>>(out, logits, num_rows, vocab, rows, edits, cap,
		                                                             split, ctx->check);
		rc = di_check_launch(ctx, "sample");
	}
	di_scratch_free(ctx, scratch);
	return rc;
}

extern "C" int di_op_sample(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab, di_dptr rows,
                            di_dptr edits, int max_candidates, int all_greedy) {
	if (num_rows == 0) return DI_OK;
	if (num_rows < 0 || vocab <= 0 || !out || !logits || !rows)
		return di_fail(ctx, DI_ERR_INVALID, "sample: %d rows of %d logits", num_rows, vocab);
	if (vocab > DI_SAMPLE_MAX_VOCAB)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "sample: a vocabulary of %d tokens (at most %d)", vocab,
		               DI_SAMPLE_MAX_VOCAB);
	if (num_rows > 65535 * 16)
		return di_fail(ctx, DI_ERR_UNSUPPORTED, "sample: %d rows in one call", num_rows);
	const int cap = max(0, min(max_candidates, DS_MAX_CANDIDATES));
	const bool vec = vocab % 4 == 0 && logits % 16 == 0;
	int *o = DI_PTR(int, out);
	float *l = DI_PTR(float, logits);
	const di_sample_row *r = DI_PTR(const di_sample_row, rows);
	const di_sample_edit *e = DI_PTR(const di_sample_edit, edits);
	const bool g = all_greedy != 0;
	return vec ? ds_launch<4>(ctx, o, l, num_rows, vocab, r, e, cap, g)
	           : ds_launch<1>(ctx, o, l, num_rows, vocab, r, e, cap, g);
}

// ---------------------------------------------------------------- token_mask

// di_token_mask_k sets the logits of the tokens a row's allowed mask
// clears to -Inf: grid (column blocks, rows), one thread per token.
__global__ void di_token_mask_k(float *logits, int vocab, int words, const int *mask_rows, const unsigned *masks,
                                int num_masks, unsigned *check) {
	const int r = blockIdx.y;
	const int m = mask_rows[r];
	if (m < 0) return;
	if (m >= num_masks) {
		if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(check, DI_CHECK_SAMPLE);
		return;
	}
	const unsigned *bits = masks + (size_t)m * words;
	float *z = logits + (size_t)r * vocab;
	for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < vocab; t += gridDim.x * blockDim.x)
		if (!((bits[t >> 5] >> (t & 31)) & 1u)) z[t] = -CUDART_INF_F;
}

extern "C" int di_op_token_mask(di_ctx *ctx, di_dptr logits, int num_rows, int vocab, di_dptr mask_rows, di_dptr masks,
                                int num_masks) {
	if (num_rows == 0) return DI_OK;
	if (num_rows < 0 || num_rows > 65535 || vocab <= 0 || num_masks < 0 || !logits || !mask_rows || (num_masks > 0 && !masks))
		return di_fail(ctx, DI_ERR_INVALID, "token_mask: %d rows of %d logits, %d masks", num_rows, vocab, num_masks);
	const int threads = 256;
	const dim3 grid(min((vocab + threads - 1) / threads, 64), num_rows);
	di_token_mask_k<<<grid, threads, 0, ctx->stream>>>(DI_PTR(float, logits), vocab, (vocab + 31) / 32,
	                                                   DI_PTR(const int, mask_rows), DI_PTR(const unsigned, masks),
	                                                   num_masks, ctx->check);
	return di_check_launch(ctx, "token_mask");
}

// ---------------------------------------------------------------- argmax

// di_argmax_k writes the argmax of each logits row (lowest id on ties, NaN
// skipped): one block a row, each thread a strided span, then a warp and a
// block reduction of (value, id). Rows of a multiple of 4 logits at a
// 16-byte address are read as float4, ARGMAX_UNROLL of them in flight a
// thread: a row of 8192 logits is then one round of loads per thread
// instead of 32 dependent ones (8.5 -> about 3 us on an H200 under ncu).
// Each thread still visits its ids in ascending order, so "first greater"
// keeps the lowest id of a tie within the thread, as before.
#define ARGMAX_UNROLL 8
__device__ __forceinline__ void di_argmax_take(float v, int i, float &bv, int &bi) {
	if (v > bv) bv = v, bi = i; // NaN compares false
}

__global__ void __launch_bounds__(256) di_argmax_k(int *out, const float *logits, int vocab) {
	__shared__ float sv[8];
	__shared__ int si[8];
	const int r = blockIdx.x;
	const float *z = logits + (size_t)r * vocab;
	float bv = -CUDART_INF_F;
	int bi = INT_MAX;
	if ((vocab & 3) == 0 && (reinterpret_cast<uintptr_t>(z) & 15) == 0) {
		const float4 *z4 = reinterpret_cast<const float4 *>(z);
		const int n4 = vocab >> 2, step = blockDim.x;
		int t = threadIdx.x;
		for (; t + (ARGMAX_UNROLL - 1) * step < n4; t += ARGMAX_UNROLL * step) {
			float4 a[ARGMAX_UNROLL];
#pragma unroll
			for (int u = 0; u < ARGMAX_UNROLL; u++) a[u] = __ldg(z4 + t + u * step);
#pragma unroll
			for (int u = 0; u < ARGMAX_UNROLL; u++) {
				const int i = 4 * (t + u * step);
				di_argmax_take(a[u].x, i, bv, bi);
				di_argmax_take(a[u].y, i + 1, bv, bi);
				di_argmax_take(a[u].z, i + 2, bv, bi);
				di_argmax_take(a[u].w, i + 3, bv, bi);
			}
		}
		for (; t < n4; t += step) {
			const float4 a = __ldg(z4 + t);
			di_argmax_take(a.x, 4 * t, bv, bi);
			di_argmax_take(a.y, 4 * t + 1, bv, bi);
			di_argmax_take(a.z, 4 * t + 2, bv, bi);
			di_argmax_take(a.w, 4 * t + 3, bv, bi);
		}
	} else {
		for (int t = threadIdx.x; t < vocab; t += blockDim.x) di_argmax_take(z[t], t, bv, bi);
	}
	for (int off = 16; off > 0; off >>= 1) {
		const float ov = __shfl_down_sync(0xffffffffu, bv, off);
		const int oi = __shfl_down_sync(0xffffffffu, bi, off);
		if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
	}
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (lane == 0) sv[warp] = bv, si[warp] = bi;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < (int)(blockDim.x >> 5); w++)
			if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) bv = sv[w], bi = si[w];
		out[r] = bi == INT_MAX ? 0 : bi;
	}
}

extern "C" int di_op_argmax(di_ctx *ctx, di_dptr out, di_dptr logits, int num_rows, int vocab) {
	if (num_rows == 0) return DI_OK;
	if (num_rows < 0 || num_rows > INT_MAX / 2 || vocab <= 0 || !out || !logits)
		return di_fail(ctx, DI_ERR_INVALID, "argmax: %d rows of %d logits", num_rows, vocab);
	di_argmax_k<<<num_rows, 256, 0, ctx->stream>>>(DI_PTR(int, out), DI_PTR(const float, logits), vocab);
	return di_check_launch(ctx, "argmax");
}

// ---------------------------------------------------------------- accept_drafts

// di_accept_drafts_k verifies one entry a thread (see di_api.accept_drafts).
__global__ void di_accept_drafts_k(int *out, const int *tokens, int num_tokens, const int *drafts, int num_drafts,
                                   const int *layout, int num_entries, unsigned *check) {
	const int e = blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= num_entries) return;
	const int s0 = layout[4 * e], n = layout[4 * e + 1], d0 = layout[4 * e + 2], base = layout[4 * e + 3];
	if (n < 0 || s0 < 0 || d0 < 0 || s0 + n >= num_tokens || (n > 0 && d0 + n > num_drafts)) {
		out[e] = 0, out[num_entries + e] = 0, out[2 * num_entries + e] = 0;
		atomicOr(check, DI_CHECK_ACCEPT);
		return;
	}
	int a = 0;
	while (a < n && tokens[s0 + a] == drafts[d0 + a]) a++;
	out[e] = a, out[num_entries + e] = tokens[s0 + a], out[2 * num_entries + e] = base + a;
}

extern "C" int di_op_accept_drafts(di_ctx *ctx, di_dptr out, di_dptr tokens, int num_tokens, di_dptr drafts,
                                   int num_drafts, di_dptr layout, int num_entries) {
	if (num_entries == 0) return DI_OK;
	if (num_entries < 0 || num_tokens < 0 || num_drafts < 0 || !out || !tokens || !layout || (num_drafts > 0 && !drafts))
		return di_fail(ctx, DI_ERR_INVALID, "accept_drafts: %d entries, %d tokens, %d drafts", num_entries, num_tokens,
		               num_drafts);
	const int threads = 128;
	di_accept_drafts_k<<<(num_entries + threads - 1) / threads, threads, 0, ctx->stream>>>(
	    DI_PTR(int, out), DI_PTR(const int, tokens), num_tokens, DI_PTR(const int, drafts), num_drafts,
	    DI_PTR(const int, layout), num_entries, ctx->check);
	return di_check_launch(ctx, "accept_drafts");
}
