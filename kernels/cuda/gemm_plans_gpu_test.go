package cuda

import (
	"fmt"
	"testing"

	"github.com/deepinfer/deepinfer-go/kernels"
)

// With Options.GEMMPlans, linears of more than 16 rows run cuBLASLt plans
// chosen per bucket of row counts: row counts of one bucket (17 and 20; 600
// and 640) and of several, in any order, and a product whose rows start
// at an odd offset (its alignment below 16 bytes, so a plan of its own or
// cublasGemmEx), all agree with the CPU backend as cublasGemmEx does; the
// library's counters (Backend.GEMMStats) show each product whose rows are
// whole 16-byte chunks running through a plan, and none made with the
// option off.
func TestGPULinearGEMMPlans(t *testing.T) {
	p := newPairOpts(t, Options{GEMM: GEMMRound, GEMMPlans: true})
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, sh := range [][3]int{{600, 256, 512}, {17, 256, 512}, {640, 256, 512}, {20, 256, 512}, {100, 96, 200}, {33, 1024, 256}, {19, 40, 37}} {
			m, n, k := sh[0], sh[1], sh[2]
			t.Run(fmt.Sprintf("%s/m%d_n%d_k%d", dt, m, n, k), func(t *testing.T) {
				x, w := p.rand(kernels.F32, 1, m, k), p.rand(dt, 1, n, k)
				out := p.zeros(kernels.F32, m, n)
				p.poison(out)
				if err := p.c.Linear(out.c, x.c, w.c, nil); err != nil {
					t.Fatal(err)
				}
				before := p.g.GEMMStats()
				if err := p.g.Linear(out.g, x.g, w.g, nil); err != nil {
					t.Fatal(err)
				}
				p.check("linear", out, linearTol(dt, GEMMRound))
				// It ran through a plan: cuBLASLt takes every shape here
				// whose rows are whole 16-byte chunks; the others may fall
				// back to cublasGemmEx.
				after := p.g.GEMMStats()
				if calls := after.PlanCalls - before.PlanCalls; calls != 1 {
					if n%8 == 0 && k%8 == 0 {
						t.Errorf("%d GEMMs through a plan, want 1 (plans %d -> %d)", calls, before.Plans, after.Plans)
					} else {
						t.Logf("fell back to cublasGemmEx (rows of %d and %d elements)", k, n)
					}
				}
			})
		}
	}
	// Rows 1..m of a larger x: the product's input starts one row in.
	m, n, k := 40, 64, 37
	x, w := p.rand(kernels.F32, 1, m+1, k), p.rand(kernels.F32, 1, n, k)
	xc, err := p.c.Rows(x.c, 1, m+1)
	if err != nil {
		t.Fatal(err)
	}
	xg, err := p.g.Rows(x.g, 1, m+1)
	if err != nil {
		t.Fatal(err)
	}
	out := p.zeros(kernels.F32, m, n)
	p.poison(out)
	if err := p.c.Linear(out.c, xc, w.c, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.g.Linear(out.g, xg, w.g, nil); err != nil {
		t.Fatal(err)
	}
	p.check("linear, rows at an offset", out, linearTol(kernels.F32, GEMMRound))
	// Without the option no plan is made.
	q := newPairOpts(t, Options{GEMM: GEMMRound})
	x, w = q.rand(kernels.F32, 1, 64, 256), q.rand(kernels.BF16, 1, 256, 256)
	out = q.zeros(kernels.F32, 64, 256)
	if err := q.g.Linear(out.g, x.g, w.g, nil); err != nil {
		t.Fatal(err)
	}
	if s := q.g.GEMMStats(); s != (GEMMStats{}) {
		t.Errorf("plans off: %+v, want none", s)
	}
}
