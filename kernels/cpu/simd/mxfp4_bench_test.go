package simd

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkWidenMXFP4 widens a tile of 16 rows of 2880 MXFP4 weights (23
// KiB in, 90 KiB of BF16 out: the tile kernels/cpu widens at a time, in
// L1/L2) with every path. weights/ns is the widening's throughput on one
// core.
func BenchmarkWidenMXFP4(b *testing.B) {
	const rows, k = 16, 2880
	r := rand.New(rand.NewPCG(5, 6))
	blocks, scales := make([]byte, rows*k/2), make([]byte, rows*k/32)
	for i := range blocks {
		blocks[i] = byte(r.IntN(256))
	}
	for i := range scales {
		scales[i] = byte(118 + r.IntN(12))
	}
	dst := make([]uint16, rows*k)
	for _, p := range Impls() {
		b.Run(p.Name(), func(b *testing.B) {
			b.SetBytes(int64(len(blocks) + len(scales)))
			for b.Loop() {
				p.WidenMXFP4(dst, blocks, scales)
			}
			b.ReportMetric(float64(rows*k)*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "weights/ns")
		})
	}
}

// BenchmarkGemvMXFP4 multiplies one row by the same 16 x 2880 tile with
// every path: the avx512 and avx2 fused products against the Go path's
// widen-then-LinearBF16 (compare with BenchmarkWidenMXFP4 plus LinearBF16
// on the widened tile). The avx2 fused product (two VPERMPS and a blend
// per 8 weights) took the avx2 path from 1.6-1.9 weights/ns (widen, then
// LinearBF16) to 8.5, alternated twice each on a 2-vCPU Xeon (avx512:
// 22.7).
func BenchmarkGemvMXFP4(b *testing.B) {
	const rows, k = 16, 2880
	r := rand.New(rand.NewPCG(5, 6))
	blocks, scales := make([]byte, rows*k/2), make([]byte, rows*k/32)
	for i := range blocks {
		blocks[i] = byte(r.IntN(256))
	}
	for i := range scales {
		scales[i] = byte(118 + r.IntN(12))
	}
	x := make([]float32, k)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	out := make([]float32, rows)
	for _, p := range Impls() {
		b.Run(p.Name(), func(b *testing.B) {
			b.SetBytes(int64(len(blocks) + len(scales)))
			for b.Loop() {
				p.GemvMXFP4(out, x, blocks, scales, rows, k)
			}
			b.ReportMetric(float64(rows*k)*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "weights/ns")
		})
	}
}
