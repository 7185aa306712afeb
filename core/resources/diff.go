package resources

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
)

// Diff returns the difference between two JSON documents (nil before means nothing) as lines,
// one per changed leaf, sorted by path: "+ path: value" added, "- path: value" removed,
// "~ path: old -> new" changed. Paths are object keys joined by "."; arrays are compared whole.
// Equal documents give no line.
func Diff(before, after json.RawMessage) ([]string, error) {
	a, err := flatten(before)
	if err != nil {
		return nil, err
	}
	b, err := flatten(after)
	if err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	out := []string{}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		av, inA := a[k]
		bv, inB := b[k]
		switch {
		case !inA:
			out = append(out, "+ "+k+": "+bv)
		case !inB:
			out = append(out, "- "+k+": "+av)
		case av != bv:
			out = append(out, "~ "+k+": "+av+" -> "+bv)
		}
	}
	return out, nil
}

// flatten maps each leaf path of a JSON document to its canonical JSON value.
func flatten(raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if len(bytes.TrimSpace(raw)) == 0 {
		return out, nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok && (len(m) > 0 || prefix == "") {
			for k, sub := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, sub)
			}
			return
		}
		b, _ := json.Marshal(v) // decoded JSON: cannot fail
		out[prefix] = string(b)
	}
	walk("", v)
	return out, nil
}
