package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// TestExtensionPoints runs the WebAssembly extension points end to end
// (docs/wasm-abi.md): a bound policy refuses an apply with its reasons and
// its decisions reach the change log; the route table comes from the
// embedded WebAssembly compiler with its SHA-256 in `berth routes`; a route
// compiler bound to routes.compile replaces it and the gateway enforces its
// allow list; a failing compiler leaves the last good table and shows in
// `berth routes`; unbinding returns to the default. No node is needed: the
// gateway refuses a source before it looks at upstreams.
func TestExtensionPoints(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	push := func(name string, wasm []byte) string {
		t.Helper()
		path := filepath.Join(cl.dir, name+".wasm")
		if err := os.WriteFile(path, wasm, 0o600); err != nil {
			t.Fatal(err)
		}
		var m client.Module
		if err := json.Unmarshal([]byte(cl.cli(t, "module", "push", path, "-o", "json")), &m); err != nil {
			t.Fatal(err)
		}
		return m.Digest
	}
	bind := func(digest, hook string) client.Binding {
		t.Helper()
		var b client.Binding
		if err := json.Unmarshal([]byte(cl.cli(t, "module", "bind", digest, "--hook", hook, "-o", "json")), &b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	routes := func() client.RouteStatus {
		t.Helper()
		var st client.RouteStatus
		if err := json.Unmarshal([]byte(cl.cli(t, "routes", "-o", "json")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// A policy bound to service.apply refuses a bundle named without its digest.
	bind(push("require-digest", wasmtest.BuildGo(t, "examples/policies/require-digest")), "service.apply")
	digest := cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeHello := func(bundle string) {
		y := fmt.Sprintf("name: hello\nproject: default\nbundle: %q\ncommand: [\"./hello\"]\ndomains: [hello.localhost, hello.internal]\nreplicas: 1\n", bundle)
		if err := os.WriteFile(spec, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeHello("hello")
	if stderr := cl.cliFails(t, "apply", "-f", spec); !strings.Contains(stderr, "policy_denied") || !strings.Contains(stderr, "bundle hello is not named by digest") {
		t.Fatalf("apply by name: %s", stderr)
	}
	writeHello(digest)
	cl.cli(t, "apply", "-f", spec)
	var decisions []client.PolicyDecision
	if err := json.Unmarshal([]byte(cl.cli(t, "policy", "decisions", "-o", "json")), &decisions); err != nil {
		t.Fatal(err)
	}
	if len(decisions) != 2 || decisions[0].Result != "allow" || decisions[1].Result != "deny" || decisions[1].Seq == 0 || decisions[0].Seq <= decisions[1].Seq {
		t.Fatalf("decisions %+v", decisions)
	}

	// The embedded default compiles the table.
	var def client.RouteStatus
	waitFor(t, converge, "the default's table", func() (bool, string) {
		def = routes()
		return len(def.Table.Routes) == 2, fmt.Sprintf("%+v", def)
	})
	if !strings.Contains(def.Compiler, "default-routes") || def.SHA256 != (abiroutes.Table{Routes: def.Table.Routes}).Digest() {
		t.Fatalf("default: %+v", def)
	}
	cl.wantGateway(t, "hello.internal", 503, "no-healthy-upstream")

	// A bound compiler restricts .internal to private networks; this client is loopback.
	internal := bind(push("internal-routes", wasmtest.BuildGo(t, "examples/routes-internal")), "routes.compile")
	waitFor(t, converge, "the bound compiler's table", func() (bool, string) {
		st := routes()
		return strings.Contains(st.Compiler, internal.ID) && st.SHA256 != def.SHA256, fmt.Sprintf("%+v", st)
	})
	cl.wantGateway(t, "hello.internal", 403, "source-not-allowed")
	cl.wantGateway(t, "hello.localhost", 503, "no-healthy-upstream")
	good := routes()

	// A failing compiler replaces it, fails, and the last good table stays.
	broken := bind(push("broken-routes", wasmtest.Routes("broken-routes", `{"error":{"code":"compile_failed","message":"broken on purpose"}}`)), "routes.compile")
	if fmt.Sprint(broken.Replaced) != "["+internal.ID+"]" {
		t.Fatalf("binding %+v did not replace %s", broken, internal.ID)
	}
	waitFor(t, converge, "the failure in berth routes", func() (bool, string) {
		st := routes()
		return strings.Contains(st.LastError, "broken on purpose") && strings.Contains(st.FailingCompiler, broken.ID), fmt.Sprintf("%+v", st)
	})
	if st := routes(); st.SHA256 != good.SHA256 || st.Compiler != good.Compiler {
		t.Fatalf("the table in force changed: %+v, was %+v", st, good)
	}
	if out := cl.cli(t, "routes"); !strings.Contains(out, "failing:") || !strings.Contains(out, "broken on purpose") || !strings.Contains(out, good.SHA256) {
		t.Fatalf("berth routes:\n%s", out)
	}
	cl.wantGateway(t, "hello.internal", 403, "source-not-allowed")

	// Unbinding returns to the default.
	cl.cli(t, "module", "unbind", broken.ID)
	waitFor(t, converge, "the default again", func() (bool, string) {
		st := routes()
		return st.SHA256 == def.SHA256 && st.LastError == "" && strings.Contains(st.Compiler, "default-routes"), fmt.Sprintf("%+v", st)
	})
	cl.wantGateway(t, "hello.internal", 503, "no-healthy-upstream")
}

// cliFails runs the berth CLI, expects it to fail, and returns its stderr.
func (cl *cluster) cliFails(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.bin, "berth"), append([]string{"--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err == nil {
		t.Fatalf("berth %v succeeded:\n%s", args, out)
	}
	return stderr.String()
}

// wantGateway waits until the gateway answers host with its own status and
// X-Berth-Gateway mark (the pushed table may lag the route status a little).
func (cl *cluster) wantGateway(t *testing.T, host string, status int, mark string) {
	t.Helper()
	waitFor(t, converge, fmt.Sprintf("%s answering %d %s", host, status, mark), func() (bool, string) {
		resp, err := cl.get(host, "/")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		ok := resp.StatusCode == status && resp.Header.Get("X-Berth-Gateway") == mark &&
			resp.Header.Get("Content-Type") == "application/problem+json"
		return ok, fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("X-Berth-Gateway"), body)
	})
}
