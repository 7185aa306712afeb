package reconciler

import (
	"context"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestServiceTimeoutsRideOnItsRoutes: a service's gateway timeouts are on
// every route of the service in the pushed table, a change of them alone
// pushes a new table, and a service without timeouts has none on its routes
// (docs/plugins.md section 5.4).
func TestServiceTimeoutsRideOnItsRoutes(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	enroll(t, reg)
	rec := &recorder{pushed: map[string]int{}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec, Compiler: routes.Native{}})
	p, _, _ := cat.EnsureProject(ctx, "default")
	put := func(name string, to abiroutes.Timeouts, domains ...string) {
		t.Helper()
		cur, err := cat.GetService(ctx, p, name)
		var expected *int64
		if err == nil {
			expected = &cur.Revision
		}
		if _, _, err := cat.ApplyService(ctx, p, &services.Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080,
			Replicas: 1, Domains: domains, Timeouts: to}, expected); err != nil {
			t.Fatal(err)
		}
		if err := r.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slow := abiroutes.Timeouts{ConnectMS: 100, ResponseHeaderMS: 300_000}
	put("slow", slow, "a.slow.localhost", "b.slow.localhost")
	put("plain", abiroutes.Timeouts{}, "plain.localhost")
	last := func() map[string]abiroutes.Timeouts {
		out := map[string]abiroutes.Timeouts{}
		for _, rt := range rec.tables[len(rec.tables)-1].Routes {
			out[rt.Hostname] = rt.Timeouts
		}
		return out
	}
	got := last()
	if got["a.slow.localhost"] != slow || got["b.slow.localhost"] != slow || got["plain.localhost"] != (abiroutes.Timeouts{}) {
		t.Fatalf("route timeouts %+v", got)
	}
	pushes := len(rec.tables)
	put("slow", abiroutes.Timeouts{IdleMS: 1000}, "a.slow.localhost", "b.slow.localhost")
	if len(rec.tables) != pushes+1 {
		t.Fatalf("a change of timeouts alone pushed %d tables, want 1", len(rec.tables)-pushes)
	}
	if got := last(); got["a.slow.localhost"] != (abiroutes.Timeouts{IdleMS: 1000}) {
		t.Fatalf("route timeouts after the change %+v", got)
	}
}

// TestServiceStreamRidesOnItsRoutes: a service with stream has it on every route of the service
// in the pushed table, a change of it alone pushes a new table, and a service without it has
// none (docs/plugins.md section 5.2).
func TestServiceStreamRidesOnItsRoutes(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	enroll(t, reg)
	rec := &recorder{pushed: map[string]int{}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec, Compiler: routes.Native{}})
	p, _, _ := cat.EnsureProject(ctx, "default")
	put := func(name string, stream bool, domains ...string) {
		t.Helper()
		cur, err := cat.GetService(ctx, p, name)
		var expected *int64
		if err == nil {
			expected = &cur.Revision
		}
		if _, _, err := cat.ApplyService(ctx, p, &services.Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080,
			Replicas: 1, Domains: domains, Stream: stream}, expected); err != nil {
			t.Fatal(err)
		}
		if err := r.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	last := func() map[string]bool {
		out := map[string]bool{}
		for _, rt := range rec.tables[len(rec.tables)-1].Routes {
			out[rt.Hostname] = rt.Stream
		}
		return out
	}
	put("events", true, "a.events.localhost", "b.events.localhost")
	put("plain", false, "plain.localhost")
	if got := last(); !got["a.events.localhost"] || !got["b.events.localhost"] || got["plain.localhost"] {
		t.Fatalf("route stream %+v", got)
	}
	pushes := len(rec.tables)
	put("events", false, "a.events.localhost", "b.events.localhost")
	if len(rec.tables) != pushes+1 || last()["a.events.localhost"] {
		t.Fatalf("turning stream off pushed %d tables, stream now %+v", len(rec.tables)-pushes, last())
	}
}
