package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// TestHealthCheckPolicy: the example policy that requires a health check of
// every service with domains passes its own cases with `berth policy test`,
// and, bound on a live berthd, refuses exactly the services without one:
// berthd sends the service's health_check (docs/wasm-abi.md section 5.2).
// `berth policy test --record` then turns the live decisions into exact
// cases that pass, once each.
func TestHealthCheckPolicy(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	wasm := wasmtest.BuildGo(t, "examples/policies/require-health-check")
	path := filepath.Join(cl.dir, "require-health-check.wasm")
	if err := os.WriteFile(path, wasm, 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := cl.cli(t, "policy", "test", filepath.Join(root, "examples/policies/require-health-check"), "--module", path)
	if !strings.Contains(out, "5 cases passed") {
		t.Fatalf("berth policy test:\n%s", out)
	}
	var m client.Module
	if err := json.Unmarshal([]byte(cl.cli(t, "module", "push", path, "-o", "json")), &m); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "module", "bind", m.Digest, "--hook", "service.apply")
	digest := cl.pushBundle(t, env.helloDir, "hello")

	apply := func(name, extra string) (bool, string) {
		t.Helper()
		spec := filepath.Join(cl.dir, name+".yaml")
		y := fmt.Sprintf("name: %s\nproject: default\nbundle: %q\ncommand: [\"./hello\"]\nreplicas: 0\n%s", name, digest, extra)
		if err := os.WriteFile(spec, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		if stderr, failed := cl.cliResult(t, "apply", "-f", spec); failed {
			return false, stderr
		}
		return true, ""
	}
	cases := []struct {
		name, extra string
		allowed     bool
	}{
		{"checked", "domains: [checked.localhost]\nhealth_check: {path: /healthz, interval_s: 5, timeout_s: 2, failures: 3}\n", true},
		{"unchecked", "domains: [unchecked.localhost]\n", false},
		{"worker", "", true},
		{"timing-only", "domains: [timing.localhost]\nhealth_check: {interval_s: 5}\n", false},
	}
	for _, c := range cases {
		ok, stderr := apply(c.name, c.extra)
		if ok != c.allowed {
			t.Errorf("apply %s: allowed=%v, want %v; %s", c.name, ok, c.allowed, stderr)
		}
		if !ok && (!strings.Contains(stderr, "policy_denied") || !strings.Contains(stderr, "default/"+c.name+" serves")) {
			t.Errorf("apply %s was refused without the policy's reason: %s", c.name, stderr)
		}
	}

	// The live decisions become cases.
	dir := filepath.Join(cl.dir, "recorded")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(root, "examples/policies/require-health-check/policy_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := cl.cli(t, "policy", "test", dir, "--module", path, "--record"); !strings.Contains(out, fmt.Sprintf("recorded %d new case(s)", len(cases))) {
		t.Fatalf("policy test --record:\n%s", out)
	}
	if out := cl.cli(t, "policy", "test", dir, "--module", path, "--record"); !strings.Contains(out, "recorded 0 new case(s)") {
		t.Errorf("a second --record added cases again:\n%s", out)
	}
	if out := cl.cli(t, "policy", "test", dir, "--module", path); !strings.Contains(out, fmt.Sprintf("%d cases passed", 5+len(cases))) {
		t.Fatalf("policy test of the recorded cases:\n%s", out)
	}
	rec, err := os.ReadFile(filepath.Join(dir, "policy_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rec), "exact: true") || !strings.Contains(string(rec), "timing.localhost") || !strings.Contains(string(rec), "# Run: berth policy test") {
		t.Errorf("the recorded file lost its content or lacks the recorded inputs:\n%s", rec)
	}
}

// cliResult runs the berth CLI and returns its stderr and whether it failed.
func (cl *cluster) cliResult(t *testing.T, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.bin, "berth"), append([]string{"--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err != nil
}
