package pipeline

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// testRegistry registers a few generic stages the way stage packages do.
func testRegistry() *Registry {
	r := NewRegistry()
	r.Register("source", "counter", func(a Args) (*Node, error) {
		var o struct {
			Count int `yaml:"count"`
		}
		if err := a.DecodeOptions(&o); err != nil {
			return nil, err
		}
		return NewSource[int](&counter{n: o.Count}), nil
	})
	r.Register("map", "double", func(Args) (*Node, error) { return NewStage(double()), nil })
	r.Register("map", "square", func(Args) (*Node, error) {
		return NewStage(StageFunc[int, int](func(_ context.Context, v int) (int, error) { return v * v, nil })), nil
	})
	r.Register("map", "to-string", func(Args) (*Node, error) {
		return NewStage(StageFunc[int, string](func(_ context.Context, v int) (string, error) { return fmt.Sprint(v), nil })), nil
	})
	r.Register("sink", "collect", func(a Args) (*Node, error) {
		return NewSink[int](a.Deps.(*collector[int])), nil
	})
	return r
}

const specYAML = `
nodes:
  - {name: numbers, slot: source, impl: counter, options: {count: 10}}
  - {name: double, slot: map, impl: double}
  - {name: out, slot: sink, impl: collect}
edges:
  - {from: numbers, to: double, capacity: 4}
  - {from: double, to: out}
`

