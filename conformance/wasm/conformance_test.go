package wasm

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
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

// TestSuiteFailsRouteTablesBerthdRefuses: a route compiler whose table
// berthd refuses (a digest that does not match, a table a gateway cannot
// route) fails the sample check with berthd's reason.
func TestSuiteFailsRouteTablesBerthdRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	answer := func(rs []abiroutes.Route, sum string) string {
		if sum == "" {
			sum = abiroutes.Table{Routes: rs}.Digest()
		}
		raw, err := json.Marshal(abiwasm.RoutesOutput{Routes: rs, SHA256: sum})
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	up := []abiroutes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:8081", Healthy: true}}
	for name, c := range map[string]struct {
		module []byte
		want   string // in the sample check's error
	}{
		"wrong digest": {wasmtest.Routes("bad-sum", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up}},
			strings.Repeat("0", 64))), "hashes to"},
		"repeated hostname": {wasmtest.Routes("repeated", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up}, {Hostname: "hello.localhost"}}, "")),
			"repeated hostname"},
		"upper-case hostname": {wasmtest.Routes("upper", answer([]abiroutes.Route{{Hostname: "Hello.localhost", Upstreams: up}}, "")), "lower case"},
	} {
		results, err := Check(ctx, c.module, Options{CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		var failed *Result
		for i := range results {
			if results[i].Err != nil {
				failed = &results[i]
				break
			}
		}
		switch {
		case failed == nil:
			t.Errorf("%s: every check passed, want sample to fail with %q", name, c.want)
		case failed.Name != "sample" || !strings.Contains(failed.Err.Error(), c.want):
			t.Errorf("%s: first failing check %s: %v; want sample failing with %q", name, failed.Name, failed.Err, c.want)
		default:
			t.Logf("%s: %s: %v", name, failed.Name, failed.Err)
		}
	}
}
