//go:build !cgo

package cuda

// This package, and so every program that imports it (cmd/deepinfer among
// them, which links the CUDA backend whether or not a GPU is present), is
// built with cgo: the backend calls its native library through cgo. Without
// cgo the build stops here, on purpose, with the undefined name below as
// its first error, rather than with "undefined: Backend". The fix: install
// a C compiler (gcc or clang) and build with CGO_ENABLED=1, the default
// when one is on PATH:
//
//	CGO_ENABLED=1 go build ./cmd/deepinfer
type _ this_build_needs_cgo_and_a_C_compiler__install_gcc_or_clang_and_set_CGO_ENABLED_1