func TestYAMLGraphEqualsGoGraph(t *testing.T) {
	spec, err := ParseSpec([]byte(specYAML))
	if err != nil {
		t.Fatal(err)
	}
	fromYAML := &collector[int]{}
	g1, err := spec.Build(testRegistry(), fromYAML)
	if err != nil {
		t.Fatal(err)
	}
	fromGo := &collector[int]{}
	g2 := New().
		Add("numbers", NewSource[int](&counter{n: 10})).
		Add("double", NewStage(double())).
		Add("out", NewSink[int](fromGo)).
		Connect("numbers", "double", 4).
		Connect("double", "out", 0)
	for _, g := range []*Graph{g1, g2} {
		if err := g.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(fromYAML.items(), fromGo.items()) || len(fromGo.items()) != 10 {
		t.Errorf("YAML graph gave %v, Go graph %v", fromYAML.items(), fromGo.items())
	}
	t1, t2 := g1.Topology(), g2.Topology()
	if !reflect.DeepEqual(t1.Edges, t2.Edges) || len(t1.Nodes) != len(t2.Nodes) {
		t.Errorf("topologies differ:\n%+v\n%+v", t1, t2)
	}
	for i := range t1.Nodes {
		a, b := t1.Nodes[i], t2.Nodes[i]
		if a.Name != b.Name || a.Kind != b.Kind || a.In != b.In || a.Out != b.Out {
			t.Errorf("node %d differs: %+v vs %+v", i, a, b)
		}
	}
}

func TestSpecErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown implementation", strings.Replace(specYAML, "impl: double", "impl: tripple", 1),
			[]string{`node "double"`, `slot "map" has no implementation "tripple"`, "double, square, to-string"}},
		{"unknown slot", strings.Replace(specYAML, "slot: map", "slot: mapp", 1),
			[]string{`no slot "mapp"`}},
		{"type mismatch", strings.Replace(specYAML, "impl: double", "impl: to-string", 1),
			[]string{`"double" produces string`, `"out" consumes int`}},
		{"bad option", strings.Replace(specYAML, "{count: 10}", "{cuont: 10}", 1),
			[]string{"source=counter options", "cuont"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := ParseSpec([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			_, err = spec.Build(testRegistry(), &collector[int]{})
			if err == nil {
				t.Fatal("Build succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseSpecErrors(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"empty", "", "spec is empty"},
		{"unknown key", "nodes: []\nedgez: []\n", "line 2: field edgez not found"},
		{"wrong type", "nodes:\n  - {name: a}\nedges:\n  - {from: a, to: b, capacity: lots}\n", "line 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseSpec = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRegisterDuplicatePanics(t *testing.T) {
	r := NewRegistry()
	f := func(Args) (*Node, error) { return NewStage(double()), nil }
	r.Register("map", "double", f)
	defer func() {
		if recover() == nil {
			t.Error("duplicate Register did not panic")
		}
	}()
	r.Register("map", "double", f)
}

func TestLayoutResolve(t *testing.T) {
	layout := Layout{
		Slots:    []string{"source", "schedule", "forward", "sample", "post"},
		Capacity: 2,
		Loop:     &Loop{Head: "schedule", Tail: "post", MaxInFlight: 2},
	}
	tests := []struct {
		name      string
		choices   Choices
		wantNodes []string // name(slot=impl)
		wantEdges []string
		wantErr   string
	}{
		{
			name:      "defaults",
			wantNodes: []string{"source=default", "schedule=default", "forward=default", "sample=default", "post=default"},
			wantEdges: []string{"source->schedule", "schedule->forward", "forward->sample", "sample->post", "post~>schedule(2)"},
		},
		{
			name: "swap a stage and insert two",
			choices: Choices{
				Impl: map[string]string{"sample": "my-sampler"},
				Insert: []Insertion{
					{After: "forward", Stage: "softcap"},
					{After: "forward", Stage: "softcap"},
				},
			},
			wantNodes: []string{"source=default", "schedule=default", "forward=default", "softcap=default", "softcap-2=default", "sample=my-sampler", "post=default"},
			wantEdges: []string{"source->schedule", "schedule->forward", "forward->softcap", "softcap->softcap-2", "softcap-2->sample", "sample->post", "post~>schedule(2)"},
		},
		{
			name:      "insert after the loop tail moves the feedback",
			choices:   Choices{Insert: []Insertion{{After: "post", Stage: "audit", Impl: "log"}}},
			wantNodes: []string{"source=default", "schedule=default", "forward=default", "sample=default", "post=default", "audit=log"},
			wantEdges: []string{"source->schedule", "schedule->forward", "forward->sample", "sample->post", "post->audit", "audit~>schedule(2)"},
		},
		{
			name:    "unknown slot suggests the nearest",
			choices: Choices{Impl: map[string]string{"sampel": "x"}},
			wantErr: `slot "sampel" is not a slot of this pipeline (did you mean "sample"?)`,
		},
		{
			name:    "insert after an unknown slot",
			choices: Choices{Insert: []Insertion{{After: "forwrd", Stage: "x"}}},
			wantErr: `insert after "forwrd" is not a slot of this pipeline (did you mean "forward"?)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := layout.Resolve(tc.choices)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve = %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var nodes, edges []string
			for _, n := range spec.Nodes {
				nodes = append(nodes, n.Name+"="+n.impl())
				if n.Name != n.slot() && !strings.HasPrefix(n.Name, n.slot()+"-") {
					t.Errorf("node %q fills slot %q", n.Name, n.slot())
				}
			}
			for _, e := range spec.Edges {
				if e.Feedback {
					edges = append(edges, fmt.Sprintf("%s~>%s(%d)", e.From, e.To, e.MaxInFlight))
				} else {
					edges = append(edges, e.From+"->"+e.To)
					if e.Capacity != 2 {
						t.Errorf("edge %s->%s capacity %d, want 2", e.From, e.To, e.Capacity)
					}
				}
			}
			if !reflect.DeepEqual(nodes, tc.wantNodes) {
				t.Errorf("nodes = %v\nwant    %v", nodes, tc.wantNodes)
			}
			if !reflect.DeepEqual(edges, tc.wantEdges) {
				t.Errorf("edges = %v\nwant    %v", edges, tc.wantEdges)
			}
		})
	}
}

func TestRender(t *testing.T) {
	spec, err := ParseSpec([]byte(specYAML))
	if err != nil {
		t.Fatal(err)
	}
	g, err := spec.Build(testRegistry(), &collector[int]{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	stats := g.Stats()
	mermaid := g.Topology().Mermaid(stats)
	for _, w := range []string{"flowchart LR", `n0(["numbers<br/>source=counter<br/>10 items`, `n1["double<br/>map=double`, `n0 -->|"int"| n1`} {
		if !strings.Contains(mermaid, w) {
			t.Errorf("mermaid lacks %q:\n%s", w, mermaid)
		}
	}
	dot := g.Topology().DOT(nil)
	for _, w := range []string{"digraph pipeline", `"numbers" -> "double" [label="int"]`, `"out" [shape=ellipse`} {
		if !strings.Contains(dot, w) {
			t.Errorf("dot lacks %q:\n%s", w, dot)
		}
	}
	table := FormatStats(stats)
	if !strings.Contains(table, "double") || !strings.Contains(table, "wait-out") {
		t.Errorf("stats table:\n%s", table)
	}
	if b, ok := Bottleneck(stats); !ok || b.Name == "" {
		t.Errorf("Bottleneck = %+v, %v", b, ok)
	}
}

func TestNearest(t *testing.T) {
	cands := []string{"max_num_seqs", "max_num_batched_tokens", "max_model_len"}
	for in, want := range map[string]string{
		"max_num_seq":   "max_num_seqs",
		"max_modle_len": "max_model_len",
		"temperature":   "",
	} {
		if got := Nearest(in, cands); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
}

// typedOpts are options with a check, for the typed registration tests.
type typedOpts struct {
	Factor int    `yaml:"factor"`
	Name   string `yaml:"name"`
}

func (o *typedOpts) Validate() error {
	if o.Factor < 1 {
		return fmt.Errorf("factor must be at least 1, got %d", o.Factor)
	}
	return nil
}

// Typed options are decoded strictly over their defaults and validated
// once, by Spec.Check without building and by the factory when it builds;
// a clone of a registry holds its implementations and takes new ones
// without changing the original.
func TestRegisterOptions(t *testing.T) {
	r := NewRegistry()
	var got typedOpts
	RegisterOptions(r, "map", "scale", typedOpts{Factor: 2, Name: "x"}, func(a Args, o typedOpts) (*Node, error) {
		got = o
		return NewStage(StageFunc[int, int](func(_ context.Context, v int) (int, error) { return v * o.Factor, nil })), nil
	})
	for _, tc := range []struct {
		opts map[string]any
		want string // error substring; "" for none
	}{
		{nil, ""},
		{map[string]any{"factor": 5}, ""},
		{map[string]any{"factor": 0}, "factor must be at least 1"},
		{map[string]any{"factr": 3}, "field factr not found"},
		{map[string]any{"factor": "many"}, "cannot unmarshal"},
	} {
		spec := Spec{Nodes: []NodeSpec{{Name: "m", Slot: "map", Impl: "scale", Options: tc.opts}}}
		err := spec.Check(r)
		if tc.want == "" {
			if err != nil {
				t.Errorf("options %v: Check = %v", tc.opts, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "map=scale") {
			t.Errorf("options %v: Check = %v, want an error naming map=scale and %q", tc.opts, err, tc.want)
		}
	}
	f, err := r.Lookup("map", "scale")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f(Args{Options: map[string]any{"factor": 7}}); err != nil || got.Factor != 7 || got.Name != "x" {
		t.Errorf("factory got %+v, %v; want factor 7 over the default name", got, err)
	}
	if d, err := r.Defaults("map", "scale"); err != nil || d.(typedOpts).Factor != 2 {
		t.Errorf("Defaults = %v, %v", d, err)
	}
	c := r.Clone()
	c.Register("map", "double", func(Args) (*Node, error) { return NewStage(double()), nil })
	if _, err := r.Lookup("map", "double"); err == nil {
		t.Error("registering in a clone changed the original")
	}
	if _, err := c.Lookup("map", "scale"); err != nil {
		t.Errorf("the clone lost an implementation: %v", err)
	}
}

// A node that names no implementation runs "default", or the slot's only
// implementation; with several and no default it is an error listing them.
func TestImplementationChoice(t *testing.T) {
	r := NewRegistry()
	mk := func(Args) (*Node, error) { return NewStage(double()), nil }
	r.Register("solo", "mine", mk)
	r.Register("many", "a", mk)
	r.Register("many", "b", mk)
	for _, tc := range []struct{ slot, want string }{
		{"solo", ""},
		{"many", `slot "many" has no implementation "default" and several others: name one with impl (registered: a, b)`},
		{"none", `no slot "none" is registered`},
	} {
		spec := Spec{Nodes: []NodeSpec{{Name: "n", Slot: tc.slot}}}
		err := spec.Check(r)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.slot, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Check = %v, want %q", tc.slot, err, tc.want)
		}
	}
}
