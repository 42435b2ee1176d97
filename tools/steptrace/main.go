// Command steptrace reads a Go execution trace of the engine (deepinfer
// --trace FILE, or go test -trace) and shows where the host's time goes
// between one forward pass and the next: each stage's backend calls (cgo
// calls, which the trace records as system calls, with their stacks), how
// long they take, and one step's timeline with the points where each stage
// goroutine waited.
//
//	deepinfer graph -c cfg.yaml --profile 1 --max-tokens 512 --trace run.trace
//	go run ./tools/steptrace run.trace
//
// A step is the interval between two starts of the boundary call made by
// the forward stage (-boundary, default c_graph_replay: steps on CUDA
// graphs); the first and last -skip steps are left out. Each goroutine is
// named after the stage whose Process its calls come from most often.
// Tracing adds about 1-2 us to each recorded call, so compare figures
// within one trace.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	boundary := flag.String("boundary", "c_graph_replay", "the forward stage's backend call that starts a step")
	skip := flag.Int("skip", 20, "steps left out at each end (warm-up, drain)")
	top := flag.Int("top", 30, "calls listed in the table of calls")
	timeline := flag.Bool("timeline", true, "print the timeline of one step in the middle of the run")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: steptrace [flags] TRACE")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "steptrace:", err)
		os.Exit(1)
	}
	defer f.Close()
	ev, err := parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "steptrace:", err)
		os.Exit(1)
	}
	r, err := analyze(ev, *boundary, *skip)
	if err != nil {
		fmt.Fprintln(os.Stderr, "steptrace:", err)
		os.Exit(1)
	}
	r.print(os.Stdout, *top, *timeline)
}

// call is one backend (cgo) call: the C function, the stage it came from
// (the innermost stages.(*X).Process-like frame), its goroutine and times.
type call struct {
	g          int64
	start, end int64 // ns
	fn, stage  string
	from       string // the first two frames outside the backends' packages
}

// span is a stretch of a goroutine's running time.
type span struct {
	g          int64
	start, end int64
}

// wait is a goroutine blocking, with why and where.
type wait struct {
	g      int64
	at     int64
	reason string
	where  string
}

type events struct {
	calls []call
	runs  []span
	waits []wait
}

var stageFrame = regexp.MustCompile(`stages\.\(\*(\w+)\)\.(Process|propose|fromDevice|Propose\w*)`)

// parse reads the trace's goroutine state transitions: system calls with a
// C function on their stack are backend calls.
func parse(r io.Reader) (*events, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	out := &events{}
	open := map[int64]*call{}
	running := map[int64]int64{}
	for {
		e, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if e.Kind() != trace.EventStateTransition {
			continue
		}
		st := e.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		g, t := int64(st.Resource.Goroutine()), int64(e.Time())
		switch {
		case to == trace.GoRunning:
			running[g] = t
		case from == trace.GoRunning:
			if s, ok := running[g]; ok {
				out.runs = append(out.runs, span{g, s, t})
				delete(running, g)
			}
		}
		if from == trace.GoRunning && to == trace.GoWaiting {
			out.waits = append(out.waits, wait{g: g, at: t, reason: st.Reason, where: where(e.Stack())})
		}
		switch {
		case to == trace.GoSyscall:
			c := &call{g: g, start: t, from: caller(e.Stack())}
			for fr := range e.Stack().Frames() {
				if c.fn == "" {
					if i := strings.Index(fr.Func, "_Cfunc_"); i >= 0 {
						c.fn = fr.Func[i+len("_Cfunc_"):]
					}
				}
				if c.stage == "" {
					if m := stageFrame.FindStringSubmatch(fr.Func); m != nil {
						c.stage = m[1]
					}
				}
			}
			open[g] = c
		case from == trace.GoSyscall:
			if c := open[g]; c != nil {
				c.end = t
				if c.fn != "" {
					out.calls = append(out.calls, *c)
				}
				delete(open, g)
			}
		}
	}
	return out, nil
}

// where names the first three of the engine's frames of a stack.
func where(s trace.Stack) string {
	var fs []string
	for fr := range s.Frames() {
		if strings.Contains(fr.Func, "deepinfer") {
			fs = append(fs, fr.Func[strings.LastIndex(fr.Func, "/")+1:])
			if len(fs) == 3 {
				break
			}
		}
	}
	return strings.Join(fs, " <- ")
}

// caller names the first two of the engine's frames outside the backends'
// packages (kernels/...): the code that asked for a backend call.
func caller(s trace.Stack) string {
	var fs []string
	for fr := range s.Frames() {
		if strings.Contains(fr.Func, "deepinfer") && !strings.Contains(fr.Func, "/kernels") {
			fs = append(fs, fr.Func[strings.LastIndex(fr.Func, "/")+1:])
			if len(fs) == 2 {
				break
			}
		}
	}
	return strings.Join(fs, " <- ")
}

// report is what analyze found.
type report struct {
	steps        int
	stepNanos    float64
	stages       []stageRow
	fns          []fnRow
	timeline     []string
	goroutineFor map[int64]string
}

type stageRow struct {
	name                    string
	callsPerStep, nsPerStep float64
	runningNsPerStep        float64
}

type fnRow struct {
	stage, fn                 string
	perStep, nsPerStep        float64
	p10, p50, p90, p99, maxNs float64
}

