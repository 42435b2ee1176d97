package bench

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The histogram's layout: the legend lies right of the data area (not
// over it), the axes have headroom over the tallest bin and past the
// largest value, the p99 line is drawn across the whole height inside the
// x range, and tick labels are plain decimals.
func TestHistogramLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	skewed := make([]float64, 500)
	for i := range skewed {
		skewed[i] = 20 + 5*rng.NormFloat64()
	}
	skewed[499] = 400 // p99 far right, one outlier at the maximum
	large := make([]float64, 200)
	for i := range large {
		large[i] = 10000 + 90000*rng.Float64()
	}
	tests := []struct {
		name string
		xs   []float64
	}{
		{"skewed", skewed},
		{"few, p99 is the max", []float64{1, 2, 2, 3, 10}},
		{"all equal", []float64{7, 7, 7, 7}},
		{"one sample", []float64{0.5}},
		{"sub-millisecond", []float64{0.0012, 0.0031, 0.0025, 0.0018, 0.0044}},
		{"large", large},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := newHistogram(Distribution{"ttft", "ms", tc.xs})
			if err != nil {
				t.Fatal(err)
			}
			s := Summarize(tc.xs)
			p := h.plot
			if p.Y.Min != 0 || p.Y.Max < h.topBin*1.05 || h.topBin <= 0 {
				t.Errorf("y range [%v, %v], tallest bin %v: want 0 and >= 5%% headroom", p.Y.Min, p.Y.Max, h.topBin)
			}
			span := math.Max(s.Max-s.Min, 1e-12)
			if p.X.Max < s.Max+0.05*span || p.X.Max < s.P99 || p.X.Min > s.Min {
				t.Errorf("x range [%v, %v] for samples in [%v, %v], p99 %v: want headroom past the largest", p.X.Min, p.X.Max, s.Min, s.Max, s.P99)
			}
			if _, ok := p.X.Tick.Marker.(plainTicks); !ok {
				t.Errorf("x ticks %T, want plainTicks", p.X.Tick.Marker)
			}
			if _, ok := p.Y.Tick.Marker.(plainTicks); !ok {
				t.Errorf("y ticks %T, want plainTicks", p.Y.Tick.Marker)
			}
			for _, tick := range append(p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max), p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max)...) {
				if strings.ContainsAny(tick.Label, "eE") {
					t.Errorf("tick label %q in scientific notation", tick.Label)
				}
			}
			if strings.Contains(p.Title.Text, "e+") || strings.Contains(p.Title.Text, "e-") {
				t.Errorf("title %q in scientific notation", p.Title.Text)
			}

			var p99 *mark
			for i := range h.marks {
				if h.marks[i].name == "p99" {
					p99 = &h.marks[i]
				}
			}
			if p99 == nil || p99.line == nil || p99.x != s.P99 {
				t.Fatalf("no p99 line at %v: %+v", s.P99, h.marks)
			}
			if pts := p99.line.XYs; len(pts) != 2 || pts[0].X != s.P99 || pts[1].X != s.P99 || pts[0].Y != 0 || pts[1].Y != p.Y.Max {
				t.Errorf("p99 line %v: want x = %v from 0 to %v", pts, s.P99, p.Y.Max)
			}
			if !(p99.x >= p.X.Min && p99.x < p.X.Max) {
				t.Errorf("p99 %v outside or on the edge of [%v, %v)", p99.x, p.X.Min, p.X.Max)
			}
			if h.marks[len(h.marks)-1].name != "p99" {
				t.Errorf("p99 not drawn last (on top): %v", h.marks[len(h.marks)-1].name)
			}

			c := draw.New(vgimg.New(plotWidth, plotHeight))
			_, data, legend := h.layout(c)
			if legend.Min.X < data.Max.X || legend.Max.X > c.Max.X || legend.Size().X <= 0 {
				t.Errorf("legend %v overlaps the data area %v (canvas %v)", legend.Rectangle, data.Rectangle, c.Rectangle)
			}
			if w := h.legend.Rectangle(legend).Size().X; w <= 0 || w > legend.Size().X+1e-9 {
				t.Errorf("legend %v wide in a strip of %v", w, legend.Size().X)
			}
			if w := p.Legend.Rectangle(c).Size().X; w != 0 {
				t.Errorf("the plot's own legend (drawn over the data) has entries: %v wide", w)
			}

			path := filepath.Join(t.TempDir(), "ttft.png")
			if err := h.save(path); err != nil {
				t.Fatal(err)
			}
			data2, err := os.ReadFile(path)
			if err != nil || !bytes.HasPrefix(data2, []byte("\x89PNG\r\n\x1a\n")) {
				t.Fatalf("not a PNG: %v", err)
			}
		})
	}
}

func TestPlainTicks(t *testing.T) {
	tests := []struct{ lo, hi float64 }{
		{0, 12000}, {0, 0.003}, {1e5, 1e6}, {0, 7.5}, {0, 2.5}, {3.2, 3.3}, {0, 5e7},
	}
	for _, tc := range tests {
		ticks := plainTicks{}.Ticks(tc.lo, tc.hi)
		n := 0
		for _, tk := range ticks {
			if tk.Label == "" {
				continue
			}
			n++
			if strings.ContainsAny(tk.Label, "eE") {
				t.Errorf("[%v, %v]: label %q in scientific notation", tc.lo, tc.hi, tk.Label)
			}
			v, err := strconv.ParseFloat(tk.Label, 64)
			if err != nil || math.Abs(v-tk.Value) > 1e-9*math.Max(1, math.Abs(tk.Value)) {
				t.Errorf("[%v, %v]: label %q for %v", tc.lo, tc.hi, tk.Label, tk.Value)
			}
		}
		if n < 2 {
			t.Errorf("[%v, %v]: %d labelled ticks", tc.lo, tc.hi, n)
		}
	}
}

func TestPlainNumber(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{0, "0"}, {1234.6, "1235"}, {12.345, "12.3"}, {0.01234, "0.0123"}, {-5.5, "-5.50"}, {98629, "98629"}, {1e7, "10000000"},
	}
	for _, tc := range tests {
		if got := plainNumber(tc.v); got != tc.want {
			t.Errorf("plainNumber(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
