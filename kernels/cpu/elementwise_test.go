package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
	"github.com/deepinfer/deepinfer-go/kernels/cpu/simd"
)

// normRow is the reference of normRows for one row: its scale
// (rmsScale), then dst[i] = (x[i] * scale) * w[i], each product rounded.
func normRow(dst, x, w []float32, eps float32) {
	r := rmsScale(x, eps)
	for i, v := range x {
		dst[i] = (v * r) * w[i]
	}
}

// TestNormRowsMatchesNormRow: normRows gives normRow's bits row by row on
// every simd path, for row counts around its groups of four, written to
// another buffer or in place.
func TestNormRowsMatchesNormRow(t *testing.T) {
	cases := []struct {
		name        string
		rows, n     int
		lo, hi      int
		inPlace     bool
		extremeRows bool
	}{
		{"one row", 1, 256, 0, 1, false, false},
		{"three rows", 3, 128, 0, 3, false, false},
		{"four rows", 4, 256, 0, 4, false, false},
		{"seven rows from 1", 8, 96, 1, 8, false, false},
		{"64 rows in place", 64, 256, 0, 64, true, false},
		{"odd width", 9, 17, 0, 9, false, false},
		{"tiny and huge values", 6, 64, 0, 6, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.rows), uint64(tc.n)))
			x := make([]float32, tc.rows*tc.n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
				if tc.extremeRows {
					x[i] *= float32(math.Pow(10, float64(r.IntN(60)-30)))
				}
			}
			w := make([]float32, tc.n)
			for i := range w {
				w[i] = float32(r.NormFloat64())
			}
			const eps = 1e-6
			want := make([]float32, len(x))
			for i := tc.lo; i < tc.hi; i++ {
				normRow(want[i*tc.n:(i+1)*tc.n], x[i*tc.n:(i+1)*tc.n], w, eps)
			}
			for _, p := range simd.Impls() {
				k := selectKernels(false, p.Name())
				got := make([]float32, len(x))
				if tc.inPlace {
					copy(got, x)
					k.normRows(got, got, w, tc.n, tc.lo, tc.hi, eps)
				} else {
					k.normRows(got, x, w, tc.n, tc.lo, tc.hi, eps)
				}
				for i := tc.lo * tc.n; i < tc.hi*tc.n; i++ {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s: element %d (row %d): %v, normRow gives %v", p, i, i/tc.n, got[i], want[i])
					}
				}
			}
		})
	}
}

// Add gives a + b bit for bit on every simd path, over lengths around its
// chunks of 4096 and the vector widths, with out a third tensor, a, b, or
// both at once.
func TestAddAliases(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	for _, p := range simd.Impls() {
		b := New(Options{Threads: 2, SIMD: p.Name()})
		t.Cleanup(func() { b.Close() })
		for _, n := range []int{1, 17, 4096 + 37, 3 * 4096} {
			a, c := randVals(r, n, 1), randVals(r, n, 1)
			sum, twice := make([]float32, n), make([]float32, n)
			for i := range sum {
				sum[i], twice[i] = a[i]+c[i], a[i]+a[i]
			}
			at, ct := put(t, b, kernels.F32, a, n), put(t, b, kernels.F32, c, n)
			for _, tc := range []struct {
				name      string
				out, x, y kernels.Tensor
				want      []float32
			}{
				{"out apart", alloc(t, b, n), at, ct, sum},
				{"out = a", put(t, b, kernels.F32, a, n), nil, ct, sum},
				{"out = b", put(t, b, kernels.F32, c, n), at, nil, sum},
				{"out = a = b", put(t, b, kernels.F32, a, n), nil, nil, twice},
			} {
				x, y := tc.x, tc.y
				if x == nil {
					x = tc.out
				}
				if y == nil {
					y = tc.out
				}
				if err := b.Add(tc.out, x, y); err != nil {
					t.Fatal(err)
				}
				checkIdentical(t, fmt.Sprintf("%s: add, n %d, %s", p, n, tc.name), vals(tc.out), tc.want)
			}
		}
	}
}