// analyze splits the run into steps at the forward stage's boundary calls
// and sums each stage's calls and running time over the middle steps.
func analyze(ev *events, boundary string, skip int) (*report, error) {
	// Each goroutine is named after the stage most of its calls come from.
	counts := map[int64]map[string]int{}
	for _, c := range ev.calls {
		if c.stage == "" {
			continue
		}
		if counts[c.g] == nil {
			counts[c.g] = map[string]int{}
		}
		counts[c.g][c.stage]++
	}
	name := map[int64]string{}
	for g, m := range counts {
		best, n := "", 0
		for s, k := range m {
			if k > n || (k == n && s < best) {
				best, n = s, k
			}
		}
		name[g] = best
	}
	nameOf := func(g int64) string {
		if s := name[g]; s != "" {
			return s
		}
		return fmt.Sprintf("g%d", g)
	}
	var starts []int64
	for _, c := range ev.calls {
		if c.fn == boundary && name[c.g] == "forward" {
			starts = append(starts, c.start)
		}
	}
	slices.Sort(starts)
	if len(starts) < 2*skip+2 {
		return nil, fmt.Errorf("%d steps start with %s on the forward stage's goroutine; need more than %d (use -boundary, -skip)", len(starts), boundary, 2*skip+1)
	}
	lo, hi := starts[skip], starts[len(starts)-1-skip]
	n := len(starts) - 1 - 2*skip
	r := &report{steps: n, stepNanos: float64(hi-lo) / float64(n), goroutineFor: name}
	type acc struct {
		calls int
		ns    float64
		durs  []float64
	}
	byStage, byFn := map[string]*acc{}, map[[2]string]*acc{}
	get := func(m map[string]*acc, k string) *acc {
		if m[k] == nil {
			m[k] = &acc{}
		}
		return m[k]
	}
	for _, c := range ev.calls {
		if c.start < lo || c.start >= hi {
			continue
		}
		d := float64(c.end - c.start)
		s := get(byStage, nameOf(c.g))
		s.calls++
		s.ns += d
		k := [2]string{nameOf(c.g), c.fn}
		if byFn[k] == nil {
			byFn[k] = &acc{}
		}
		byFn[k].calls++
		byFn[k].ns += d
		byFn[k].durs = append(byFn[k].durs, d)
	}
	running := map[string]float64{}
	for _, s := range ev.runs {
		if s.start >= lo && s.end <= hi {
			running[nameOf(s.g)] += float64(s.end - s.start)
		}
	}
	for st, a := range byStage {
		r.stages = append(r.stages, stageRow{st, float64(a.calls) / float64(n), a.ns / float64(n), running[st] / float64(n)})
	}
	slices.SortFunc(r.stages, func(a, b stageRow) int { return int(b.nsPerStep - a.nsPerStep) })
	for k, a := range byFn {
		slices.Sort(a.durs)
		q := func(p float64) float64 { return a.durs[int(p*float64(len(a.durs)-1))] }
		r.fns = append(r.fns, fnRow{k[0], k[1], float64(a.calls) / float64(n), a.ns / float64(n), q(.1), q(.5), q(.9), q(.99), a.durs[len(a.durs)-1]})
	}
	slices.SortFunc(r.fns, func(a, b fnRow) int { return int(b.nsPerStep - a.nsPerStep) })

	// One step in the middle: its calls and waits, from its boundary call.
	mid := skip + n/2
	a, b := starts[mid], starts[mid+1]
	type line struct {
		t    int64
		text string
	}
	var lines []line
	for _, c := range ev.calls {
		if c.start >= a-(b-a)/3 && c.start < b {
			text := fmt.Sprintf("%8.1f %7.1f  %-12s %s", us(c.start-a), us(c.end-c.start), nameOf(c.g), c.fn)
			if c.from != "" {
				text += "  (" + c.from + ")"
			}
			lines = append(lines, line{c.start, text})
		}
	}
	for _, w := range ev.waits {
		if w.at >= a-(b-a)/3 && w.at < b && name[w.g] != "" {
			lines = append(lines, line{w.at, fmt.Sprintf("%8.1f  waits   %-12s %s: %s", us(w.at-a), nameOf(w.g), w.reason, w.where)})
		}
	}
	slices.SortStableFunc(lines, func(x, y line) int { return int(x.t - y.t) })
	for _, l := range lines {
		r.timeline = append(r.timeline, l.text)
	}
	return r, nil
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

func (r *report) print(w io.Writer, top int, timeline bool) {
	fmt.Fprintf(w, "%d steps, %.1f us a step between boundary calls\n\n", r.steps, r.stepNanos/1e3)
	fmt.Fprintln(w, "stage          calls/step   call us/step   running us/step")
	for _, s := range r.stages {
		fmt.Fprintf(w, "%-14s %10.1f %14.1f %17.1f\n", s.name, s.callsPerStep, s.nsPerStep/1e3, s.runningNsPerStep/1e3)
	}
	fmt.Fprintln(w, "\nstage          call                     per step  us/step   p10   p50   p90   p99    max (us a call)")
	for i, f := range r.fns {
		if i == top {
			break
		}
		fmt.Fprintf(w, "%-14s %-24s %8.2f %8.1f %5.1f %5.1f %5.1f %5.1f %6.1f\n", f.stage, f.fn, f.perStep, f.nsPerStep/1e3,
			f.p10/1e3, f.p50/1e3, f.p90/1e3, f.p99/1e3, f.maxNs/1e3)
	}
	if timeline {
		fmt.Fprintln(w, "\none step: us from its boundary call, duration, goroutine, call (or where it waited)")
		for _, l := range r.timeline {
			fmt.Fprintln(w, l)
		}
	}
}
