package api

import (
	"archive/tar"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/identity"
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
	tokens := identity.NewTokens(st)
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
	eng := policy.New(policy.Config{Store: st, Blobs: bs, Runtime: rt})
	if err := eng.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	table := abiroutes.Table{Revision: 3, Routes: []abiroutes.Route{{Hostname: "hello.localhost", Project: "default", Service: "hello", TLSMode: "none", Upstreams: []abiroutes.Upstream{}}}}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	s := New(Config{Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: nopHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Policy: eng,
		Routes: fixedRoutes{Table: table, SHA256: table.Digest(), Compiler: "test", CompiledAt: time.Now()}})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &fixture{t: t, st: st, srv: srv, admin: admin, blobs: blobDir, reg: reg}
}

// TestPolicyDeniesApply is the acceptance test in miniature: a bound
// policy refuses a service with its reasons and nothing is stored.
func TestPolicyDeniesApply(t *testing.T) {
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
}
