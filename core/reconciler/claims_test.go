package reconciler

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// logTally counts the log records by message.
type logTally struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (l *logTally) Enabled(context.Context, slog.Level) bool { return true }
func (l *logTally) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs[r.Message]++
	return nil
}
func (l *logTally) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logTally) WithGroup(string) slog.Handler      { return l }
func (l *logTally) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}

// TestRouteClaimsDecideContestedHostnames runs two services' domains through
// the compiled path (the embedded default module and the native compiler) on
// a real store (docs/routes.md section 2): a hostname two services declare is
// served for the claim holder alone; without a holder it is served for
// neither, listed in the table's exclusions and logged once, while every
// other route keeps serving; a third service cannot take a held hostname;
// dropping the rival declaration serves the hostname again.
func TestRouteClaimsDecideContestedHostnames(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	def, err := rt.Load(ctx, routes.DefaultModule())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		compiler routes.Compiler
	}{{"default module", routes.Wasm{Module: def}}, {"native", routes.Native{}}} {
		t.Run(c.name, func(t *testing.T) { testRouteClaims(t, c.compiler) })
	}
}

func testRouteClaims(t *testing.T, compiler routes.Compiler) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	enroll(t, reg)
	rec := &recorder{pushed: map[string]int{}}
	logs := &logTally{msgs: map[string]int{}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec, Compiler: compiler, Logger: slog.New(logs)})
	shop, _, _ := cat.EnsureProject(ctx, "shop")
	blog, _, _ := cat.EnsureProject(ctx, "blog")
	apply := func(p *services.Project, name string, domains ...string) error {
		t.Helper()
		var expected *int64
		if cur, err := cat.GetService(ctx, p, name); err == nil {
			expected = &cur.Revision
		}
		_, _, err := cat.ApplyService(ctx, p, &services.Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080,
			Replicas: 1, Domains: domains}, expected)
		return err
	}
	pass := func() abiroutes.Table {
		t.Helper()
		if err := r.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		return r.Table()
	}
	servedFor := func(tb abiroutes.Table) map[string]string {
		out := map[string]string{}
		for _, rt := range tb.Routes {
			out[rt.Hostname] = rt.Project + "/" + rt.Service
		}
		return out
	}
	// declareBehindClaims adds a domain to a service the way a writer from
	// before route claims did (or an apply that raced the check): in the
	// service document only, with no claim taken.
	declareBehindClaims := func(p *services.Project, name string, domains ...string) {
		t.Helper()
		cur, err := cat.GetService(ctx, p, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.UpdateIfRevision(ctx, st.Collection("services"), cur.ID, cur.Revision, bson.M{"$set": bson.M{"domains": domains}}); err != nil {
			t.Fatal(err)
		}
	}

	if err := apply(shop, "web", "shop.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := apply(blog, "www", "blog.example.com"); err != nil {
		t.Fatal(err)
	}
	if got := servedFor(pass()); got["shop.example.com"] != "shop/web" || got["blog.example.com"] != "blog/www" {
		t.Fatalf("two services, no contest: %v", got)
	}

	// 1. blog/www declares shop.example.com too; shop/web took its claim at apply.
	declareBehindClaims(blog, "www", "blog.example.com", "shop.example.com")
	tb := pass()
	if got := servedFor(tb); got["shop.example.com"] != "shop/web" || got["blog.example.com"] != "blog/www" || len(tb.Excluded) != 0 {
		t.Fatalf("claim held by shop/web: served %v, excluded %+v", got, tb.Excluded)
	}
	if n := logs.count("hostname withheld from a service"); n != 1 {
		t.Fatalf("withheld declaration logged %d times, want 1", n)
	}

	// 2. Nobody holds the claim: served for neither, every other route still served.
	if _, err := st.Collection("route_claims").DeleteOne(ctx, bson.M{"_id": "shop.example.com"}); err != nil {
		t.Fatal(err)
	}
	tb = pass()
	if got := servedFor(tb); got["shop.example.com"] != "" || got["blog.example.com"] != "blog/www" {
		t.Fatalf("contested without a claim: served %v", got)
	}
	want := []abiroutes.Exclusion{{Hostname: "shop.example.com", Reason: "claimed by blog/www and shop/web; none of them holds its claim"}}
	if !slices.Equal(tb.Excluded, want) {
		t.Fatalf("excluded %+v, want %+v", tb.Excluded, want)
	}
	if pushed := rec.tables[len(rec.tables)-1]; !slices.Equal(pushed.Excluded, want) || servedFor(pushed)["shop.example.com"] != "" {
		t.Fatalf("the gateway got %+v", pushed)
	}
	if st := r.RouteStatus(); !slices.Equal(st.Table.Excluded, want) {
		t.Fatalf("route status shows %+v", st.Table.Excluded)
	}
	pushes := len(rec.tables)
	pass()
	pass()
	if n := logs.count("hostname served by no service"); n != 1 {
		t.Fatalf("exclusion logged %d times over three passes, want once", n)
	}
	if len(rec.tables) != pushes {
		t.Fatalf("unchanged passes pushed %d tables", len(rec.tables)-pushes)
	}

	// 3. While shop/web declares it, another service cannot take the hostname.
	if err := apply(blog, "other", "shop.example.com"); !errors.Is(err, services.ErrDomainTaken) {
		t.Fatalf("a third service applying a declared hostname: %v, want ErrDomainTaken", err)
	}

	// 4. blog/www drops it: shop/web is served again, and the exclusion ends.
	if err := apply(blog, "www", "blog.example.com"); err != nil {
		t.Fatal(err)
	}
	tb = pass()
	if got := servedFor(tb); got["shop.example.com"] != "shop/web" || len(tb.Excluded) != 0 {
		t.Fatalf("rival dropped: served %v, excluded %+v", got, tb.Excluded)
	}
	if n := logs.count("hostname no longer excluded"); n != 1 {
		t.Fatalf("end of the exclusion logged %d times, want 1", n)
	}

	// 5. shop/web re-applies and takes the claim; deleting it withdraws the
	// route in the next table and frees the hostname for blog/www.
	if err := apply(shop, "web", "shop.example.com"); err != nil {
		t.Fatal(err)
	}
	web, err := cat.MarkDeleting(ctx, shop, "web", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := servedFor(pass()); got["shop.example.com"] != "" {
		t.Fatalf("deleted service still served: %v", got)
	}
	// The deletion finalizer's last step, once the node settled every slot
	// (the node here never reports): the service goes, and its claims with it.
	if err := cat.DeleteServiceByID(ctx, web.ID); err != nil {
		t.Fatal(err)
	}
	if err := apply(blog, "www", "blog.example.com", "shop.example.com"); err != nil {
		t.Fatalf("taking a hostname whose holder was deleted: %v", err)
	}
	if got := servedFor(pass()); got["shop.example.com"] != "blog/www" {
		t.Fatalf("after the hand-over: %v", got)
	}
}

// TestRouteCompilerCannotServeAnExcludedHostname: a bound compiler that
// routes a hostname claims exclude (one it was not given) does not get it
// into the table; its other routes are served.
func TestRouteCompilerCannotServeAnExcludedHostname(t *testing.T) {
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
	p, _, _ := cat.EnsureProject(ctx, "shop")
	for _, name := range []string{"a", "b"} {
		if _, _, err := cat.ApplyService(ctx, p, &services.Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080,
			Replicas: 1, Domains: []string{name + ".example.com"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Both declare x.example.com with no claim (a writer from before claims).
	for _, name := range []string{"a", "b"} {
		cur, _ := cat.GetService(ctx, p, name)
		if _, err := st.UpdateIfRevision(ctx, st.Collection("services"), cur.ID, cur.Revision,
			bson.M{"$set": bson.M{"domains": []string{name + ".example.com", "x.example.com"}}}); err != nil {
			t.Fatal(err)
		}
	}
	greedy := []abiroutes.Route{
		{Hostname: "a.example.com", Project: "shop", Service: "a", TLSMode: "none", Upstreams: []abiroutes.Upstream{}},
		{Hostname: "x.example.com", Project: "shop", Service: "a", TLSMode: "none", Upstreams: []abiroutes.Upstream{}},
	}
	src.bind("pbn_greedy", wasmtest.Routes("greedy-routes", routesAnswer(t, greedy)))
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	tb := rec.tables[len(rec.tables)-1]
	if len(tb.Routes) != 1 || tb.Routes[0].Hostname != "a.example.com" {
		t.Fatalf("routes %+v; want a.example.com alone", tb.Routes)
	}
	if len(tb.Excluded) != 1 || tb.Excluded[0].Hostname != "x.example.com" || !strings.Contains(tb.Excluded[0].Reason, "shop/a and shop/b") {
		t.Fatalf("excluded %+v", tb.Excluded)
	}
}

// TestRouteCompilerCannotTakeAHeldHostname: with api holding the claim on
// api.localhost, a bound compiler that routes api.localhost to web has its
// whole table refused, naming the module and the hostname; the last good
// table stays in force and the gateway gets nothing new
// (docs/routes.md section 2).
func TestRouteCompilerCannotTakeAHeldHostname(t *testing.T) {
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
	for _, name := range []string{"api", "web"} {
		if _, _, err := cat.ApplyService(ctx, p, &services.Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./" + name}, Port: 8080,
			Replicas: 1, Domains: []string{name + ".localhost"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	good := r.RouteStatus()
	got := map[string]string{}
	for _, rt := range good.Table.Routes {
		got[rt.Hostname] = rt.Project + "/" + rt.Service
	}
	if got["api.localhost"] != "default/api" || got["web.localhost"] != "default/web" {
		t.Fatalf("default table: %v", got)
	}
	pushed := len(rec.tables)

	taker := []abiroutes.Route{
		{Hostname: "api.localhost", Project: "default", Service: "web", TLSMode: "none", Upstreams: []abiroutes.Upstream{}},
		{Hostname: "web.localhost", Project: "default", Service: "web", TLSMode: "none", Upstreams: []abiroutes.Upstream{}},
	}
	src.bind("pbn_taker", wasmtest.Routes("taker-routes", routesAnswer(t, taker)))
	err = r.Pass(ctx)
	if err == nil || !errors.Is(err, routes.ErrClaimBroken) || !strings.Contains(err.Error(), "taker-routes") ||
		!strings.Contains(err.Error(), "api.localhost is held by default/api") {
		t.Fatalf("pass with a compiler taking api.localhost answered %v", err)
	}
	st2 := r.RouteStatus()
	if st2.SHA256 != good.SHA256 || !strings.Contains(st2.LastError, "api.localhost") || !strings.Contains(st2.FailingCompiler, "taker-routes") {
		t.Fatalf("status after the refusal: %+v", st2)
	}
	if len(rec.tables) != pushed {
		t.Fatalf("a table handing api.localhost to web reached the gateway: %+v", rec.tables[len(rec.tables)-1].Routes)
	}
}
