// Package policies holds the example admission policies, one directory each,
// and this test: every example passes its own policy_test.yaml and the
// conformance suite (one Go guest, the AssemblyScript guest and the Rego
// policy compiled by opa). Go guests and the Rego policy are built here from
// source; the AssemblyScript module is built by `make modules`.
package policies

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	wasmconf "github.com/berthhq/berth/conformance/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

var goExamples = []string{"require-digest", "require-labels", "cap-replicas", "domain-zones", "require-health-check", "require-secret-refs"}

func TestExamples(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	modules := map[string][]byte{}
	for _, name := range goExamples {
		modules[name] = wasmtest.BuildGo(t, "examples/policies/"+name)
	}
	as, err := os.ReadFile("require-digest-as/policy.wasm")
	if err != nil {
		t.Fatalf("the AssemblyScript example is built by `make modules` (needs Node.js and npm): %v", err)
	}
	modules["require-digest-as"] = as
	rego, err := os.ReadFile("require-digest-rego/policy.rego")
	if err != nil {
		t.Fatal(err)
	}
	_, modules["require-digest-rego"] = wasmtest.BuildRego(t, string(rego), "berth/deny")
	for name, wasm := range modules {
		t.Run(name, func(t *testing.T) {
			suite, _, err := wasmconf.LoadSuite(name, "")
			if err != nil {
				t.Fatal(err)
			}
			m, err := rt.Load(ctx, wasm)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range suite.Run(ctx, m) {
				if r.Err != nil {
					t.Errorf("%s: %v", r.Name, r.Err)
				}
			}
			if name != "require-digest" && name != "require-digest-as" && name != "require-digest-rego" {
				return // the conformance suite: one Go guest, the AssemblyScript one and the OPA one
			}
			results, err := wasmconf.Check(ctx, wasm, wasmconf.Options{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 256})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range results {
				if r.Err != nil {
					t.Errorf("conformance %s: %v", r.Name, r.Err)
				}
			}
		})
	}
}

// TestUnknownFieldFailsCase: a case whose input holds a field berthd never
// sends (here "health" for health_check) fails naming the field and its
// path, instead of passing against a shape the live policy never sees.
func TestUnknownFieldFailsCase(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	m, err := rt.Load(ctx, wasmtest.BuildGo(t, "examples/policies/require-health-check"))
	if err != nil {
		t.Fatal(err)
	}
	suite := &wasmconf.Suite{Cases: []wasmconf.Case{{
		Name:   "a misspelt field",
		Input:  map[string]any{"hook": "service.apply", "object": map[string]any{"name": "web", "domains": []any{"web.localhost"}, "health": map[string]any{"path": "/"}}},
		Expect: wasmconf.Expect{Decision: "allow"},
	}}}
	rs := suite.Run(ctx, m)
	if len(rs) != 1 || rs[0].Err == nil {
		t.Fatalf("results %+v; want the case to fail", rs)
	}
	if !errors.Is(rs[0].Err, wasmconf.ErrInputSchema) || !strings.Contains(rs[0].Err.Error(), `at /object: unknown field "health"`) {
		t.Errorf("error %v; want the unknown field named with its path", rs[0].Err)
	}
}
