package api

import (
	"archive/tar"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

type fixedRoutes routes.Status

func (r fixedRoutes) RouteStatus() routes.Status { return routes.Status(r) }

// newPolicyFixture is newFixture with a policy engine over a real wazero
// runtime, and a fixed route status.
func newPolicyFixture(t *testing.T) *fixture {
	f, _ := newPolicyFixtureHints(t)
	return f
}

// hintLog records the reconciler hints the API gives.
type hintLog struct {
	mu    sync.Mutex
	hints []string
}

func (h *hintLog) Hint(reason string) { h.mu.Lock(); h.hints = append(h.hints, reason); h.mu.Unlock() }

func (h *hintLog) String() string { h.mu.Lock(); defer h.mu.Unlock(); return fmt.Sprint(h.hints) }

// newPolicyFixtureHints is newPolicyFixture that also returns the hints.
func newPolicyFixtureHints(t *testing.T) (*fixture, *hintLog) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	tokens := testTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	blobDir := filepath.Join(dir, "blobs")
	bs, err := bundles.New(blobDir, st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	clog := changelog.New(st, 1, nil)
	eng := policy.New(policy.Config{Store: st, Blobs: bs, Runtime: rt, Changelog: clog})
	if err := eng.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	table := abiroutes.Table{Revision: 3, Routes: []abiroutes.Route{{Hostname: "hello.localhost", Project: "default", Service: "hello", TLSMode: "none", Upstreams: []abiroutes.Upstream{}}}}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	hints := &hintLog{}
	s := New(Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: hints,
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Policy: eng, Changelog: clog,
		Routes: fixedRoutes{Table: table, SHA256: table.Digest(), Compiler: "test", CompiledAt: time.Now()}})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &fixture{t: t, st: st, srv: srv, admin: admin, blobs: blobDir, reg: reg}, hints
}

// TestPolicyDeniesApply is the acceptance test in miniature: a bound
// policy refuses a service with its reasons and nothing is stored.
func TestPolicyDeniesApply(t *testing.T) {
	t.Parallel()
	f := newPolicyFixture(t)
	mod := wasmtest.BuildGo(t, "examples/policies/require-digest")

	code, out := f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: []byte("not wasm")})
	if code != 422 || out["code"] != "module_invalid" {
		t.Fatalf("push garbage: %d %v", code, out)
	}
	code, out = f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: mod})
	if code != 201 || out["name"] != "require-digest" || out["kind"] != "policy" {
		t.Fatalf("push module: %d %v", code, out)
	}
	digest := out["digest"].(string)
	if code, out := f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": digest}); code != 201 || out["failure_policy"] != "fail" {
		t.Fatalf("bind: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.create", "module": digest}); code != 422 {
		t.Fatalf("bind unknown hook: %d %v", code, out)
	}

	bundle := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	code, out = f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: bundle})
	if code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	bundleDigest := out["digest"].(string)

	code, out = f.json("PUT", "/api/v1/projects/default/services/hello", map[string]any{"bundle": "app", "command": []string{"./app"}})
	if code != 403 || out["code"] != "policy_denied" {
		t.Fatalf("apply by name: %d %v", code, out)
	}
	reasons, _ := out["reasons"].([]any)
	if len(reasons) != 1 || !strings.Contains(reasons[0].(string), "bundle app is not named by digest") {
		t.Fatalf("reasons %v", out["reasons"])
	}
	if code, _ := f.json("GET", "/api/v1/projects/default/services/hello", nil); code != 404 {
		t.Fatalf("denied service was stored: %d", code)
	}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/hello", map[string]any{"bundle": bundleDigest, "command": []string{"./app"}}); code != 201 {
		t.Fatalf("apply by digest: %d %v", code, out)
	}

	code, out = f.json("GET", "/api/v1/policy-decisions", nil)
	items, _ := out["items"].([]any)
	if code != 200 || len(items) != 2 {
		t.Fatalf("decisions: %d %v", code, out)
	}
	newest := items[0].(map[string]any)
	if newest["result"] != "allow" || newest["module_digest"] != digest || len(newest["input_sha256"].(string)) != 64 {
		t.Fatalf("newest decision %v", newest)
	}
	if items[1].(map[string]any)["result"] != "deny" {
		t.Fatalf("older decision %v", items[1])
	}

	code, out = f.json("GET", "/api/v1/routes", nil)
	if code != 200 || len(out["sha256"].(string)) != 64 || out["compiler"] != "test" {
		t.Fatalf("routes: %d %v", code, out)
	}

	// Each decision is a change-log entry, in order with the changes it
	// admitted, and the index points at it.
	entries := f.changelog()
	var got []string
	bySeq := map[int64]node.LogEntry{}
	for _, e := range entries {
		got = append(got, e.EntityType+" "+e.Op)
		bySeq[e.Seq] = e
	}
	want := "[policy_binding create project create bundle create policy_decision create policy_decision create service create]"
	if fmt.Sprint(got) != want {
		t.Fatalf("entries %v, want %s", got, want)
	}
	for i, item := range items {
		d := item.(map[string]any)
		e, ok := bySeq[int64(d["seq"].(float64))]
		if !ok || e.EntityType != policy.DecisionEntityType || e.EntityID != d["id"] || e.ActorType != "token" {
			t.Fatalf("decision %d %v: entry %+v", i, d, e)
		}
		var payload policy.Decision
		if err := json.Unmarshal(e.Payload, &payload); err != nil {
			t.Fatal(err)
		}
		if payload.ModuleDigest != digest || payload.InputSHA256 != d["input_sha256"] || payload.Result != d["result"] || payload.Seq != 0 {
			t.Fatalf("entry payload %+v, index %v", payload, d)
		}
	}
	if bySeq[4].EntityType != policy.DecisionEntityType || !strings.Contains(string(bySeq[4].Payload), `"result":"deny"`) ||
		!strings.Contains(string(bySeq[4].Payload), "is not named by digest") {
		t.Fatalf("the denial is not entry 4: %+v", bySeq[4])
	}
}

