package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	client "github.com/berthhq/berth/sdk/client"
)

// vendorCatalog builds examples/provider-hello into a plugin directory of its own and writes a
// plugins.json listing it under each of names (same binary, its own state directory each) with
// config; it returns the directory. berthd finds the vendor's plugin only through this catalog.
func vendorCatalog(t *testing.T, config string, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "provider-hello")
	if err := goBuild(root, bin, "./examples/provider-hello"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	var entries []string
	for _, n := range names {
		entries = append(entries, fmt.Sprintf(`{"name": %q, "kind": "provider", "path": "provider-hello", "sha256": %q, "args": ["--state-dir", %q], "config": %s}`,
			n, hex.EncodeToString(sum[:]), filepath.Join(dir, "state-"+n), config))
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins.json"), []byte(`{"plugins": [`+strings.Join(entries, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestVendorProviderResources drives a vendor's provider, loaded only from the catalog, through
// berthd: plan, apply, a new generation, the plugin killed in the middle of an apply, drift
// reported and reconciled, a spec refused by the schema before it is stored, and delete.
func TestVendorProviderResources(t *testing.T) {
	t.Parallel()
	// Every Apply of the plugin takes 2 s: a window to kill it in.
	dir := vendorCatalog(t, `{"apply_delay_ms": 2000}`, "hello")
	greeting := filepath.Join(dir, "state-hello", "greetings", "w1.json")
	cl := newClusterWith(t, "--plugin-dir", dir, "--gateway-listen", "off", "--resource-drift-interval", "2s")
	ctx := context.Background()

	if out := cl.cli(t, "resource", "types"); !strings.Contains(out, "hello.greeting") || !strings.Contains(out, "hello") {
		t.Fatalf("resource types:\n%s", out)
	}
	file := filepath.Join(cl.dir, "w1.yaml")
	write := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("type: hello.greeting\nname: w1\nspec:\n  message: hi\n")
	if out := cl.cli(t, "resource", "plan", "-f", file); !strings.Contains(out, `+ message: "hi"`) {
		t.Fatalf("plan of a new greeting:\n%s", out)
	}
	if _, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w1"); err == nil {
		t.Fatal("plan stored the resource")
	}
	cl.cli(t, "resource", "apply", "-f", file)
	ready := func(gen int64) *client.Resource {
		t.Helper()
		var r *client.Resource
		waitFor(t, 60*time.Second, fmt.Sprintf("w1 ready at generation %d", gen), func() (bool, string) {
			var err error
			if r, err = cl.c.GetResource(ctx, "default", "hello.greeting", "w1"); err != nil {
				return false, err.Error()
			}
			return r.Status == "ready" && r.AppliedGeneration == gen, fmt.Sprintf("%+v", *r)
		})
		return r
	}
	ready(1)
	if b, _ := os.ReadFile(greeting); string(b) != `{"message":"hi"}` {
		t.Fatalf("the provider holds %s", b)
	}

	// A change: plan shows it, apply rolls generation 2; the plugin is killed while it applies.
	write("type: hello.greeting\nname: w1\nspec:\n  message: hey\n  loud: true\n")
	if out := cl.cli(t, "resource", "plan", "-f", file); !strings.Contains(out, `~ message: "hi" -> "HEY"`) || !strings.Contains(out, "+ loud: true") {
		t.Fatalf("plan of a change:\n%s", out)
	}
	cl.cli(t, "resource", "apply", "-f", file)
	r, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w1")
	if err != nil || r.Generation != 2 || r.OperationID == "" {
		t.Fatalf("after the second apply: %+v, %v", r, err)
	}
	opID := r.OperationID
	waitFor(t, 30*time.Second, "the generation 2 operation leased", func() (bool, string) {
		op, err := cl.c.GetOperation(ctx, opID)
		if err != nil {
			return false, err.Error()
		}
		return op.State == "leased", op.State
	})
	// Leased: the worker is in the operation, nearly all of it the plugin's 2 s Apply.
	pid := pluginPID(t, cl, "hello")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ready(2)
	op, err := cl.c.GetOperation(ctx, opID)
	if err != nil {
		t.Fatal(err)
	}
	if op.State != "succeeded" || op.Attempts < 2 || op.IdempotencyKey != "resource.apply/hello.greeting/w1/2" {
		t.Fatalf("the operation of generation 2 after the kill: %+v", op)
	}
	ops, err := cl.c.ListOperations(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for _, o := range ops {
		if o.IdempotencyKey == op.IdempotencyKey {
			same++
		}
	}
	if same != 1 {
		t.Fatalf("%d operations under key %s, want 1", same, op.IdempotencyKey)
	}
	if b, _ := os.ReadFile(greeting); string(b) != `{"message":"HEY","loud":true}` {
		t.Fatalf("the provider holds %s", b)
	}

	// Changed behind Berth's back: reported drifted, left as it is (on_drift report).
	if err := os.WriteFile(greeting, []byte(`{"message":"TAMPERED"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "w1 drifted", func() (bool, string) {
		r, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w1")
		if err != nil {
			return false, err.Error()
		}
		return r.Status == "drifted" && strings.Contains(r.Reason, `"TAMPERED"`), fmt.Sprintf("%+v", *r)
	})
	if b, _ := os.ReadFile(greeting); string(b) != `{"message":"TAMPERED"}` {
		t.Fatalf("on_drift report changed the greeting: %s", b)
	}
	// With on_drift: reconcile it is put back, now and after the next tampering.
	write("type: hello.greeting\nname: w1\non_drift: reconcile\nspec:\n  message: hey\n  loud: true\n")
	cl.cli(t, "resource", "apply", "-f", file)
	ready(3)
	if err := os.WriteFile(greeting, []byte(`{"message":"AGAIN"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "w1 reconciled after drift", func() (bool, string) {
		r, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w1")
		if err != nil {
			return false, err.Error()
		}
		b, _ := os.ReadFile(greeting)
		return r.Status == "ready" && r.Generation >= 4 && string(b) == `{"message":"HEY","loud":true}`, fmt.Sprintf("%+v %s", *r, b)
	})

	// A spec the schema refuses: 422 naming the field, nothing stored.
	_, err = cl.c.ApplyResource(ctx, "default", "hello.greeting", "w2", client.ResourceApply{Spec: json.RawMessage(`{"message":"x","loud":"yes"}`)})
	if !client.IsCode(err, "validation_failed") || !strings.Contains(err.Error(), "spec/loud") {
		t.Fatalf("schema violation: %v", err)
	}
	if _, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w2"); !client.IsCode(err, "not_found") {
		t.Fatalf("a refused spec was stored: %v", err)
	}

	// Delete removes it from the provider, then from berthd.
	cl.cli(t, "resource", "delete", "hello.greeting/w1")
	waitFor(t, 60*time.Second, "w1 deleted", func() (bool, string) {
		_, err := cl.c.GetResource(ctx, "default", "hello.greeting", "w1")
		_, ferr := os.Stat(greeting)
		return client.IsCode(err, "not_found") && errors.Is(ferr, os.ErrNotExist), fmt.Sprint(err, ferr)
	})
}

// pluginPID is the pid of berthd's plugin name, from GET /api/v1/plugins.
func pluginPID(t *testing.T, cl *cluster, name string) int {
	t.Helper()
	ps, err := cl.c.ListPlugins(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Name == name && p.PID > 0 {
			return p.PID
		}
	}
	t.Fatalf("no running plugin %s in %+v", name, ps)
	return 0
}

// TestTwoPluginsDeclaringOneTypeStopBerthd: a catalog with two providers of one type stops
// berthd at start with an error naming the type and both plugins.
func TestTwoPluginsDeclaringOneTypeStopBerthd(t *testing.T) {
	t.Parallel()
	dir := vendorCatalog(t, `{}`, "hello-a", "hello-b")
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.bin, "berthd"), "--data-dir", data, "--listen", "127.0.0.1:0",
		"--gateway-listen", "off", "--plugin-dir", dir)
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("berthd did not stop at start (err %v, ctx %v):\n%s", err, ctx.Err(), out)
	}
	for _, want := range []string{"hello.greeting", "plugin hello-a", "plugin hello-b"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("berthd's error does not name %s:\n%s", want, out)
		}
	}
}
