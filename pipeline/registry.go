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
	if err := decodeStrict(a.Options, v); err != nil {
		return fmt.Errorf("pipeline: %s=%s options: %w", a.Slot, a.Impl, err)
	}
	return nil
}

// decodeStrict decodes raw into v through YAML, refusing unknown keys.
func decodeStrict(raw map[string]any, v any) error {
	if len(raw) == 0 {
		return nil
	}
	data, err := yaml.Marshal(raw)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// Factory builds a node from its Args.
type Factory func(Args) (*Node, error)

// Validator is implemented by option types that check their values (see
// RegisterOptions).
type Validator interface {
	Validate() error
}

// entry is one registered implementation: its factory and, for typed
// options, how they are decoded and checked.
type entry struct {
	factory  Factory
	defaults any                               // typed options' defaults; nil for a plain Factory
	decode   func(map[string]any) (any, error) // nil: options reach the factory as they are
}

// Registry maps (slot, name) to factories. It is safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[string]map[string]entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]map[string]entry{}} }

// Register adds a factory under slot and name. It panics on an empty slot or
// name, a nil factory, or a duplicate: registrations happen at init time and
// a clash is a programming error. The factory gets its options as written
// (Args.Options; see Args.DecodeOptions); RegisterOptions gives it a typed,
// checked value instead.
func (r *Registry) Register(slot, name string, f Factory) { r.add(slot, name, entry{factory: f}) }

func (r *Registry) add(slot, name string, e entry) {
	if slot == "" || name == "" || e.factory == nil {
		panic(fmt.Sprintf("pipeline: Register(%q, %q): empty slot or name, or nil factory", slot, name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[slot] == nil {
		r.m[slot] = map[string]entry{}
	}
	if r.m[slot][name].factory != nil {
		panic(fmt.Sprintf("pipeline: Register(%q, %q): already registered", slot, name))
	}
	r.m[slot][name] = e
}

// RegisterOptions adds to r (nil: the default registry) an implementation
// whose options are the type O: the YAML options of a node are decoded
// strictly into a copy of defaults (an unknown key is an error naming it),
// checked with O's Validate method when it has one, and handed to build as
// that value. Spec.Check does the same decoding without building, so a
// config's stage options are refused when it loads; the decoding is the one
// path from YAML to the stage. Panics as Register does.
func RegisterOptions[O any](r *Registry, slot, name string, defaults O, build func(Args, O) (*Node, error)) {
	if r == nil {
		r = defaultRegistry
	}
	if build == nil {
		panic(fmt.Sprintf("pipeline: RegisterOptions(%q, %q): nil build", slot, name))
	}
	decode := func(raw map[string]any) (any, error) {
		opts := defaults
		if err := decodeStrict(raw, &opts); err != nil {
			return nil, err
		}
		if v, ok := any(&opts).(Validator); ok {
			if err := v.Validate(); err != nil {
				return nil, err
			}
		}
		return opts, nil
	}
	r.add(slot, name, entry{
		defaults: defaults,
		decode:   decode,
		factory: func(a Args) (*Node, error) {
			opts, err := decode(a.Options)
			if err != nil {
				return nil, fmt.Errorf("options: %w", err)
			}
			return build(a, opts.(O))
		},
	})
}

// Lookup returns the factory for slot and name, or an error that lists what
// the slot offers.
func (r *Registry) Lookup(slot, name string) (Factory, error) {
	e, err := r.lookup(slot, name)
	return e.factory, err
}

func (r *Registry) lookup(slot, name string) (entry, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	impls, ok := r.m[slot]
	if !ok {
		return entry{}, fmt.Errorf("pipeline: no slot %q is registered (slots: %s)", slot, strings.Join(r.slotsLocked(), ", "))
	}
	e, ok := impls[name]
	if !ok {
		return entry{}, fmt.Errorf("pipeline: slot %q has no implementation %q (registered: %s)", slot, name, strings.Join(sortedKeys(impls), ", "))
	}
	return e, nil
}

// implFor returns the implementation a node of slot runs when its spec
// names impl: impl itself when set; else "default" when the slot has one,
// else the slot's only implementation; else an error that lists them.
func (r *Registry) implFor(slot, impl string) (string, error) {
	if impl != "" {
		return impl, nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	impls, ok := r.m[slot]
	switch {
	case !ok:
		return "", fmt.Errorf("pipeline: no slot %q is registered (slots: %s)", slot, strings.Join(r.slotsLocked(), ", "))
	case impls["default"].factory != nil:
		return "default", nil
	case len(impls) == 1:
		for name := range impls {
			return name, nil
		}
	}
	return "", fmt.Errorf("pipeline: slot %q has no implementation \"default\" and several others: name one with impl (registered: %s)", slot, strings.Join(sortedKeys(impls), ", "))
}

// CheckOptions decodes and checks options for slot's implementation name
// as its factory will, without building anything. Implementations
// registered with a plain Factory accept any options here (their factory
// checks them).
func (r *Registry) CheckOptions(slot, name string, options map[string]any) error {
	e, err := r.lookup(slot, name)
	if err != nil {
		return err
	}
	if e.decode == nil {
		return nil
	}
	if _, err := e.decode(options); err != nil {
		return fmt.Errorf("pipeline: %s=%s options: %w", slot, name, err)
	}
	return nil
}

// Defaults returns the default options of slot's implementation name (nil
// when it was registered with a plain Factory), for documentation.
func (r *Registry) Defaults(slot, name string) (any, error) {
	e, err := r.lookup(slot, name)
	return e.defaults, err
}

// Clone returns a new registry holding r's registrations: a program adds
// its own stages to the clone of the default registry (which the built-in
// stage packages fill at init) without touching the process-wide one.
func (r *Registry) Clone() *Registry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := NewRegistry()
	for slot, impls := range r.m {
		c.m[slot] = make(map[string]entry, len(impls))
		for name, e := range impls {
			c.m[slot][name] = e
		}
	}
	return c
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
