package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// Spec declares a graph as data: nodes picked from a Registry and the edges
// between them. YAML decodes into it:
//
//	nodes:
//	  - {name: numbers, slot: source, impl: counter, options: {count: 10}}
//	  - {name: double, slot: map, impl: double}
//	  - {name: out, slot: sink, impl: collect}
//	edges:
//	  - {from: numbers, to: double, capacity: 4}
//	  - {from: double, to: out}
type Spec struct {
	Nodes []NodeSpec `yaml:"nodes"`
	Edges []Edge     `yaml:"edges"`
}

// NodeSpec names one node and the implementation that fills it.
type NodeSpec struct {
	Name    string         `yaml:"name"`
	Slot    string         `yaml:"slot"`    // registry slot; empty means the node's name
	Impl    string         `yaml:"impl"`    // implementation; empty: "default", or the slot's only one
	Options map[string]any `yaml:"options"` // passed to the factory
}

func (n NodeSpec) slot() string {
	if n.Slot == "" {
		return n.Name
	}
	return n.Slot
}

func (n NodeSpec) impl() string {
	if n.Impl == "" {
		return "default"
	}
	return n.Impl
}

func (n NodeSpec) label() string { return n.slot() + "=" + n.impl() }

// ParseSpec decodes a YAML spec strictly: unknown keys and wrong types are
// errors with their line numbers.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return s, errors.New("pipeline: spec is empty")
		}
		return s, fmt.Errorf("pipeline: spec: %w", err)
	}
	return s, nil
}

// Build makes every node with its registered factory, passing deps through,
// declares the edges, and builds the graph (checking types).
func (s Spec) Build(r *Registry, deps any, opts ...Option) (*Graph, error) {
	g := New(opts...)
	var errs []error
	for _, ns := range s.Nodes {
		impl, err := r.implFor(ns.slot(), ns.Impl)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %q: %w", ns.Name, err))
			continue
		}
		ns.Impl = impl
		f, err := r.Lookup(ns.slot(), impl)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %q: %w", ns.Name, err))
			continue
		}
		n, err := f(Args{Name: ns.Name, Slot: ns.slot(), Impl: impl, Options: ns.Options, Deps: deps})
		if err != nil {
			errs = append(errs, fmt.Errorf("pipeline: node %q (%s): %w", ns.Name, ns.label(), err))
			continue
		}
		g.add(ns.Name, ns.label(), n)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	g.edges = append(g.edges, s.Edges...)
	if err := g.Build(); err != nil {
		return nil, err
	}
	return g, nil
}

// Check looks up every node's implementation in r and checks its options
// (Registry.CheckOptions), building nothing: what a config loader calls to
// refuse a bad pipeline before any model loads. All problems are reported.
func (s Spec) Check(r *Registry) error {
	var errs []error
	for _, ns := range s.Nodes {
		impl, err := r.implFor(ns.slot(), ns.Impl)
		if err == nil {
			err = r.CheckOptions(ns.slot(), impl, ns.Options)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %q: %w", ns.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Topology returns the spec's shape without building it (no types).
func (s Spec) Topology() Topology {
	var t Topology
	for _, n := range s.Nodes {
		t.Nodes = append(t.Nodes, TopoNode{Name: n.Name, Label: n.label()})
	}
	t.Edges = append(t.Edges, s.Edges...)
	return t
}
