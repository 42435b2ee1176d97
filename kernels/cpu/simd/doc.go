// Package simd holds the vectorized loops of the CPU backend: matrix-vector
// and matrix-matrix products against float32, bfloat16, float16 and FP8 E4M3
// (block-scaled, see F8Weights) weights,
// dot, axpy, scale and dtype conversions, and attention's building blocks
// (Exp, OnlineSoftmax, LinearF32Gather, AccumRows), SiLUMul and RMSNorm's
// ScaleRows: see attn.go.
//
// # Canonical reduction order
//
// Every output of Linear* and Dot is one dot product of length k reduced in
// an order that depends only on k: 16 lane accumulators, lane l summing the
// products at kk ≡ l (mod 16) in increasing kk with one fused multiply-add
// (a single rounding) each, then the halves added pairwise (lane l with l+8,
// then l+4, l+2, l+1). A result therefore never depends on the batch size m,
// on the other rows of x, on the column range [j0,j1), or on how a caller
// splits work over threads: the CPU kernels are batch invariant.
// LinearBF16Pairs (bfloat16 activations: cpu.activation_rounding bf16, or
// auto on a GGUF file's BF16 weights) has
// an order of its own, VDPBF16PS's: lane l takes the pairs (32s+2l+1,
// 32s+2l) of each step s of 32, then the same tree; it is batch invariant
// in the same way.
//
// # Implementations
//
// Each implementation (Impl) computes that same order: "go", the pure-Go
// reference and fallback, and where the CPU and the build allow, "avx2"
// (AVX2+FMA+F16C) and "avx512" (AVX-512 F/BW/VL), C with intrinsics reached
// through cgo and chosen at run time with golang.org/x/sys/cpu. All of them
// return the same bits for the same inputs, NaN payloads aside; tests check
// it. The package-level functions use Default(), the fastest available;
// Pick (a configuration's name: auto, go, avx2, avx512), Impls and Lookup
// give every path to the CPU backend (its Options.SIMD), tests and
// benchmarks without any global switch. The benchmarks measure the path
// $DEEPINFER_SIMD names (read by the test binary only).
//
// # Speed
//
// Linear* run register-blocked micro-kernels whose accumulators are
// exactly the canonical lanes: from 5 rows of x on (prefill), 6 rows x 4
// columns with AVX-512 and 3 x 2 with AVX2; below, 4 x 4, 2 x 8 or 1 x 8
// (AVX2: 2 x 2, 1 x 4). 16-bit weights are widened in registers, never
// copied. On one core of the 2-core Zen 5 of BENCH.md, prefill GEMM
// (m=512) runs at 76-92% of the measured FMA peak (AVX-512) and decode
// GEMV streams f32 weights at about the machine's read bandwidth, bf16
// weights at about 70% of that; BENCH.md has the figures and the commands.
package simd