// changelog reads the whole change log and verifies its chain.
func (f *fixture) changelog() []node.LogEntry {
	f.t.Helper()
	code, out := f.json("GET", "/api/v1/changelog?from_seq=1", nil)
	if code != 200 {
		f.t.Fatalf("changelog: %d %v", code, out)
	}
	raw, _ := json.Marshal(out["entries"])
	var entries []node.LogEntry
	if err := json.Unmarshal(raw, &entries); err != nil {
		f.t.Fatal(err)
	}
	if n, err := node.VerifyChain(0, "", entries); err != nil || n != len(entries) {
		f.t.Fatalf("served chain verified %d of %d: %v", n, len(entries), err)
	}
	return entries
}

// TestBindRouteCompiler: a route compiler binds to routes.compile only, for
// every project and without config; a newer binding replaces the older one;
// binding and unbinding hint the reconciler and are change-log entries
// (docs/wasm-abi.md section 6.4).
func TestBindRouteCompiler(t *testing.T) {
	t.Parallel()
	f, hints := newPolicyFixtureHints(t)
	push := func(wasm []byte) string {
		t.Helper()
		code, out := f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: wasm})
		if code != 201 {
			t.Fatalf("push: %d %v", code, out)
		}
		return out["digest"].(string)
	}
	answer := `{"routes":[],"sha256":"` + abiroutes.Table{Routes: []abiroutes.Route{}}.Digest() + `"}`
	first, second := push(wasmtest.Routes("first-routes", answer)), push(wasmtest.Routes("second-routes", answer))
	pol := push(wasmtest.Policy(wasmtest.PolicyOptions{Name: "a-policy"}))

	for name, body := range map[string]map[string]any{
		"a policy module":             {"hook": "routes.compile", "module": pol},
		"a project":                   {"hook": "routes.compile", "module": first, "project": "default"},
		"config":                      {"hook": "routes.compile", "module": first, "config": map[string]any{"a": 1}},
		"failure policy ignore":       {"hook": "routes.compile", "module": first, "failure_policy": "ignore"},
		"a compiler at a policy hook": {"hook": "service.apply", "module": first},
	} {
		if code, out := f.json("POST", "/api/v1/policy-bindings", body); code != 422 || out["code"] != "validation_failed" {
			t.Errorf("bind %s: %d %v", name, code, out)
		}
	}
	code, out := f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "routes.compile", "module": first})
	if code != 201 || out["module"] != "first-routes" || out["failure_policy"] != "fail" || out["replaced"] != nil {
		t.Fatalf("bind first: %d %v", code, out)
	}
	firstID := out["id"].(string)
	code, out = f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "routes.compile", "module": second})
	if code != 201 || fmt.Sprint(out["replaced"]) != "["+firstID+"]" {
		t.Fatalf("bind second: %d %v", code, out)
	}
	secondID := out["id"].(string)
	code, out = f.json("GET", "/api/v1/policy-bindings", nil)
	if items, _ := out["items"].([]any); code != 200 || len(items) != 1 || items[0].(map[string]any)["id"] != secondID {
		t.Fatalf("bindings: %d %v", code, out)
	}
	if code, out := f.json("DELETE", "/api/v1/policy-bindings/"+firstID, nil); code != 404 || out["code"] != "binding_not_found" {
		t.Fatalf("unbind the replaced binding: %d %v", code, out)
	}
	if code, out := f.json("DELETE", "/api/v1/policy-bindings/"+secondID, nil); code != 204 {
		t.Fatalf("unbind: %d %v", code, out)
	}
	if got := hints.String(); got != "[routes.compile.bound routes.compile.bound routes.compile.unbound]" {
		t.Fatalf("hints %s", got)
	}
	var got []string
	for _, e := range f.changelog() {
		got = append(got, e.EntityType+" "+e.EntityID+" "+e.Op)
	}
	// In the order the store committed them: the second binding is stored
	// before it replaces the first (each write carries its own entry).
	want := fmt.Sprint([]string{"policy_binding " + firstID + " create", "policy_binding " + secondID + " create",
		"policy_binding " + firstID + " delete", "policy_binding " + secondID + " delete"})
	if fmt.Sprint(got) != want {
		t.Fatalf("entries %v\nwant %s", got, want)
	}
}
