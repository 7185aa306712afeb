package wasm

import (
	"context"
	"testing"

	"github.com/berthhq/berth/internal/wasmtest"
)

// brokenModuleFuel ends the endless loop after about 4 million iterations;
// the other test modules answer with a few hundred units.
const brokenModuleFuel = 1 << 22

// TestSuiteFailsBrokenModules proves each check catches what it is for, with
// modules that break the ABI on purpose.
func TestSuiteFailsBrokenModules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		module []byte
		failed string // the first check expected to fail
	}{
		{"endless loop", wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Loop}), "sample"},
		{"answer changes on every call", wasmtest.Policy(wasmtest.PolicyOptions{Counter: true}), "determinism"},
		{"answers allow to anything", wasmtest.Policy(wasmtest.PolicyOptions{}), "malformed-input"},
		{"missing deallocate", wasmtest.Policy(wasmtest.PolicyOptions{NoDealloc: true}), "load"},
	}
	for _, c := range cases {
		results, err := Check(context.Background(), c.module, Options{Fuel: brokenModuleFuel, CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		first := ""
		for _, r := range results {
			if r.Err != nil {
				first = r.Name
				t.Logf("%s: %s: %v", c.name, r.Name, r.Err)
				break
			}
		}
		if first != c.failed {
			t.Errorf("%s: first failing check %q, want %q", c.name, first, c.failed)
		}
	}
}

// TestSuiteOPAModules: an OPA-compiled policy passes every check, and one
// that refuses to decide (opa_abort on a Rego runtime error) fails sample.
func TestSuiteOPAModules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, good := wasmtest.BuildRego(t, "package berth\n\nimport rego.v1\n\ndeny contains msg if {\n\tinput.object.replicas > 10\n\tmsg := sprintf(\"%d replicas\", [input.object.replicas])\n}\n", "berth/deny")
	// A conflict of a complete rule's values is a runtime error.
	_, broken := wasmtest.BuildRego(t, "package berth\n\nimport rego.v1\n\nallow := true if input.hook\nallow := false if input.hook\n", "berth/allow")
	for name, c := range map[string]struct {
		module []byte
		failed string
	}{"good": {good, ""}, "conflicting rule": {broken, "sample"}} {
		results, err := Check(ctx, c.module, Options{CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		first := ""
		for _, r := range results {
			if r.Err != nil {
				first = r.Name
				t.Logf("%s: %s: %v", name, r.Name, r.Err)
				break
			}
		}
		if first != c.failed || len(results) != 6 {
			t.Errorf("%s: first failing check %q of %d, want %q of 6", name, first, len(results), c.failed)
		}
	}
}
