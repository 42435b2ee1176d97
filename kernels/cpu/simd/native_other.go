//go:build !amd64 || !cgo

package simd

// nativeImpls: no SIMD path without cgo on amd64.
func nativeImpls() []*Impl { return nil }

// f8Variants: no SIMD path, no variant of one.
func f8Variants() []*Impl { return nil }

func fmaPeak(iters int) (float32, bool) { return 0, false }

func fmaPeakAVX2(iters int) (float32, bool) { return 0, false }
