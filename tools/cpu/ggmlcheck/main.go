// Command ggmlcheck compares the engine's GGUF block quantizers and
// dequantizers with llama.cpp's reference ones, bit for bit, by loading
// ggml's shared library (libggml-base.so, shipped with node-llama-cpp's
// prebuilt binaries) at run time:
//
//	go run ./tools/cpu/ggmlcheck -lib DIR/libggml-base.so [-rows 2000]
//
// For each of Q8_0, Q4_0, Q4_K, Q5_K and Q6_K it quantizes random rows
// (normal, uniform, heavy-tailed, all-zero, constant, tiny) with both
// implementations, compares the bytes, then dequantizes the blocks with
// both and compares the float32 bits. It exits 1 on any difference.
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);
typedef void (*dequant_fn)(const void *x, float *y, int64_t k);

static void *open_lib(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char *lib_error(void) { return dlerror(); }
static void *sym(void *h, const char *name) { return dlsym(h, name); }
static void call_quant(void *f, const float *x, void *y, int64_t k) { ((quant_fn)f)(x, y, k); }
static void call_dequant(void *f, const void *x, float *y, int64_t k) { ((dequant_fn)f)(x, y, k); }
*/
import "C"

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"unsafe"

	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

func main() {
	lib := flag.String("lib", "", "path of libggml-base.so")
	rows := flag.Int("rows", 2000, "random rows per format and distribution")
	flag.Parse()
	if *lib == "" {
		fmt.Fprintln(os.Stderr, "ggmlcheck: -lib is required")
		os.Exit(2)
	}
	cpath := C.CString(*lib)
	h := C.open_lib(cpath)
	C.free(unsafe.Pointer(cpath))
	if h == nil {
		fmt.Fprintln(os.Stderr, "ggmlcheck:", C.GoString(C.lib_error()))
		os.Exit(2)
	}
	names := map[simd.QuantType]string{
		simd.QuantQ8_0: "q8_0", simd.QuantQ4_0: "q4_0", simd.QuantQ4_K: "q4_K", simd.QuantQ5_K: "q5_K", simd.QuantQ6_K: "q6_K",
	}
	dists := map[string]func(r *rand.Rand) float32{
		"normal":  func(r *rand.Rand) float32 { return float32(r.NormFloat64() * 0.02) },
		"uniform": func(r *rand.Rand) float32 { return float32(r.Float64()*2 - 1) },
		"heavy":   func(r *rand.Rand) float32 { return float32(r.NormFloat64() * math.Exp(2*r.NormFloat64())) },
		"sparse": func(r *rand.Rand) float32 {
			if r.IntN(8) == 0 {
				return float32(r.NormFloat64())
			}
			return 0
		},
		"positive": func(r *rand.Rand) float32 { return float32(r.Float64() + 0.5) },
		"tiny":     func(r *rand.Rand) float32 { return float32(r.NormFloat64() * 1e-6) },
	}
	fail := false
	for _, t := range simd.QuantTypes {
		q := C.sym(h, C.CString("quantize_row_"+names[t]+"_ref"))
		dq := C.sym(h, C.CString("dequantize_row_"+names[t]))
		if q == nil || dq == nil {
			fmt.Fprintf(os.Stderr, "ggmlcheck: %s: symbols missing\n", t)
			os.Exit(2)
		}
		const k = 1024
		rb, _ := t.RowBytes(k)
		cx := (*[k]C.float)(C.malloc(4 * k))
		cy := C.malloc(C.size_t(rb))
		cf := (*[k]C.float)(C.malloc(4 * k))
		x := make([]float32, k)
		mine := make([]byte, rb)
		deq := make([]float32, k)
		numBlocks, quantDiff, deqDiff := 0, 0, 0
		for name, dist := range dists {
			r := rand.New(rand.NewPCG(uint64(t), uint64(len(name))))
			for row := range *rows {
				for i := range x {
					x[i] = dist(r)
				}
				if row == 0 {
					clear(x) // all zero
				} else if row == 1 {
					for i := range x {
						x[i] = 0.25 // constant
					}
				}
				for i, v := range x {
					cx[i] = C.float(v)
				}
				C.call_quant(q, &cx[0], cy, k)
				t.Quantize(mine, x)
				ref := C.GoBytes(cy, C.int(rb))
				numBlocks += k / t.BlockSize()
				if !bytes.Equal(ref, mine) {
					if quantDiff == 0 {
						fmt.Printf("%s %s row %d: quantized blocks differ\n", t, name, row)
					}
					quantDiff++
				}
				C.call_dequant(dq, cy, &cf[0], k)
				t.Dequantize(deq, ref)
				for i := range deq {
					if math.Float32bits(deq[i]) != math.Float32bits(float32(cf[i])) {
						if deqDiff == 0 {
							fmt.Printf("%s %s row %d: dequantized %d: %g vs %g\n", t, name, row, i, deq[i], float32(cf[i]))
						}
						deqDiff++
						break
					}
				}
			}
		}
		fmt.Printf("%-5s %7d blocks: %d rows quantized differently, %d rows dequantized differently\n", t, numBlocks, quantDiff, deqDiff)
		fail = fail || quantDiff > 0 || deqDiff > 0
		C.free(unsafe.Pointer(cx))
		C.free(cy)
		C.free(unsafe.Pointer(cf))
	}
	if fail {
		os.Exit(1)
	}
}
