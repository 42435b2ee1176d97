package server

import (
	"bytes"
	"encoding/json"
	"errors"
)

// jsonMember is one key of a JSON object with its value as written.
type jsonMember struct {
	Key   string
	Value json.RawMessage
}

// jsonObject is a JSON object with its keys in the order they were
// written (a map would lose it, and JSON schemas and chat templates
// render properties in that order).
type jsonObject []jsonMember

// errNotObject is parseObject's error for a value that is not an object.
var errNotObject = errors.New("not a JSON object")

// parseObject reads raw as a JSON object, keeping key order; a key given
// twice keeps its last value, at the place of its first (as Python's
// json.loads does). The error is errNotObject for any other JSON value.
func parseObject(raw json.RawMessage) (jsonObject, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, errNotObject
	}
	var obj jsonObject
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		obj = obj.with(key, v)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("data after the object")
	}
	return obj, nil
}

// get returns the value of key, or nil when it is absent.
func (o jsonObject) get(key string) json.RawMessage {
	for _, m := range o {
		if m.Key == key {
			return m.Value
		}
	}
	return nil
}

// with returns o with key set to v: in place when the key is there,
// appended otherwise.
func (o jsonObject) with(key string, v json.RawMessage) jsonObject {
	for i := range o {
		if o[i].Key == key {
			o[i].Value = v
			return o
		}
	}
	return append(o, jsonMember{key, v})
}

// without returns o without key.
func (o jsonObject) without(key string) jsonObject {
	out := o[:0:0]
	for _, m := range o {
		if m.Key != key {
			out = append(out, m)
		}
	}
	return out
}

// MarshalJSON writes the object compactly, keys in order.
func (o jsonObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		if err := json.Compact(&b, m.Value); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// compactJSON returns raw without insignificant whitespace; raw must be
// valid JSON.
func compactJSON(raw []byte) (string, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}

// jsonKindOf names the kind of a JSON value by its first byte, for error
// messages: "an object", "a string", ...
func jsonKindOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// checkKeys refuses keys of obj outside allowed, naming the first one as
// field.key.
func checkKeys(obj jsonObject, field string, allowed ...string) *apiError {
	for _, m := range obj {
		ok := false
		for _, a := range allowed {
			ok = ok || m.Key == a
		}
		if !ok {
			return badRequest(field+"."+m.Key, "unknown field %q in %s", m.Key, field)
		}
	}
	return nil
}
