package bench

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Distribution is a named sample to plot.
type Distribution struct {
	// Name is the file's base name and the plot's title, e.g. "ttft".
	Name string
	// Unit labels the x axis, e.g. "ms".
	Unit   string
	Values []float64
}

// WritePlots writes one PNG histogram per non-empty distribution into dir
// (created if needed), with the mean, p50, p90 and p99 marked, and returns
// the files written. Cost: one render per distribution (tens of
// milliseconds each).
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
		if err := writeHistogram(path, d); err != nil {
			return files, fmt.Errorf("bench: plot %s: %w", d.Name, err)
		}
		files = append(files, path)
	}
	return files, nil
}

func writeHistogram(path string, d Distribution) error {
	s := Summarize(d.Values)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (n = %d): mean %.3g, p50 %.3g, p90 %.3g, p99 %.3g %s", d.Name, s.Count, s.Mean, s.Median, s.P90, s.P99, d.Unit)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = d.Unit
	p.Y.Label.Text = "count"
	bins := min(50, max(5, s.Count/4))
	h, err := plotter.NewHist(plotter.Values(d.Values), bins)
	if err != nil {
		return err
	}
	h.FillColor = color.RGBA{R: 90, G: 140, B: 200, A: 255}
	p.Add(h)
	top := 0.0
	for _, b := range h.Bins {
		top = max(top, b.Weight)
	}
	marks := []struct {
		name string
		x    float64
		c    color.Color
	}{
		{"mean", s.Mean, color.RGBA{A: 255}},
		{"p50", s.Median, color.RGBA{G: 150, A: 255}},
		{"p90", s.P90, color.RGBA{R: 230, G: 140, A: 255}},
		{"p99", s.P99, color.RGBA{R: 200, A: 255}},
	}
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.x, Y: 0}, {X: m.x, Y: top}})
		if err != nil {
			return err
		}
		l.Color = m.c
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(m.name, l)
	}
	p.Legend.Top = true
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}
