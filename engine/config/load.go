package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/deepinfer/deepinfer-go/pipeline"
)

// ErrInvalid is wrapped by every error about a config's content.
var ErrInvalid = errors.New("invalid config")

// Load reads, decodes and validates a config file. Relative model and
// tokenizer paths are resolved against the file's directory. A file that
// names no model leaves Model empty for the caller to choose (Default's
// path is relative to this repository's configs/, which means nothing
// beside another file; the command line runs the shipped model).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	if !setsTopLevelKey(data, "model") {
		cfg.Model = ""
	}
	dir := filepath.Dir(path)
	for _, p := range []*string{&cfg.Model, &cfg.Tokenizer, &cfg.Speculative.DraftModel} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return cfg, nil
}

// Parse decodes data (named name in errors) over Default and validates it.
func Parse(name string, data []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("config %s: %w: %v", name, ErrInvalid, err)
	}
	if len(root.Content) == 0 || isNull(root.Content[0]) {
		return nil, fmt.Errorf("config %s: %w: the file is empty; start from configs/reference.yaml", name, ErrInvalid)
	}
	doc := root.Content[0]
	if err := check(name, doc, reflect.TypeFor[Config](), ""); err != nil {
		return nil, err
	}
	cfg := Default()
	if err := doc.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("config %s: %w: %v", name, ErrInvalid, err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	return &cfg, nil
}

// setsTopLevelKey reports whether the YAML document data (already parsed
// once without error) has key at its top level with a non-null value.
func setsTopLevelKey(data []byte, key string) bool {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return false
	}
	doc := root.Content[0]
	if doc.Kind == yaml.AliasNode {
		doc = doc.Alias
	}
	if doc.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == key {
			return !isNull(doc.Content[i+1])
		}
	}
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// check walks the YAML tree against t and reports the first unknown key or
// mistyped value, with its line and dotted path.
func check(file string, n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if isNull(n) {
		return nil
	}
	fail := func(n *yaml.Node, format string, args ...any) error {
		return fmt.Errorf("config %s:%d: %w: %s", file, n.Line, ErrInvalid, fmt.Sprintf(format, args...))
	}
	where := path
	if where == "" {
		where = "the top level"
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
		// A type that reads itself (VerifyBudget) says what it expects.
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return fail(n, "%s: %v", where, err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fail(n, "%s: expected a mapping of keys, got %s", where, describe(n))
		}
		fields, inline := structFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok && inline != nil {
				ft, ok = inline.Elem(), true
			}
			if !ok {
				names := make([]string, 0, len(fields))
				for name := range fields {
					names = append(names, name)
				}
				slices.Sort(names)
				hint := ""
				if near := pipeline.Nearest(k.Value, names); near != "" {
					hint = fmt.Sprintf("; did you mean %q?", near)
				}
				return fail(k, "unknown key %q in %s%s (valid keys: %s)", k.Value, where, hint, strings.Join(names, ", "))
			}
			if err := check(file, v, ft, join(path, k.Value)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fail(n, "%s: expected a mapping, got %s", where, describe(n))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := check(file, n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fail(n, "%s: expected a list, got %s", where, describe(n))
		}
		for i, item := range n.Content {
			if err := check(file, item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Interface:
		return nil
	default:
		if n.Kind != yaml.ScalarNode {
			return fail(n, "%s: expected %s, got %s", where, kindName(t), describe(n))
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return fail(n, "%s: expected %s, got %q", where, kindName(t), n.Value)
		}
		return nil
	}
}

// structFields maps yaml keys to field types, flattening inline structs;
// inline is the type of an inline map that takes the other keys, if any.
func structFields(t reflect.Type) (fields map[string]reflect.Type, inline reflect.Type) {
	fields = map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			switch f.Type.Kind() {
			case reflect.Struct:
				sub, subInline := structFields(f.Type)
				for k, v := range sub {
					fields[k] = v
				}
				if subInline != nil {
					inline = subInline
				}
			case reflect.Map:
				inline = f.Type
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields, inline
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return t.String()
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}
