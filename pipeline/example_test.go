package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/deepinfer/deepinfer-go/pipeline"
)

// words is a Source over a fixed list.
type words struct{ list []string }

func (w *words) Next(context.Context) (string, error) {
	if len(w.list) == 0 {
		return "", io.EOF
	}
	v := w.list[0]
	w.list = w.list[1:]
	return v, nil
}

func Example() {
	upper := pipeline.StageFunc[string, string](func(_ context.Context, s string) (string, error) {
		return strings.ToUpper(s), nil
	})
	print := pipeline.SinkFunc[string](func(_ context.Context, s string) error {
		fmt.Println(s)
		return nil
	})
	g := pipeline.New().
		Add("words", pipeline.NewSource[string](&words{list: []string{"tokenize", "schedule", "forward"}})).
		Add("upper", pipeline.NewStage(upper)).
		Add("print", pipeline.NewSink[string](print)).
		Connect("words", "upper", 4).
		Connect("upper", "print", 4)
	if err := g.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// TOKENIZE
	// SCHEDULE
	// FORWARD
}

// steps is a Planner that emits three steps and counts what comes back.
type steps struct{ planned, done int }

func (s *steps) Add(context.Context, struct{}) error { return nil }
func (s *steps) Feedback(_ context.Context, step int) error {
	s.done++
	fmt.Println("finished step", step)
	return nil
}
func (s *steps) Plan(context.Context) (int, bool, error) {
	if s.planned == 3 {
		return 0, false, nil
	}
	s.planned++
	return s.planned, true, nil
}

// A loop: the planner emits work, the tail feeds results back, and the
// feedback edge bounds the items in flight (1: strict turns).
func Example_loop() {
	compute := pipeline.StageFunc[int, int](func(_ context.Context, step int) (int, error) { return step, nil })
	g := pipeline.New().
		Add("schedule", pipeline.NewPlanner[struct{}, int, int](&steps{})).
		Add("compute", pipeline.NewStage(compute)).
		Connect("schedule", "compute", 1).
		Feedback("compute", "schedule", 1)
	if err := g.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// finished step 1
	// finished step 2
	// finished step 3
}

// Implementations registered by slot and name are picked by a Layout and
// the user's Choices, usually decoded from YAML.
func ExampleLayout_Resolve() {
	layout := pipeline.Layout{Slots: []string{"source", "forward", "sample"}}
	spec, err := layout.Resolve(pipeline.Choices{
		Impl:   map[string]string{"sample": "greedy"},
		Insert: []pipeline.Insertion{{After: "forward", Stage: "softcap"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range spec.Nodes {
		fmt.Printf("%s=%q\n", n.Name, n.Impl)
	}
	// Output:
	// source=""
	// forward=""
	// softcap=""
	// sample="greedy"
}

func ExampleTopology_Mermaid() {
	spec, _ := pipeline.Layout{Slots: []string{"tokenize", "forward"}}.Resolve(pipeline.Choices{})
	fmt.Print(spec.Topology().Mermaid(nil))
	// Output:
	// flowchart LR
	//   n0["tokenize<br/>tokenize=default"]
	//   n1["forward<br/>forward=default"]
	//   n0 --> n1
}
