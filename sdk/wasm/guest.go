// Package wasm helps write Berth WebAssembly modules in Go: policies and route
// compilers built with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
//
// Importing the package exports allocate, deallocate and berth_abi_version
// (docs/wasm-abi.md section 2). A module adds its metadata and its entry point,
// in a file built only for wasip1:
//
//	//go:build wasip1
//
//	package main
//
//	//go:wasmexport berth_metadata
//	func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "require-labels", "1.0.0") }
//
//	//go:wasmexport policy_evaluate
//	func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }
//
//	func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput { ... }
//
//	func main() {}
//
// The functions in this file are plain Go and build everywhere, so a policy's
// decision logic can be tested with go test on the host; the exports build
// only for wasip1.
package wasm

import (
	"encoding/json"
	"fmt"
	"sync"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// PolicyFunc decides one admission request. It returns [Allow], [Deny] or an
// output carrying an error ([Fail]).
type PolicyFunc func(in abiwasm.PolicyInput) abiwasm.PolicyOutput

// RoutesFunc compiles the route table. [HandleRoutes] adds the table's SHA-256.
type RoutesFunc func(in abiwasm.RoutesInput) ([]Route, error)

// Allow is an allow decision with optional warnings.
func Allow(warnings ...string) abiwasm.PolicyOutput {
	return abiwasm.PolicyOutput{Decision: abiwasm.Allow, Warnings: warnings}
}

// Deny is a deny decision; it needs at least one reason, so with none it
// gives the reason "denied by policy".
func Deny(reasons ...string) abiwasm.PolicyOutput {
	if len(reasons) == 0 {
		reasons = []string{"denied by policy"}
	}
	return abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: reasons}
}

// Fail is the error convention's answer (docs/wasm-abi.md section 4).
func Fail(code, format string, args ...any) abiwasm.PolicyOutput {
	return abiwasm.PolicyOutput{Error: &abiwasm.GuestError{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// Object decodes in's object (or, with old, its old object) into a T. It
// returns ok false when the object is null or absent, and an error when it is
// not a T. A Service, Placement or Node is decoded without reflection
// (fastjson.go), and inside [HandlePolicy] from the tree the input's decode
// already parsed, so a policy must not modify the raw bytes of in.Object or
// in.OldObject before it decodes them. Any other T goes through
// encoding/json.
func Object[T any](raw json.RawMessage) (v T, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return v, false, nil
	}
	switch p := any(&v).(type) { // the fast paths of fastjson.go
	case *abiwasm.Service:
		err = decodeServiceRaw(raw, p)
	case *abiwasm.Placement:
		err = decodePlacementRaw(raw, p)
	case *abiwasm.Node:
		err = decodeNodeRaw(raw, p)
	default:
		err = json.Unmarshal(raw, &v)
	}
	if err != nil {
		return v, false, fmt.Errorf("decode object: %w", err)
	}
	return v, true, nil
}

// Config decodes in's binding configuration into a T; a null configuration
// leaves the zero T. A binding's configuration is the same on every call, so
// the decoded T is kept, by T and the configuration's bytes, and the next
// call with the same bytes gets it without decoding (encoding/json costs
// about 100 µs per call inside a guest). The T returned shares its slices
// and maps with the kept one: a policy must not modify them. A
// configuration that does not decode is not kept and fails on every call.
func Config[T any](in abiwasm.PolicyInput) (T, error) {
	var v T
	if len(in.Config) == 0 || string(in.Config) == "null" {
		return v, nil
	}
	key := configKey{typ: (*T)(nil), raw: string(in.Config)}
	if kept, ok := configs.get(key); ok {
		return kept.(T), nil
	}
	if err := json.Unmarshal(in.Config, &v); err != nil {
		return v, fmt.Errorf("decode config: %w", err)
	}
	configs.put(key, v)
	return v, nil
}

// configKey names a decoded configuration: the type it was decoded into
// (a nil *T, which compares equal only to a nil pointer of the same type)
// and its bytes.
type configKey struct {
	typ any
	raw string
}

// Bounds of the decoded configurations kept: a module bound a few times
// keeps each binding's, and no number or size of configurations can make
// the cache hold more than maxConfigBytes of them.
const (
	maxConfigs     = 16
	maxConfigBytes = 1 << 20
)

// configCache holds decoded configurations. When an entry would pass a
// bound, every entry is dropped first: bindings are few, so this happens
// only when configurations change (a binding updated).
type configCache struct {
	mu    sync.Mutex
	m     map[configKey]any
	bytes int
}

var configs configCache

func (c *configCache) get(k configKey) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *configCache) put(k configKey, v any) {
	if len(k.raw) > maxConfigBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxConfigs || c.bytes+len(k.raw) > maxConfigBytes {
		c.m, c.bytes = make(map[configKey]any, maxConfigs), 0
	}
	c.m[k] = v
	c.bytes += len(k.raw)
}

// HandlePolicy decodes a [abiwasm.PolicyInput] from input, calls fn and
// encodes its answer (both without reflection: fastjson.go, encode.go). Malformed input and an invalid answer become the error
// convention's output, never a trap.
func HandlePolicy(input []byte, fn PolicyFunc) []byte {
	// The fast path of fastjson.go. The parser is held until fn returns:
	// [Object] decodes the input's service from the tree it parsed.
	p := parsers.Get()
	defer parsers.Put(p)
	in, trees, err := decodePolicyInputTrees(p, input)
	if err != nil {
		return encodePolicyOutput(Fail(abiwasm.ErrCodeBadInput, "decode policy input: %s", err))
	}
	if !in.Hook.Valid() {
		return encodePolicyOutput(Fail(abiwasm.ErrCodeUnsupported, "unknown hook %q", in.Hook))
	}
	forget := rememberTrees(in, trees)
	defer forget()
	out := fn(in)
	if out.Error == nil && out.Decision != abiwasm.Allow && out.Decision != abiwasm.Deny {
		out = Fail("bad_output", "policy returned decision %q", out.Decision)
	}
	return encodePolicyOutput(out) // encode.go: json.Marshal's bytes, without reflection
}

// HandleRoutes decodes a [abiwasm.RoutesInput] from input, calls fn, and
// encodes the normalized table with its SHA-256 ([routes.Table.Digest]).
// Decoding and encoding take the reflection-free path of routesjson.go,
// which gives encoding/json's results, and the host hashes the table; malformed input and an error of fn
// become the error convention's output (docs/wasm-abi.md section 6).
func HandleRoutes(input []byte, fn RoutesFunc) []byte {
	in, err := abiwasm.DecodeRoutesInput(input)
	if err != nil {
		return mustJSON(abiwasm.RoutesOutput{Error: &abiwasm.GuestError{Code: abiwasm.ErrCodeBadInput, Message: "decode routes input: " + err.Error()}})
	}
	rs, err := fn(in)
	if err != nil {
		return mustJSON(abiwasm.RoutesOutput{Error: &abiwasm.GuestError{Code: "compile_failed", Message: err.Error()}})
	}
	normalizeRoutes(rs)
	return encodeRoutesOutput(rs)
}

// MetadataJSON is the JSON berth_metadata returns for a module of kind k.
func MetadataJSON(k abiwasm.Kind, name, version string) []byte {
	return mustJSON(abiwasm.Metadata{Kind: k, ABIMajor: abiwasm.Major, ABIMinor: abiwasm.Minor, Name: name, Version: version})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs and strings: a bug here
		b, _ = json.Marshal(Fail("internal", "encode output: %s", err))
	}
	return b
}
