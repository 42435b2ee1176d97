// Command ggmlcheck compares the engine's GGUF block quantizers and
// dequantizers with llama.cpp's reference ones, bit for bit, by loading
// ggml's shared library (libggml-base.so, shipped with node-llama-cpp's
// prebuilt binaries) at run time:
//
//	go run ./tools/cpu/ggmlcheck -lib DIR/libggml-base.so [-rows 2000] [-cpulib DIR/libggml-cpu-haswell.so]
//
// For each of Q8_0, Q4_0, Q4_K, Q5_K and Q6_K it quantizes random rows
// (normal, uniform, heavy-tailed, all-zero, constant, tiny) with both
// implementations, compares the bytes, then dequantizes the blocks with
// both and compares the float32 bits. It then checks the activation
// rounding of llama.cpp's matrix products (quantize_row_q8_K_ref,
// ggml_fp32_to_bf16_row_ref) the same way. With -cpulib (one of the CPU
// variant libraries, which export both the generic and the SIMD dot
// products) it also compares simd.VecDotLlama with
// ggml_vec_dot_<type>_q8_<0|K>_generic (Q8_0 and Q4_0 bit for bit, the
// K-quants within a bound, see checkDots) and reports how often the
// library's SIMD dot product and its own activation quantizer
// (quantize_row_q8_0 / _q8_K) give other bits. It exits 1 on any
// difference from a reference function (beyond the bound, for the K-quant
// dot products).
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);
typedef void (*dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
static void call_init(void *f) { ((void (*)(void))f)(); }
static void call_dot(void *f, int n, float *s, const void *x, const void *y) { ((dot_fn)f)(n, s, 0, x, 0, y, 0, 1); }
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
	"encoding/binary"
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
	cpuLib := flag.String("cpulib", "", "path of a libggml-cpu-*.so: also compare the dot products")
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
	fail = checkActs(h, dists, *rows) || fail
	if *cpuLib != "" {
		cpath := C.CString(*cpuLib)
		ch := C.open_lib(cpath)
		C.free(unsafe.Pointer(cpath))
		if ch == nil {
			fmt.Fprintln(os.Stderr, "ggmlcheck:", C.GoString(C.lib_error()))
			os.Exit(2)
		}
		C.call_init(symbol(ch, "ggml_cpu_init")) // fills the fp16 tables the dot products read
		fail = checkDots(ch, names, dists, *rows) || fail
	}
	if fail {
		os.Exit(1)
	}
}

func symbol(h unsafe.Pointer, name string) unsafe.Pointer {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	p := C.sym(h, cs)
	if p == nil {
		fmt.Fprintf(os.Stderr, "ggmlcheck: symbol %s missing\n", name)
		os.Exit(2)
	}
	return p
}

// checkActs compares simd.QuantizeQ8K with quantize_row_q8_K_ref and
// simd.RoundBF16 with ggml_fp32_to_bf16_row_ref on random rows.
func checkActs(h unsafe.Pointer, dists map[string]func(r *rand.Rand) float32, rows int) bool {
	const k = 1024
	q8k := symbol(h, "quantize_row_q8_K_ref")
	bf := symbol(h, "ggml_fp32_to_bf16_row_ref")
	cx := (*[k]C.float)(C.malloc(4 * k))
	defer C.free(unsafe.Pointer(cx))
	cy := C.malloc(max(k/256*simd.Q8KBlockBytes, 2*k))
	defer C.free(cy)
	x := make([]float32, k)
	mine := make([]byte, k/256*simd.Q8KBlockBytes)
	bits := make([]uint16, k)
	qDiff, bDiff, n := 0, 0, 0
	for name, dist := range dists {
		r := rand.New(rand.NewPCG(99, uint64(len(name))))
		for row := range rows {
			for i := range x {
				x[i] = dist(r)
			}
			if row == 0 {
				clear(x)
			}
			for i, v := range x {
				cx[i] = C.float(v)
			}
			// An all-zero block leaves its bsums unwritten in C: start from zeros.
			C.memset(cy, 0, C.size_t(len(mine)))
			C.call_quant(q8k, &cx[0], cy, k)
			simd.QuantizeQ8K(mine, x)
			if !bytes.Equal(C.GoBytes(cy, C.int(len(mine))), mine) {
				if qDiff == 0 {
					fmt.Printf("Q8_K activations %s row %d: blocks differ\n", name, row)
				}
				qDiff++
			}
			C.call_quant(bf, &cx[0], cy, k)
			simd.RoundBF16(bits, x)
			ref := C.GoBytes(cy, 2*k)
			for i, b := range bits {
				if uint16(ref[2*i])|uint16(ref[2*i+1])<<8 != b {
					if bDiff == 0 {
						fmt.Printf("BF16 activations %s row %d: value %d differs\n", name, row, i)
					}
					bDiff++
					break
				}
			}
			n++
		}
	}
	fmt.Printf("act   %7d rows: %d quantized to Q8_K differently, %d rounded to BF16 differently\n", n, qDiff, bDiff)
	return qDiff > 0 || bDiff > 0
}

