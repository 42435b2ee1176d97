package pipeline

import (
	"fmt"
	"sort"
	"strings"
)

// Layout is a chain of slots, optionally closed into a loop: the shape an
// application fixes in Go (for an inference engine: requests, tokenize,
// schedule, prepare, forward, sample, postprocess, with a loop from
// postprocess back to schedule). Users then pick the implementation of each
// slot and insert extra stages with Choices, usually from YAML.
type Layout struct {
	Slots    []string // in chain order
	Capacity int      // capacity of every forward edge; 0 means DefaultCapacity
	Loop     *Loop    // nil for a plain chain
	// Lagged are lagged edges between slots (Edge.Lag); they join the
	// slots' own nodes whatever is inserted after them.
	Lagged []Edge
}

// Loop closes a Layout: a feedback edge from Tail back to Head (a planner
// slot) with at most MaxInFlight items inside.
type Loop struct {
	Head, Tail  string
	MaxInFlight int
}

// Choices are a user's changes to a Layout: an implementation per slot and
// stages inserted after a slot. YAML:
//
//	sample: my-sampler          # slot: implementation
//	insert:
//	  - after: forward
//	    stage: logit-softcap    # a slot registered for insertion
//	    impl: default           # optional
//	    options: {cap: 30}
type Choices struct {
	Impl    map[string]string         `yaml:",inline"`
	Insert  []Insertion               `yaml:"insert"`
	Options map[string]map[string]any `yaml:"options"` // slot -> options for its implementation
}

// Insertion is an extra stage placed right after a slot.
type Insertion struct {
	After   string         `yaml:"after"`
	Stage   string         `yaml:"stage"`
	Impl    string         `yaml:"impl"`
	Name    string         `yaml:"name"` // node name; defaults to Stage (numbered if repeated)
	Options map[string]any `yaml:"options"`
}

// Resolve applies choices to the layout and returns the Spec to build. An
// unknown slot name in choices is an error naming the nearest slot.
func (l Layout) Resolve(c Choices) (Spec, error) {
	known := map[string]bool{}
	for _, s := range l.Slots {
		known[s] = true
	}
	var errs []string
	check := func(what, slot string) {
		if !known[slot] {
			errs = append(errs, fmt.Sprintf("%s %q is not a slot of this pipeline%s (slots: %s)",
				what, slot, suggest(slot, l.Slots), strings.Join(l.Slots, ", ")))
		}
	}
	for _, slot := range sortedKeys(c.Impl) {
		check("slot", slot)
	}
	for _, slot := range sortedKeys(c.Options) {
		check("options for slot", slot)
	}
	for _, ins := range c.Insert {
		check("insert after", ins.After)
		if ins.Stage == "" {
			errs = append(errs, fmt.Sprintf("insert after %q: stage is empty", ins.After))
		}
	}
	if len(errs) > 0 {
		return Spec{}, fmt.Errorf("pipeline: %s", strings.Join(errs, "; "))
	}

	var spec Spec
	used := map[string]int{}
	for _, s := range l.Slots {
		used[s] = 1
	}
	tail := ""
	if l.Loop != nil {
		tail = l.Loop.Tail
	}
	prev := ""
	link := func(name string) {
		if prev != "" {
			spec.Edges = append(spec.Edges, Edge{From: prev, To: name, Capacity: l.Capacity})
		}
		prev = name
	}
	for _, slot := range l.Slots {
		spec.Nodes = append(spec.Nodes, NodeSpec{Name: slot, Slot: slot, Impl: c.Impl[slot], Options: c.Options[slot]})
		link(slot)
		for _, ins := range c.Insert {
			if ins.After != slot {
				continue
			}
			name := ins.Name
			if name == "" {
				name = ins.Stage
			}
			if used[name]++; used[name] > 1 {
				name = fmt.Sprintf("%s-%d", name, used[name])
			}
			spec.Nodes = append(spec.Nodes, NodeSpec{Name: name, Slot: ins.Stage, Impl: ins.Impl, Options: ins.Options})
			link(name)
			if slot == tail {
				tail = name
			}
		}
	}
	if l.Loop != nil {
		spec.Edges = append(spec.Edges, Edge{From: tail, To: l.Loop.Head, Feedback: true, MaxInFlight: l.Loop.MaxInFlight})
	}
	spec.Edges = append(spec.Edges, l.Lagged...)
	return spec, nil
}

// suggest returns `; did you mean "x"?` for the candidate nearest to s, or
// "" when none is close.
func suggest(s string, candidates []string) string {
	if n := Nearest(s, candidates); n != "" {
		return fmt.Sprintf(" (did you mean %q?)", n)
	}
	return ""
}

// Nearest returns the candidate with the smallest edit distance to s, if
// that distance is at most a third of the longer string (else "").
func Nearest(s string, candidates []string) string {
	best, bestD := "", -1
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	for _, c := range sorted {
		d := editDistance(s, c)
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := max(len(s), len(best))/3 + 1
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
