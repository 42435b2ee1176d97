package pipeline

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// Args is what a Factory gets to build one node.
type Args struct {
	Name    string         // the node's name in the graph
	Slot    string         // the slot it fills
	Impl    string         // the registered implementation name
	Options map[string]any // free-form options from the spec (YAML)
	Deps    any            // whatever the graph's owner passes to Spec.Build
}

// DecodeOptions decodes a.Options into v (a pointer to a struct with yaml
// tags), strictly: an option v does not declare is an error naming it.
func (a Args) DecodeOptions(v any) error {
	if len(a.Options) == 0 {
		return nil
	}
	raw, err := yaml.Marshal(a.Options)
	if err != nil {
		return fmt.Errorf("pipeline: %s=%s options: %w", a.Slot, a.Impl, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("pipeline: %s=%s options: %w", a.Slot, a.Impl, err)
	}
	return nil
}

// Factory builds a node from its Args.
type Factory func(Args) (*Node, error)

// Registry maps (slot, name) to factories. It is safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[string]map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]map[string]Factory{}} }

// Register adds a factory under slot and name. It panics on an empty slot or
// name, a nil factory, or a duplicate: registrations happen at init time and
// a clash is a programming error.
func (r *Registry) Register(slot, name string, f Factory) {
	if slot == "" || name == "" || f == nil {
		panic(fmt.Sprintf("pipeline: Register(%q, %q): empty slot or name, or nil factory", slot, name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[slot] == nil {
		r.m[slot] = map[string]Factory{}
	}
	if r.m[slot][name] != nil {
		panic(fmt.Sprintf("pipeline: Register(%q, %q): already registered", slot, name))
	}
	r.m[slot][name] = f
}

// Lookup returns the factory for slot and name, or an error that lists what
// the slot offers.
func (r *Registry) Lookup(slot, name string) (Factory, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	impls, ok := r.m[slot]
	if !ok {
		return nil, fmt.Errorf("pipeline: no slot %q is registered (slots: %s)", slot, strings.Join(r.slotsLocked(), ", "))
	}
	f, ok := impls[name]
	if !ok {
		return nil, fmt.Errorf("pipeline: slot %q has no implementation %q (registered: %s)", slot, name, strings.Join(sortedKeys(impls), ", "))
	}
	return f, nil
}

// Names returns the implementations registered under slot, sorted.
func (r *Registry) Names(slot string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return sortedKeys(r.m[slot])
}

// Slots returns every slot with at least one implementation, sorted.
func (r *Registry) Slots() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.slotsLocked()
}

func (r *Registry) slotsLocked() []string { return sortedKeys(r.m) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// defaultRegistry is the process-wide registry that stage packages fill
// from their init functions, as database/sql drivers do. It is the one
// piece of package state: written only at init, read afterwards.
var defaultRegistry = NewRegistry()

// Register adds a factory to the default registry (see Registry.Register).
func Register(slot, name string, f Factory) { defaultRegistry.Register(slot, name, f) }

// DefaultRegistry returns the registry that Register fills.
func DefaultRegistry() *Registry { return defaultRegistry }
