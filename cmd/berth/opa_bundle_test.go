package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/wasmtest"
)

// TestPolicyTestAndConformanceTakeOPABundle: the bundle `module push --kind
// opa` takes (opa build -t wasm) is taken as it is by `berth policy test`
// (as the file's module or --module) and by `berth conformance wasm`, which
// turn it into the module push would upload; --entrypoint picks the deciding
// entrypoint as push's does.
func TestPolicyTestAndConformanceTakeOPABundle(t *testing.T) {
	t.Parallel()
	rego, err := os.ReadFile("../../examples/policies/require-digest-rego/policy.rego")
	if err != nil {
		t.Fatal(err)
	}
	cases, err := os.ReadFile("../../examples/policies/require-digest-rego/policy_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bundle, _ := wasmtest.BuildRego(t, string(rego), "berth/deny")
	dir := t.TempDir()
	file := filepath.Join(dir, "bundle.tar.gz")
	if err := os.WriteFile(file, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), append([]byte("module: bundle.tar.gz\n"), cases...), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	for _, args := range [][]string{
		{"policy", "test", dir},
		{"policy", "test", dir, "--module", file, "--entrypoint", "berth/deny"},
	} {
		out, errOut, code := c.run("", args...)
		if code != 0 || !strings.Contains(out, "cases passed (opa:berth/deny ") {
			t.Errorf("berth %s: exit %d; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	out, errOut, code := c.run("", "policy", "test", dir, "--entrypoint", "berth/allow")
	if code == 0 || !strings.Contains(errOut, `the bundle has no entrypoint "berth/allow" (it has berth/deny)`) {
		t.Errorf("an entrypoint the bundle lacks: exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	out, errOut, code = c.run("", "conformance", "wasm", file)
	if code != 0 || strings.Count(out, "ok    ") != 6 {
		t.Errorf("conformance wasm of the bundle: exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
