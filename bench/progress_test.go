package bench

import (
	"bytes"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A rate over less than minRateElapsed is not shown: one item done 10 µs
// after the start is not 100,000 per second.
func TestRate(t *testing.T) {
	tests := []struct {
		name    string
		n       int
		elapsed time.Duration
		want    float64
		ok      bool
		text    string
	}{
		{"zero elapsed", 1, 0, 0, false, "-- seq/s"},
		{"negative elapsed", 1, -time.Second, 0, false, "-- seq/s"},
		{"10 µs", 1, 10 * time.Microsecond, 0, false, "-- seq/s"},
		{"just below the minimum", 50, minRateElapsed - time.Nanosecond, 0, false, "-- seq/s"},
		{"at the minimum", 1, minRateElapsed, 2, true, "2.0 seq/s"},
		{"none done", 0, 3 * time.Second, 0, true, "0.0 seq/s"},
		{"steady", 256, 8 * time.Second, 32, true, "32.0 seq/s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rate(tc.n, tc.elapsed)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("rate(%d, %v) = %v, %v; want %v, %v", tc.n, tc.elapsed, got, ok, tc.want, tc.ok)
			}
			if s := rateText(tc.n, tc.elapsed, "seq"); s != tc.text {
				t.Fatalf("rateText = %q, want %q", s, tc.text)
			}
		})
	}
}

// The bar's output ends with a newline whether the workload finished or
// stopped early, so what is written next starts on a line of its own; a
// bar over items that all finish at once shows no absurd rate.
func TestProgressEndsLine(t *testing.T) {
	rateRE := regexp.MustCompile(`([0-9.]+) seq/s`)
	tests := []struct {
		name  string
		total int
		done  int
	}{
		{"all done", 5, 5},
		{"stopped early", 5, 2},
		{"none done", 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			p := newProgress(&out, tc.total, "offline", "seq")
			for range tc.done {
				p.add()
			}
			p.finish()
			p.finish() // a second finish writes nothing more
			s := out.String()
			if !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 {
				t.Fatalf("output %q: want one line ending with a newline", s)
			}
			if !strings.Contains(s, "offline") || !strings.Contains(s, strconv.Itoa(tc.total)) {
				t.Fatalf("output %q lacks the label or the total", s)
			}
			// Everything ran within microseconds: no rate is shown.
			if m := rateRE.FindStringSubmatch(s); m != nil {
				t.Fatalf("rate %s seq/s shown after a few microseconds: %q", m[1], s)
			}
		})
	}
	// The first item done after a long wait: its rate is over the whole
	// wait since the start, not since the bar first drew.
	var out bytes.Buffer
	p := newProgress(&out, 4, "serve", "req")
	p.start = p.start.Add(-2 * time.Second)
	p.add()
	p.finish()
	if m := rateRE.FindAllStringSubmatch(strings.ReplaceAll(out.String(), "req/s", "seq/s"), -1); len(m) == 0 || m[len(m)-1][1] != "0.5" {
		t.Fatalf("one request after 2 s: %q, want 0.5 req/s", out.String())
	}
	p.add() // after finish: nothing more
	if !strings.HasSuffix(out.String(), "\n") {
		t.Fatalf("an add after finish wrote past the line's end: %q", out.String())
	}

	nilBar := newProgress(nil, 3, "serve", "req")
	if nilBar != nil {
		t.Fatal("a nil writer makes a bar")
	}
	nilBar.add()
	nilBar.finish() // no-ops
}
