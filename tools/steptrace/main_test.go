package main

import (
	"bytes"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
)

// parse reads a real execution trace: the goroutines' running spans and
// waits (this program makes no cgo calls, so no backend calls).
func TestParse(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skip("tracing already on:", err)
	}
	ch := make(chan int)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range ch {
		}
	}()
	for i := range 100 {
		ch <- i
	}
	close(ch)
	wg.Wait()
	trace.Stop()
	ev, err := parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.runs) == 0 || len(ev.waits) == 0 || len(ev.calls) != 0 {
		t.Errorf("%d running spans, %d waits, %d backend calls; want some, some, none", len(ev.runs), len(ev.waits), len(ev.calls))
	}
	if _, err := parse(strings.NewReader("not a trace")); err == nil {
		t.Error("a file that is not a trace: no error")
	}
}

// analyze splits steps at the forward stage's boundary calls, names each
// goroutine after its stage, sums calls per step over the middle steps and
// lays out one step's calls and waits in time order.
func TestAnalyze(t *testing.T) {
	const us = 1000
	ev := &events{}
	// Goroutine 1 is the forward stage (a graph replay every 500 us), 2 the
	// sample stage (an alloc and a sample call a step), 3 an unnamed
	// cleanup goroutine (one free a step).
	for k := range int64(10) {
		t0 := k * 500 * us
		ev.calls = append(ev.calls,
			call{g: 1, start: t0, end: t0 + 40*us, fn: "c_graph_replay", stage: "forward"},
			call{g: 2, start: t0 + 100*us, end: t0 + 110*us, fn: "c_alloc", stage: "sample"},
			call{g: 2, start: t0 + 120*us, end: t0 + 150*us, fn: "c_sample", stage: "sample"},
			call{g: 3, start: t0 + 200*us, end: t0 + 201*us, fn: "c_free"})
		ev.runs = append(ev.runs, span{g: 2, start: t0 + 90*us, end: t0 + 160*us})
		ev.waits = append(ev.waits, wait{g: 2, at: t0 + 160*us, reason: "select", where: "pipeline.recv"})
	}
	r, err := analyze(ev, "c_graph_replay", 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.steps != 5 || r.stepNanos != 500*us {
		t.Fatalf("%d steps of %v ns, want 5 of 500 us", r.steps, r.stepNanos)
	}
	want := map[string]stageRow{
		"forward": {"forward", 1, 40 * us, 0},
		"sample":  {"sample", 2, 40 * us, 70 * us},
		"g3":      {"g3", 1, 1 * us, 0},
	}
	if len(r.stages) != len(want) {
		t.Fatalf("stages %+v, want %d", r.stages, len(want))
	}
	for _, s := range r.stages {
		if s != want[s.name] {
			t.Errorf("stage %+v, want %+v", s, want[s.name])
		}
	}
	if r.fns[0].fn != "c_graph_replay" || r.fns[0].p50 != 40*us {
		t.Errorf("first call %+v, want the replay at 40 us", r.fns[0])
	}
	got := strings.Join(r.timeline, "\n")
	for _, s := range []string{"0.0    40.0  forward      c_graph_replay", "100.0    10.0  sample       c_alloc", "160.0  waits   sample       select: pipeline.recv"} {
		if !strings.Contains(got, s) {
			t.Errorf("timeline lacks %q:\n%s", s, got)
		}
	}
	if strings.Index(got, "c_alloc") > strings.Index(got, "c_sample") {
		t.Errorf("timeline out of order:\n%s", got)
	}
	if _, err := analyze(ev, "c_linear", 2); err == nil {
		t.Error("no step boundary: no error")
	}
}
