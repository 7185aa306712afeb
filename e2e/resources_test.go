package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/examples/provider-accounts/accounts"
	"github.com/berthhq/berth/internal/wasmtest"
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

// catalogPlugin is one provider of a catalog built by providerCatalog: its catalog name, the
// package its binary is built from, and its configuration.
type catalogPlugin struct{ name, pkg, config string }

// providerCatalog builds each plugin's package into a plugin directory of its own and writes a
// plugins.json listing them (each with its own state directory, DIR/state-<name>); it returns
// the directory. berthd finds these providers only through this catalog.
func providerCatalog(t *testing.T, plugins ...catalogPlugin) string {
	t.Helper()
	dir := t.TempDir()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, p := range plugins {
		bin := filepath.Join(dir, p.name)
		if err := goBuild(root, bin, p.pkg); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(raw)
		entries = append(entries, fmt.Sprintf(`{"name": %q, "kind": "provider", "path": %q, "sha256": %q, "args": ["--state-dir", %q], "config": %s}`,
			p.name, p.name, hex.EncodeToString(sum[:]), filepath.Join(dir, "state-"+p.name), p.config))
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins.json"), []byte(`{"plugins": [`+strings.Join(entries, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestVendorProviderSecretsAndOutputs drives two vendors' providers loaded only from the
// catalog (examples/provider-hello and examples/provider-accounts, one type each) with secret
// references in specs and outputs published as secrets (docs/resources.md sections 7 and 8): a
// reference to a missing secret is refused 422 naming the field and the secret; a WebAssembly
// policy bound to resource.apply refuses a password given as a value; the providers receive the
// values, and no API answer (get, list, describe, plan, events, operations), no log and no file
// of berthd's data directory (the store's resource and operation documents among them) holds
// one; reading the same value back is no drift, a changed one is drift shown masked; the token
// output becomes a project secret that a service takes.
func TestVendorProviderSecretsAndOutputs(t *testing.T) {
	t.Parallel()
	dir := providerCatalog(t,
		catalogPlugin{"hello", "./examples/provider-hello", `{}`},
		catalogPlugin{"accounts", "./examples/provider-accounts", `{}`})
	cl := newClusterWith(t, "--plugin-dir", dir, "--gateway-listen", "off", "--resource-drift-interval", "2s")
	ctx := context.Background()
	var answers bytes.Buffer
	keep := func(v any) {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		answers.Write(b)
		answers.WriteByte('\n')
	}
	mark := func(what string) string { return "lk" + what + strings.ToLower(rand.Text())[:20] }
	password, greeting := mark("pw"), mark("gr")

	out := cl.cli(t, "resource", "types")
	keep(out)
	for _, want := range []string{"hello.greeting", "accounts.user"} {
		if !strings.Contains(out, want) {
			t.Fatalf("resource types without %s:\n%s", want, out)
		}
	}
	file := filepath.Join(cl.dir, "res.yaml")
	write := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// A reference to a secret the project does not have: 422 naming the field and the secret.
	write("type: accounts.user\nname: alice\nspec:\n  login: alice\n  password: secret:alice-pw\n")
	if stderr := cl.cliFails(t, "resource", "apply", "-f", file); !strings.Contains(stderr, "validation_failed") ||
		!strings.Contains(stderr, "spec/password") || !strings.Contains(stderr, "alice-pw") {
		t.Fatalf("a missing secret: %s", stderr)
	}

	// A policy on resource.apply refuses a password given as a value; nothing is stored.
	wasmPath := filepath.Join(cl.dir, "require-secret-refs.wasm")
	if err := os.WriteFile(wasmPath, wasmtest.BuildGo(t, "examples/policies/require-secret-refs"), 0o600); err != nil {
		t.Fatal(err)
	}
	var m client.Module
	if err := json.Unmarshal([]byte(cl.cli(t, "module", "push", wasmPath, "-o", "json")), &m); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "module", "bind", m.Digest, "--hook", "resource.apply")
	write("type: accounts.user\nname: bob\nspec:\n  login: bob\n  password: plain-value\n")
	if stderr := cl.cliFails(t, "resource", "apply", "-f", file); !strings.Contains(stderr, "policy_denied") ||
		!strings.Contains(stderr, "spec/password holds a value") {
		t.Fatalf("a password given as a value: %s", stderr)
	}
	if _, err := cl.c.GetResource(ctx, "default", "accounts.user", "bob"); !client.IsCode(err, "not_found") {
		t.Fatalf("a refused resource was stored: %v", err)
	}

	// With the secrets set, both apply; the providers hold the values.
	for name, v := range map[string]string{"alice-pw": password, "greeting": greeting} {
		s, err := cl.c.PutSecret(ctx, "default", name, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		keep(s)
	}
	greetingFile := filepath.Join(cl.dir, "greeting.yaml")
	if err := os.WriteFile(greetingFile, []byte("type: hello.greeting\nname: g1\nspec:\n  message: secret:greeting\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plan := cl.cli(t, "resource", "plan", "-f", greetingFile)
	keep(plan)
	if !strings.Contains(plan, `+ message: "secret:greeting"`) {
		t.Fatalf("plan of a greeting from a secret:\n%s", plan)
	}
	keep(cl.cli(t, "resource", "apply", "-f", greetingFile))
	write("type: accounts.user\nname: alice\nspec:\n  login: alice\n  password: secret:alice-pw\n")
	keep(cl.cli(t, "resource", "apply", "-f", file))
	ready := func(typ, name string) *client.Resource {
		t.Helper()
		var r *client.Resource
		waitFor(t, 60*time.Second, typ+"/"+name+" ready", func() (bool, string) {
			var err error
			if r, err = cl.c.GetResource(ctx, "default", typ, name); err != nil {
				return false, err.Error()
			}
			return r.Status == "ready" && r.AppliedGeneration == r.Generation, fmt.Sprintf("%+v", *r)
		})
		return r
	}
	g1, alice := ready("hello.greeting", "g1"), ready("accounts.user", "alice")
	keep(g1)
	keep(alice)
	if b, _ := os.ReadFile(filepath.Join(dir, "state-hello", "greetings", "g1.json")); string(b) != `{"message":"`+greeting+`"}` {
		t.Fatalf("the hello provider holds %s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "state-accounts", "users", "alice.json")); !strings.Contains(string(b), password) {
		t.Fatalf("the accounts provider holds %s", b)
	}
	if string(g1.Spec) != `{"message":"secret:greeting"}` || string(g1.Applied) != `{"message":"secret:greeting"}` {
		t.Fatalf("g1 as answered: spec %s, applied %s", g1.Spec, g1.Applied)
	}

	// The token output is a project secret.
	tok := alice.Outputs["TOKEN"]
	if tok.Secret != "res-accounts-user-alice-token" || tok.Version != 1 {
		t.Fatalf("alice's outputs: %+v", alice.Outputs)
	}
	sec, err := cl.c.GetSecret(ctx, "default", tok.Secret)
	if err != nil {
		t.Fatal(err)
	}
	keep(sec)
	desc := cl.cli(t, "resource", "describe", "accounts.user/alice")
	keep(desc)
	if !strings.Contains(desc, "TOKEN in secret res-accounts-user-alice-token (version 1)") {
		t.Fatalf("describe:\n%s", desc)
	}

	// A service takes the output like any secret.
	cl.pushBundle(t, env.helloDir, "hello")
	svc := filepath.Join(cl.dir, "svc.yaml")
	if err := os.WriteFile(svc, []byte("name: web\nbundle: hello\ncommand: [\"./hello\"]\nsecrets:\n  ACCOUNTS_TOKEN: "+tok.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keep(cl.cli(t, "apply", "-f", svc))
	web, err := cl.c.GetService(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	keep(web)
	if ref := web.ResolvedSecrets["ACCOUNTS_TOKEN"]; ref.Secret != tok.Secret || ref.Version != 1 {
		t.Fatalf("the service's secrets: %+v", web.ResolvedSecrets)
	}

	// Read back by the drift pass (every 2 s) the values are no drift: each type has reads
	// counted "same" and none "drifted".
	sameReads := func() (map[string]float64, error) {
		fams, err := cl.scrapeMetrics(t)
		if err != nil {
			return nil, err
		}
		out := map[string]float64{}
		for _, m := range fams["berth_resource_drift_reads_total"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["type"]+"/"+labels["result"]] += m.GetCounter().GetValue()
		}
		return out, nil
	}
	waitFor(t, 60*time.Second, "both read twice by the drift pass", func() (bool, string) {
		reads, err := sameReads()
		if err != nil {
			return false, err.Error()
		}
		return reads["hello.greeting/same"] >= 2 && reads["accounts.user/same"] >= 2, fmt.Sprint(reads)
	})
	if reads, _ := sameReads(); reads["hello.greeting/drifted"]+reads["accounts.user/drifted"] != 0 {
		t.Fatalf("a drift read found a difference: %v", reads)
	}
	for _, id := range []string{"hello.greeting/g1", "accounts.user/alice"} {
		typ, name, _ := strings.Cut(id, "/")
		r, err := cl.c.GetResource(ctx, "default", typ, name)
		if err != nil {
			t.Fatal(err)
		}
		keep(r)
		if r.Status != "ready" || r.Drifts != 0 {
			t.Fatalf("%s after the drift pass read its own values: %+v", id, *r)
		}
		keep(cl.cli(t, "resource", "describe", id))
		p, err := cl.c.PlanResource(ctx, "default", typ, name, client.ResourceApply{Spec: r.Spec})
		if err != nil {
			t.Fatal(err)
		}
		keep(p)
		if p.Changes {
			t.Fatalf("%s plans a change of its own values: %+v", id, *p)
		}
	}
	// The greeting changed behind Berth's back is drift, shown masked: a keyed digest of what the
	// provider holds now, not the value.
	greetingPath := filepath.Join(dir, "state-hello", "greetings", "g1.json")
	if err := os.WriteFile(greetingPath, []byte(`{"message":"changed behind the back"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "g1 drifted", func() (bool, string) {
		r, err := cl.c.GetResource(ctx, "default", "hello.greeting", "g1")
		if err != nil {
			return false, err.Error()
		}
		return r.Status == "drifted" && strings.Contains(r.Reason, `~ message: "secret:greeting" -> "secret:greeting (differs, hmac-sha256:`), r.Reason
	})
	keep(cl.cli(t, "resource", "describe", "hello.greeting/g1"))
	list, err := cl.c.ListResources(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	keep(list)
	keep(cl.cli(t, "resource", "get"))
	evs, err := cl.c.Events(ctx, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	keep(evs)
	ops, err := cl.c.ListOperations(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	keep(ops)
	for _, o := range ops {
		op, err := cl.c.GetOperation(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		keep(op)
	}
	if len(ops) < 2 {
		t.Fatalf("%d operations", len(ops))
	}

	// No value anywhere: the answers, and every file of the cluster's directory (berthd's log
	// with the plugins' output, its data directory with the store).
	scan := map[string][]byte{"API answers and CLI output": answers.Bytes()}
	err = filepath.WalkDir(cl.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return err
		}
		if b, err := os.ReadFile(p); err == nil {
			scan[p] = b
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	token := accounts.Token(accounts.User{Login: "alice", Password: password})
	for where, b := range scan {
		for _, v := range []string{password, greeting, token} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value", where)
			}
		}
	}
	if len(scan) < 5 {
		t.Fatalf("scanned only %d sources", len(scan))
	}
	t.Logf("scanned %d files and answers", len(scan))
}
