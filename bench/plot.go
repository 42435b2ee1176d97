package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Distribution is a named sample to plot.
type Distribution struct {
	// Name is the file's base name and the plot's title, e.g. "ttft".
	Name string
	// Unit labels the x axis, e.g. "ms".
	Unit   string
	Values []float64
}

// Figure size of every histogram.
const (
	plotWidth  = 8 * vg.Inch
	plotHeight = 4.5 * vg.Inch
	// headroom is the share of the data's extent added above the tallest
	// bin and right of the largest value or mark, so neither touches the
	// frame.
	headroom = 0.08
)

// WritePlots writes one PNG histogram per non-empty distribution into dir
// (created if needed), with the mean, p50, p90 and p99 marked by vertical
// lines, the legend in a strip right of the data area (never over the
// data), headroom above the tallest bin and right of the largest value,
// and plain tick labels; it returns the files written. Cost: one render per
// distribution (tens of milliseconds each).
func WritePlots(dir string, dists []Distribution) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plots: %w", err)
	}
	var files []string
	for _, d := range dists {
		if len(d.Values) == 0 {
			continue
		}
		path := filepath.Join(dir, d.Name+".png")
		h, err := newHistogram(d)
		if err == nil {
			err = h.save(path)
		}
		if err != nil {
			return files, fmt.Errorf("bench: plot %s: %w", d.Name, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// histogram is the figure of one distribution: the plot (bins and one
// vertical line per mark) and a legend drawn outside the plot's data area.
type histogram struct {
	plot   *plot.Plot
	legend plot.Legend
	marks  []mark
	// topBin is the weight of the tallest bin; dataMax the largest sample
	// or mark.
	topBin, dataMax float64
}

// mark is a statistic drawn as a vertical line across the data area.
type mark struct {
	name string
	x    float64
	line *plotter.Line
}

// newHistogram builds the figure of d (non-empty). Cost: O(n log n) for
// the summary and O(n) for the bins.
func newHistogram(d Distribution) (*histogram, error) {
	s := Summarize(d.Values)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (n = %d): mean %s, p50 %s, p90 %s, p99 %s %s", d.Name, s.Count,
		plainNumber(s.Mean), plainNumber(s.Median), plainNumber(s.P90), plainNumber(s.P99), d.Unit)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = d.Unit
	p.Y.Label.Text = "count"
	p.X.Tick.Marker = plainTicks{}
	p.Y.Tick.Marker = plainTicks{}
	bins := min(50, max(5, s.Count/4))
	hist, err := plotter.NewHist(plotter.Values(d.Values), bins)
	if err != nil {
		return nil, err
	}
	hist.FillColor = color.RGBA{R: 90, G: 140, B: 200, A: 255}
	hist.LineStyle.Width = 0
	p.Add(hist)
	h := &histogram{plot: p, legend: plot.NewLegend()}
	for _, b := range hist.Bins {
		h.topBin = max(h.topBin, b.Weight)
	}

	// Axes: y from 0 with headroom over the tallest bin; x over the
	// samples and marks with headroom on the right (the p99 line often is
	// the largest value and would sit on the frame).
	lo, hi := s.Min, max(s.Max, s.P99, s.Mean)
	h.dataMax = hi
	span := hi - lo
	if span <= 0 {
		span = max(math.Abs(hi)*0.1, 1)
	}
	p.X.Min, p.X.Max = lo-headroom*span, hi+headroom*span
	if lo >= 0 {
		p.X.Min = max(0, p.X.Min)
	}
	p.Y.Min, p.Y.Max = 0, h.topBin*(1+headroom)

	// Marks span the whole height; p99 is drawn last (on top) and widest.
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	for _, m := range []struct {
		name   string
		x      float64
		c      color.Color
		width  float64
		dashes []vg.Length
	}{
		{"mean", s.Mean, color.RGBA{A: 255}, 1.5, dash},
		{"p50", s.Median, color.RGBA{G: 150, A: 255}, 1.5, nil},
		{"p90", s.P90, color.RGBA{R: 230, G: 140, A: 255}, 1.5, nil},
		{"p99", s.P99, color.RGBA{R: 210, A: 255}, 2.5, nil},
	} {
		l, err := plotter.NewLine(plotter.XYs{{X: m.x, Y: 0}, {X: m.x, Y: p.Y.Max}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = m.c, vg.Points(m.width), m.dashes
		p.Add(l)
		h.legend.Add(fmt.Sprintf("%s %s", m.name, plainNumber(m.x)), l)
		h.marks = append(h.marks, mark{m.name, m.x, l})
	}
	h.legend.Top, h.legend.Left = true, true
	return h, nil
}

// layout splits the canvas c into the plot's area (title, axes, data) and
// the legend's strip on its right, aligned with the data area; data is the
// plot's data area within plotArea.
func (h *histogram) layout(c draw.Canvas) (plotArea, data, legend draw.Canvas) {
	pad := vg.Points(8)
	w := h.legend.Rectangle(c).Size().X + 2*pad
	plotArea = draw.Crop(c, 0, -w, 0, 0)
	data = h.plot.DataCanvas(plotArea)
	legend = draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: plotArea.Max.X + pad, Y: data.Min.Y},
		Max: vg.Point{X: c.Max.X - pad, Y: data.Max.Y},
	}}
	return plotArea, data, legend
}

// save renders the figure as a PNG file at path. Cost: one render.
func (h *histogram) save(path string) error {
	img := vgimg.New(plotWidth, plotHeight)
	c := draw.New(img)
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())
	plotArea, _, legend := h.layout(c)
	h.plot.Draw(plotArea)
	h.legend.Draw(legend)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plainTicks are gonum's default ticks with labels written as plain
// decimals ("12000", "0.25"), never in scientific notation.
type plainTicks struct{}

// Ticks returns the default ticks of [lo, hi] relabelled with the fewest
// decimals (at most 9) that write every labelled value exactly. Cost:
// O(ticks).
func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	var labelled []float64
	for _, t := range ticks {
		if t.Label != "" {
			labelled = append(labelled, t.Value)
		}
	}
	decimals := 0
	for ; decimals < 9; decimals++ {
		exact := true
		for _, v := range labelled {
			scaled := v * math.Pow10(decimals)
			exact = exact && math.Abs(scaled-math.Round(scaled)) <= 1e-6*max(1, math.Abs(scaled))
		}
		if exact {
			break
		}
	}
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'f', decimals, 64)
		}
	}
	return ticks
}

// plainNumber writes v with three significant digits but never in
// scientific notation: 1234.6 -> "1235", 12.345 -> "12.3", 0.01234 ->
// "0.0123".
func plainNumber(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	decimals := max(0, min(9, 2-int(math.Floor(math.Log10(math.Abs(v))))))
	return strconv.FormatFloat(v, 'f', decimals, 64)
}
