package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// bindings is a routes.Source over an in-memory catalog; bound nil means
// nothing is bound.
type bindings struct {
	mu      sync.Mutex
	bound   *routes.Binding
	modules map[string][]byte
}

var _ routes.Source = (*bindings)(nil)

func (b *bindings) bind(id string, wasm []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := hostwasm.Digest(wasm)
	b.modules[d] = wasm
	b.bound = &routes.Binding{ID: id, ModuleDigest: d, Module: "m-" + id}
}

func (b *bindings) unbind() { b.mu.Lock(); b.bound = nil; b.mu.Unlock() }

func (b *bindings) BoundRouteCompiler(context.Context) (*routes.Binding, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bound == nil {
		return nil, nil
	}
	c := *b.bound
	return &c, nil
}

func (b *bindings) ModuleBytes(digest string) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	raw, ok := b.modules[digest]
	if !ok {
		return nil, errors.New("no such module")
	}
	return raw, nil
}

// routesAnswer is a route compiler's output for t, with its SHA-256.
func routesAnswer(t *testing.T, rs []abiroutes.Route) string {
	t.Helper()
	raw, err := json.Marshal(abiwasm.RoutesOutput{Routes: rs, SHA256: abiroutes.Table{Routes: rs}.Digest()})
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestBoundRouteCompiler: the module bound to routes.compile replaces the
// embedded default; a failing one leaves the last good table in force with
// the failure and the failing compiler in the status, and the gateway gets
// nothing new; unbinding returns to the default (docs/wasm-abi.md section 6.4).
func TestBoundRouteCompiler(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	enroll(t, reg)
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	def, err := rt.Load(ctx, routes.DefaultModule())
	if err != nil {
		t.Fatal(err)
	}
	src := &bindings{modules: map[string][]byte{}}
	rec := &recorder{pushed: map[string]int{}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec,
		Compiler: routes.NewBindable(routes.BindableConfig{Default: routes.Wasm{Module: def}, Source: src, Runtime: rt})})
	p, _, _ := cat.EnsureProject(ctx, "default")
	if _, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1, Domains: []string{"web.localhost"}}, nil); err != nil {
		t.Fatal(err)
	}

	// 1. Nothing bound: the default compiles.
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	st1 := r.RouteStatus()
	if len(st1.Table.Routes) != 1 || st1.Table.Routes[0].TLSMode != "none" || !strings.HasSuffix(st1.Compiler, ", default") || st1.LastError != "" {
		t.Fatalf("default: %+v", st1)
	}

	// 2. A bound compiler's table goes to the gateway, allow list and all.
	private := []abiroutes.Route{{Hostname: "web.localhost", Project: "default", Service: "web", TLSMode: "none",
		AllowSources: []string{"10.0.0.0/8"}, Upstreams: []abiroutes.Upstream{}}}
	src.bind("pbn_private", wasmtest.Routes("private-routes", routesAnswer(t, private)))
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	good := r.RouteStatus()
	if good.SHA256 != (abiroutes.Table{Routes: private}).Digest() || !strings.Contains(good.Compiler, "private-routes") || !strings.Contains(good.Compiler, "pbn_private") {
		t.Fatalf("bound: %+v", good)
	}
	pushed := len(rec.tables)
	if got := rec.tables[pushed-1]; len(got.Routes) != 1 || len(got.Routes[0].AllowSources) != 1 {
		t.Fatalf("pushed %+v", got)
	}

	// 3. Failing compilers keep that table and say why, and who.
	policyModule := wasmtest.Policy(wasmtest.PolicyOptions{Name: "a-policy"})
	for _, tc := range []struct {
		id, name string
		wasm     []byte
		want     string
	}{
		{"pbn_err", "err-routes", wasmtest.Routes("err-routes", `{"error":{"code":"compile_failed","message":"no luck"}}`), "compile_failed: no luck"},
		{"pbn_tls", "tls-routes", wasmtest.Routes("tls-routes", routesAnswer(t, []abiroutes.Route{{Hostname: "web.localhost", TLSMode: "https"}})), `unknown tls_mode "https"`},
		{"pbn_sum", "sum-routes", wasmtest.Routes("sum-routes", `{"routes":[],"sha256":"00"}`), "hashes to"},
		{"pbn_pol", "a-policy", policyModule, "not a route compiler"},
	} {
		src.bind(tc.id, tc.wasm)
		err := r.Pass(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.id) {
			t.Fatalf("%s: pass answered %v, want %q", tc.id, err, tc.want)
		}
		st := r.RouteStatus()
		if st.SHA256 != good.SHA256 || st.Compiler != good.Compiler || !strings.Contains(st.LastError, tc.want) ||
			st.LastErrorAt == nil || !strings.Contains(st.FailingCompiler, tc.id) {
			t.Fatalf("%s: status %+v", tc.id, st)
		}
		if len(rec.tables) != pushed {
			t.Fatalf("%s: a failed compilation reached the gateway", tc.id)
		}
	}

	// 4. Unbinding returns to the default and clears the failure.
	src.unbind()
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	back := r.RouteStatus()
	if back.SHA256 != st1.SHA256 || back.Compiler != st1.Compiler || back.LastError != "" || back.FailingCompiler != "" {
		t.Fatalf("after unbind: %+v", back)
	}
	if len(rec.tables) != pushed+1 {
		t.Fatalf("the default's table was not pushed again")
	}
}
