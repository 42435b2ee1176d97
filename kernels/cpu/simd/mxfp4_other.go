//go:build !amd64 || !cgo

package simd

// widenMXFP4Native: no SIMD path without cgo on amd64.
func widenMXFP4Native(name string, dst []uint16, blocks, scales []byte) bool { return false }

// gemvMXFP4Native: no SIMD path without cgo on amd64.
func gemvMXFP4Native(name string, out, x []float32, blocks, scales []byte, n, k int) bool {
	return false
}
