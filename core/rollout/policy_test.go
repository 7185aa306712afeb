package rollout_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestDeployPolicyDenialReachesTheVerdict binds the require-digest example policy to the
// deploy hook and applies a service that names its bundle by name: the verdict turns
// refused(policy-denied: ...) on the first pass with the policy's reason, stays so over later
// passes with one rollout.denied event, and goes once the binding is removed.
func TestDeployPolicyDenialReachesTheVerdict(t *testing.T) {
	h := newHarness(t, 1)
	blobs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), h.st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(h.ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	eng := policy.New(policy.Config{Store: h.st, Blobs: blobs, Runtime: rt, Now: h.clk.Now})
	if err := eng.EnsureIndexes(h.ctx); err != nil {
		t.Fatal(err)
	}
	evs := events.New(h.st, h.clk.Now)
	if err := evs.EnsureIndexes(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.prod = rollout.NewProducer(rollout.Config{Store: h.rs, Catalog: h.cat, Nodes: h.reg, Now: h.clk.Now,
		Admit: policy.Deploy{Engine: eng}, Events: evs})
	h.rec = reconciler.New(reconciler.Config{Catalog: h.cat, Nodes: h.reg, Routes: h.sink, Compiler: routes.Native{}, Rollout: h.prod})

	m, err := eng.PutModule(h.ctx, bytes.NewReader(wasmtest.BuildGo(t, "examples/policies/require-digest")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := eng.Bind(h.ctx, policy.Binding{Hook: abiwasm.HookDeploy, ModuleDigest: m.Digest})
	if err != nil {
		t.Fatal(err)
	}
	svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", Bundle: "web", BundleDigest: "sha256:a",
		Command: []string{"./web"}, Port: 8080, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := slots.PolicyDeniedReason([]string{"bundle web is not named by digest; use sha256:<hex>"})
	if !strings.HasPrefix(string(want), "policy-denied: bundle web") {
		t.Fatalf("reason %q", want)
	}
	denied := func() []events.Record {
		t.Helper()
		got, err := evs.List(h.ctx, 0, rollout.TypeRolloutDenied, 100)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for pass := range 3 {
		h.step()
		v := h.verdict(svc.ID)
		if v.State != slots.Refused || v.Reason != want {
			t.Fatalf("pass %d: verdict %s, want refused(%s)", pass, v, want)
		}
		if n := len(denied()); n != 1 {
			t.Fatalf("pass %d: %d %s events, want 1 (one per change of reason)", pass, n, rollout.TypeRolloutDenied)
		}
	}
	wantVerdict := slots.Verdict{State: slots.Refused, Reason: want}.String()
	if got := denied()[0]; got.Event.Subject.ID != svc.ID || got.Event.Data["verdict"] != wantVerdict {
		t.Fatalf("event %+v", got.Event)
	}
	// What describe, get services and rollout status read.
	cur, err := h.cat.GetServiceByID(h.ctx, svc.ID)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}.Rollout(h.ctx, cur)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Verdict.String() != wantVerdict || rs.Updated != 0 {
		t.Fatalf("rollout view: verdict %s, %d updated; want %s", rs.Verdict, rs.Updated, wantVerdict)
	}
	if ws, err := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID}); err != nil || len(ws) != 0 {
		t.Fatalf("workloads of a denied run: %v, %v", ws, err)
	}

	if _, err := eng.Unbind(h.ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	h.until(10, "converged once the binding is gone", h.converged(svc.ID), nil)
	if v := h.verdict(svc.ID); v.Reason != "" {
		t.Fatalf("verdict %s still names a reason", v)
	}
	if n := len(denied()); n != 1 {
		t.Fatalf("%d %s events after the policy allowed, want 1", n, rollout.TypeRolloutDenied)
	}
}

// TestDeployPolicyDenialKeepsTheOldReplicasRunning converges two replicas with the
// require-digest policy bound to the deploy hook, then changes the service to a bundle named by
// name, which the policy denies: the deploy hook is asked before an old replica is stopped, so
// both old replicas keep running, no slot is stopped, and the verdict names the refusal.
func TestDeployPolicyDenialKeepsTheOldReplicasRunning(t *testing.T) {
	h := newHarness(t, 2)
	blobs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), h.st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(h.ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	eng := policy.New(policy.Config{Store: h.st, Blobs: blobs, Runtime: rt, Now: h.clk.Now})
	if err := eng.EnsureIndexes(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.prod = rollout.NewProducer(rollout.Config{Store: h.rs, Catalog: h.cat, Nodes: h.reg, Now: h.clk.Now,
		Admit: policy.Deploy{Engine: eng}})
	h.rec = reconciler.New(reconciler.Config{Catalog: h.cat, Nodes: h.reg, Routes: h.sink, Compiler: routes.Native{}, Rollout: h.prod})
	m, err := eng.PutModule(h.ctx, bytes.NewReader(wasmtest.BuildGo(t, "examples/policies/require-digest")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Bind(h.ctx, policy.Binding{Hook: abiwasm.HookDeploy, ModuleDigest: m.Digest}); err != nil {
		t.Fatal(err)
	}

	svc := h.put("sha256:a", 2) // named by its digest only: allowed
	h.until(10, "converged on release a", h.converged(svc.ID), nil)
	if got := h.serving(svc); got["sha256:a"] != 2 {
		t.Fatalf("serving %v, want 2 of release a", got)
	}
	svc, _, err = h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", Bundle: "web", BundleDigest: "sha256:b",
		Command: []string{"./web"}, Port: 8080, Replicas: 2, Domains: []string{"web.localhost"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := slots.PolicyDeniedReason([]string{"bundle web is not named by digest; use sha256:<hex>"})
	for pass := range 5 {
		h.step()
		if got := h.serving(svc); got["sha256:a"] != 2 || got["sha256:b"] != 0 {
			set, _ := h.rs.Slots(h.ctx, svc.ID)
			t.Fatalf("pass %d: serving %v under a denied change, want the 2 old replicas\nslots %+v", pass, got, set.Slots)
		}
		set, err := h.rs.Slots(h.ctx, svc.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range set.Slots {
			if r.Generation != int(slots.GenRun) {
				t.Fatalf("pass %d: slot %s at generation %d: a replica was stopped before its successor was admitted", pass, r.Replica, r.Generation)
			}
		}
	}
	if v := h.verdict(svc.ID); v.State != slots.Refused || v.Reason != want {
		t.Fatalf("verdict %s, want refused(%s)", v, want)
	}
	running := 0
	ws, err := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ObservedStatus == "running" && w.DesiredStatus == services.DesiredRunning {
			running++
		}
	}
	if running != 2 || len(ws) != 2 {
		t.Fatalf("%d workloads, %d running, want the 2 old ones running: %+v", len(ws), running, ws)
	}
}