// checkDots compares simd.VecDotLlama with the library's generic dot
// products on random weights (quantized by the engine) and activations
// (quantized by the engine): Q8_0 and Q4_0 bit for bit; the K-quants, whose
// scales the engine applies once per block to the generic code's exact
// integers (the generic code: to eight lane sums), within kTol of the sum
// of the products' magnitudes (the dequantized weights and activations, in
// float64). It also counts how often the library's SIMD dot product, and
// its SIMD activation quantizer, differ.
func checkDots(h unsafe.Pointer, names map[simd.QuantType]string, dists map[string]func(r *rand.Rand) float32, rows int) bool {
	const k = 1024
	fail := false
	cw := C.malloc(k * 2)
	ca := C.malloc(k / 256 * simd.Q8KBlockBytes)
	ca2 := C.malloc(k / 256 * simd.Q8KBlockBytes)
	cx := (*[k]C.float)(C.malloc(4 * k))
	defer C.free(cw)
	defer C.free(ca)
	defer C.free(ca2)
	defer C.free(unsafe.Pointer(cx))
	var out C.float
	for _, t := range simd.QuantTypes {
		act := "q8_0"
		if t.BlockSize() == 256 {
			act = "q8_K"
		}
		base := "ggml_vec_dot_" + names[t] + "_" + act
		gen, vec := symbol(h, base+"_generic"), symbol(h, base)
		quant := symbol(h, "quantize_row_"+act)
		rb, _ := t.RowBytes(k)
		ab, _ := simd.ActRowBytes(t, k)
		w := make([]byte, rb)
		a := make([]byte, ab)
		xw, xa := make([]float32, k), make([]float32, k)
		genDiff, genBad, vecDiff, quantDiff, vecAfterQuant, n := 0, 0, 0, 0, 0, 0
		var maxRel, maxGenRel float64
		for name, dist := range dists {
			r := rand.New(rand.NewPCG(uint64(t)+7, uint64(len(name))))
			for range rows {
				for i := range xw {
					xw[i] = float32(r.NormFloat64())
					xa[i] = dist(r)
				}
				t.Quantize(w, xw)
				simd.QuantizeActs(a, xa, t, 1, k)
				C.memcpy(cw, unsafe.Pointer(&w[0]), C.size_t(rb))
				C.memcpy(ca, unsafe.Pointer(&a[0]), C.size_t(ab))
				mine := simd.VecDotLlama(t, k, w, a)
				C.call_dot(gen, k, &out, cw, ca)
				if g := float32(out); math.Float32bits(g) != math.Float32bits(mine) {
					genDiff++
					rel := math.Inf(1)
					if t.BlockSize() == 256 {
						rel = math.Abs(float64(g-mine)) / magnitude(t, w, a)
						maxGenRel = max(maxGenRel, rel)
					}
					if rel > kTol {
						if genBad == 0 {
							fmt.Printf("%s %s: generic dot %g, ours %g\n", t, name, g, mine)
						}
						genBad++
					}
				}
				C.call_dot(vec, k, &out, cw, ca)
				if v := float32(out); math.Float32bits(v) != math.Float32bits(mine) {
					vecDiff++
					if mine != 0 {
						maxRel = max(maxRel, math.Abs(float64(v-mine)/float64(mine)))
					}
				}
				for i, v := range xa {
					cx[i] = C.float(v)
				}
				C.memset(ca2, 0, C.size_t(ab))
				C.call_quant(quant, &cx[0], ca2, k)
				if !bytes.Equal(C.GoBytes(ca2, C.int(ab)), a) {
					quantDiff++
					C.call_dot(vec, k, &out, cw, ca2)
					if math.Float32bits(float32(out)) != math.Float32bits(mine) {
						vecAfterQuant++
					}
				}
				n++
			}
		}
		fmt.Printf("%-5s %7d dots: %d differ from %s_generic (%d beyond the bound, max %.2g of the magnitudes); "+
			"the SIMD %s differs in %d (max rel %.2g); its quantize_row_%s rounds %d rows differently\n",
			t, n, genDiff, base, genBad, maxGenRel, base, vecDiff, maxRel, act, quantDiff)
		fail = fail || genBad > 0
	}
	return fail
}

// kTol bounds the K-quant dot products' distance from the generic ones, as
// a share of the sum of the products' magnitudes: each side rounds a few
// float32 operations per block (about 2^-24 of a block's terms each), so
// 2^-17 leaves room for the sums of several blocks and still fails on any
// wrong integer or scale.
const kTol = 1.0 / (1 << 17)

// magnitude is sum |w_i * a_i| over the dequantized weight row w and the
// dequantized Q8_K activation row a, in float64.
func magnitude(t simd.QuantType, w, a []byte) float64 {
	k := len(a) / simd.Q8KBlockBytes * 256
	wf := make([]float32, k)
	t.Dequantize(wf, w)
	var s float64
	for i := range k {
		b := a[simd.Q8KBlockBytes*(i/256):]
		d := math.Float32frombits(binary.LittleEndian.Uint32(b))
		s += math.Abs(float64(wf[i]) * float64(d) * float64(int8(b[4+i%256])))
	}
	return s
}
