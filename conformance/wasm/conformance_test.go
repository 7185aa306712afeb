package wasm

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
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
		"relative path prefix": {wasmtest.Routes("bad-prefix", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up, PathPrefix: "api"}}, "")),
			"route_path_prefix_invalid"},
		"dot-dot path prefix": {wasmtest.Routes("dotdot-prefix", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up, PathPrefix: "/api/../admin"}}, "")),
			"route_path_prefix_invalid"},
		"header name not a token": {wasmtest.Routes("bad-header", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up,
			Headers: []abiroutes.HeaderMatch{{Name: "X Env", Value: "canary"}}}}, "")), "route_header_invalid"},
		"repeated match set": {wasmtest.Routes("repeated-match", answer([]abiroutes.Route{{Hostname: "hello.localhost", Upstreams: up, PathPrefix: "/api"},
			{Hostname: "hello.localhost", Upstreams: up, PathPrefix: "/api"}}, "")), "route_match_duplicate"},
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

// TestSuiteRouteCasesAssertMatchConditions: a route compiler's table with
// several routes of one hostname (path prefixes, headers) passes
// conformance, and route-compiler cases tell its routes apart by hostname
// and match conditions: an expectation with the right conditions passes,
// one whose strip_prefix or header differs fails naming the route.
func TestSuiteRouteCasesAssertMatchConditions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	up := []abiroutes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:8081", Healthy: true}}
	rs := []abiroutes.Route{
		{Hostname: "hello.localhost", Upstreams: up},
		{Hostname: "hello.localhost", PathPrefix: "/api", StripPrefix: true},
		{Hostname: "hello.localhost", Headers: []abiroutes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
	}
	raw, err := json.Marshal(abiwasm.RoutesOutput{Routes: rs, SHA256: abiroutes.Table{Routes: rs}.Digest()})
	if err != nil {
		t.Fatal(err)
	}
	module := wasmtest.Routes("matching", string(raw)) // at most 512 bytes
	results, err := Check(ctx, module, Options{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		// A module with one fixed answer cannot refuse malformed input;
		// the checks of its table are what matter here.
		if r.Err != nil && r.Name != "malformed-input" {
			t.Errorf("conformance check %s: %v", r.Name, r.Err)
		}
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t), MaxInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	m, err := rt.Load(ctx, module)
	if err != nil {
		t.Fatal(err)
	}
	upY := []any{map[string]any{"workload_id": "wl_1", "address": "127.0.0.1:8081", "healthy": true}}
	route := func(extra map[string]any) any {
		r := map[string]any{"hostname": "hello.localhost", "project": "", "service": "", "upstreams": []any{}}
		if extra == nil {
			r["upstreams"] = upY
		}
		for k, v := range extra {
			r[k] = v
		}
		return r
	}
	header := []any{map[string]any{"name": "x-env", "value": "canary"}}
	suite := Suite{Cases: []Case{
		{Name: "right", Expect: Expect{Routes: []any{
			route(map[string]any{"headers": []any{map[string]any{"name": "X-Env", "value": "canary"}}}),
			route(map[string]any{"path_prefix": "/api", "strip_prefix": true}),
			route(nil),
		}}},
		{Name: "no strip", Expect: Expect{Routes: []any{
			route(map[string]any{"headers": []any{map[string]any{"name": "X-Env", "value": "canary"}}}),
			route(map[string]any{"path_prefix": "/api"}),
			route(nil),
		}}},
		{Name: "other header value", Expect: Expect{Routes: []any{
			route(map[string]any{"headers": []any{map[string]any{"name": "X-Env", "value": "beta"}}}),
			route(map[string]any{"path_prefix": "/api", "strip_prefix": true}),
			route(nil),
		}}},
		{Name: "header name case", Expect: Expect{Routes: []any{
			route(map[string]any{"headers": header}),
			route(map[string]any{"path_prefix": "/api", "strip_prefix": true}),
			route(nil),
		}}},
	}}
	got := suite.Run(ctx, m)
	want := map[string]string{
		"right":              "",
		"no strip":           `route hello.localhost/api: got`,
		"other header value": `route hello.localhost [x-env: beta]: missing`,
		"header name case":   `route hello.localhost [x-env: canary]: got`,
	}
	for _, r := range got {
		w := want[r.Name]
		switch {
		case w == "" && r.Err != nil:
			t.Errorf("%s: %v, want a pass", r.Name, r.Err)
		case w != "" && (r.Err == nil || !strings.Contains(r.Err.Error(), w)):
			t.Errorf("%s: %v, want a failure with %q", r.Name, r.Err, w)
		}
	}
}
