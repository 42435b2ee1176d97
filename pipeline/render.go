package pipeline

import (
	"fmt"
	"strings"
)

// Topology is a graph's shape for rendering: nodes with their kinds, types
// and labels, and the declared edges.
type Topology struct {
	Nodes []TopoNode
	Edges []Edge
}

// TopoNode is one node of a Topology. Types are empty when unknown (a Spec
// that was not built).
type TopoNode struct {
	Name  string
	Label string // e.g. "sample=default"
	Kind  string
	In    string
	Out   string
}

// Topology returns the declared shape of g, with types.
func (g *Graph) Topology() Topology {
	var t Topology
	for _, name := range g.order {
		n := g.nodes[name]
		tn := TopoNode{Name: name, Label: n.label, Kind: n.node.kind.String()}
		if n.node.in != nil {
			tn.In = n.node.in.String()
		}
		if n.node.out != nil {
			tn.Out = n.node.out.String()
		}
		t.Nodes = append(t.Nodes, tn)
	}
	t.Edges = append(t.Edges, g.edges...)
	return t
}

func (t Topology) edgeLabel(e Edge) string {
	if e.Feedback {
		return fmt.Sprintf("feedback, in flight <= %d", e.MaxInFlight)
	}
	if e.Lag > 0 {
		return fmt.Sprintf("lagged %d: item k waits for item k-%d", e.Lag, e.Lag)
	}
	for _, n := range t.Nodes {
		if n.Name == e.From && n.Out != "" {
			return n.Out
		}
	}
	return ""
}

func (t Topology) nodeText(n TopoNode, stats map[string]StageStats) []string {
	lines := []string{n.Name}
	if n.Label != "" && n.Label != n.Name {
		lines = append(lines, n.Label)
	}
	if s, ok := stats[n.Name]; ok {
		lines = append(lines, fmt.Sprintf("%d items, busy %s", s.Items, round(s.Busy)))
		lines = append(lines, fmt.Sprintf("wait in %s, out %s", round(s.WaitIn), round(s.WaitOut)))
	}
	return lines
}

func statsByName(stats []StageStats) map[string]StageStats {
	m := make(map[string]StageStats, len(stats))
	for _, s := range stats {
		m[s.Name] = s
	}
	return m
}

// Mermaid renders t as a Mermaid flowchart; stats, when given, annotate the
// nodes with items and times.
func (t Topology) Mermaid(stats []StageStats) string {
	sm := statsByName(stats)
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	ids := map[string]string{}
	for i, n := range t.Nodes {
		id := fmt.Sprintf("n%d", i)
		ids[n.Name] = id
		text := strings.Join(t.nodeText(n, sm), "<br/>")
		text = strings.ReplaceAll(text, `"`, "#quot;")
		open, close := "[", "]"
		switch n.Kind {
		case KindSource.String(), KindSink.String():
			open, close = "([", "])"
		case KindPlanner.String():
			open, close = "{{", "}}"
		}
		fmt.Fprintf(&b, "  %s%s\"%s\"%s\n", id, open, text, close)
	}
	for _, e := range t.Edges {
		arrow := "-->"
		switch {
		case e.Feedback:
			arrow = "-.->"
		case e.Lag > 0:
			arrow = "-.-o"
		}
		label := strings.ReplaceAll(t.edgeLabel(e), `"`, "#quot;")
		if label != "" {
			fmt.Fprintf(&b, "  %s %s|\"%s\"| %s\n", ids[e.From], arrow, label, ids[e.To])
		} else {
			fmt.Fprintf(&b, "  %s %s %s\n", ids[e.From], arrow, ids[e.To])
		}
	}
	return b.String()
}

// DOT renders t in Graphviz DOT; stats, when given, annotate the nodes.
func (t Topology) DOT(stats []StageStats) string {
	sm := statsByName(stats)
	var b strings.Builder
	b.WriteString("digraph pipeline {\n  rankdir=LR;\n  node [shape=box];\n")
	for _, n := range t.Nodes {
		shape := "box"
		switch n.Kind {
		case KindSource.String(), KindSink.String():
			shape = "ellipse"
		case KindPlanner.String():
			shape = "hexagon"
		}
		fmt.Fprintf(&b, "  %q [shape=%s, label=%q];\n", n.Name, shape, strings.Join(t.nodeText(n, sm), "\n"))
	}
	for _, e := range t.Edges {
		attrs := fmt.Sprintf("label=%q", t.edgeLabel(e))
		switch {
		case e.Feedback:
			attrs += ", style=dashed, constraint=false"
		case e.Lag > 0:
			attrs += ", style=dotted, arrowhead=odot, constraint=false"
		}
		fmt.Fprintf(&b, "  %q -> %q [%s];\n", e.From, e.To, attrs)
	}
	b.WriteString("}\n")
	return b.String()
}
