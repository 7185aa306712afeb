package services_test

import (
	"context"
	"testing"

	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestReconcileRequestWrittenWithEveryChange: each write of what a service declares (create,
// update, undo, rollback, delete mark) carries a reconcile request naming its revision and cause, in the
// same compare-and-set; an unchanged apply writes none.
func TestReconcileRequestWrittenWithEveryChange(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	cat := services.NewCatalog(st, nil)
	p, _, err := cat.EnsureProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	stored := func() *services.Service {
		t.Helper()
		s, err := cat.GetService(ctx, p, "web")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := func(what string, rev int64, cause string) {
		t.Helper()
		s := stored()
		if s.Revision != rev || s.Reconcile == nil || s.Reconcile.Revision != rev || s.Reconcile.Cause != cause || s.Reconcile.At.IsZero() {
			t.Fatalf("after %s: revision %d, request %+v; want a %s request at revision %d", what, s.Revision, s.Reconcile, cause, rev)
		}
	}
	web := func(digest string) *services.Service {
		return &services.Service{Name: "web", BundleDigest: digest, Command: []string{"./web"}, Port: 8080, Replicas: 1}
	}
	if _, _, err := cat.ApplyService(ctx, p, web("sha256:1"), nil); err != nil {
		t.Fatal(err)
	}
	want("create", 1, services.CauseCreated)
	if _, _, err := cat.ApplyService(ctx, p, web("sha256:2"), nil); err != nil {
		t.Fatal(err)
	}
	want("update", 2, services.CauseUpdated)
	if ok, err := cat.ClearReconcile(ctx, stored().ID, 2); err != nil || !ok {
		t.Fatalf("clear at revision 2: %v, %v", ok, err)
	}
	if _, outcome, err := cat.ApplyService(ctx, p, web("sha256:2"), nil); err != nil || outcome != services.PutUnchanged {
		t.Fatalf("unchanged apply: %v, %v", outcome, err)
	}
	if s := stored(); s.Reconcile != nil {
		t.Fatalf("an unchanged apply wrote a request: %+v", s.Reconcile)
	}
	// An undo and an automatic rollback (core/deploy writes them through ApplyService, naming
	// the change's cause in the request).
	undo := func(auto bool, cause string) {
		t.Helper()
		cur := stored()
		next, err := services.Undone(cur, auto)
		if err != nil {
			t.Fatal(err)
		}
		next.Reconcile = &services.ReconcileRequest{Cause: cause}
		rev := cur.Revision
		if _, _, err := cat.ApplyService(ctx, p, next, &rev); err != nil {
			t.Fatal(err)
		}
	}
	undo(false, services.CauseUndo)
	want("undo", 3, services.CauseUndo)
	undo(true, services.CauseRollback)
	want("rollback", 4, services.CauseRollback)
	if _, _, err := cat.ControlRollout(ctx, p, "web", services.RolloutPause, nil); err != nil {
		t.Fatal(err)
	}
	want("pause", 5, "rollout.pause")
	if _, _, err := cat.ControlRollout(ctx, p, "web", services.RolloutRestart, nil); err != nil {
		t.Fatal(err)
	}
	want("restart", 6, "rollout.restart")
	if _, err := cat.MarkDeleting(ctx, p, "web", nil); err != nil {
		t.Fatal(err)
	}
	want("delete mark", 7, services.CauseDeleting)
}

// TestClearReconcileKeepsANewerRequest is the consume step's compare-and-set: a pass that read
// revision 1 cannot clear the request a later write left at revision 2, and clearing the request
// it did read leaves the revision alone, so a client's expected revision stays valid.
func TestClearReconcileKeepsANewerRequest(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	cat := services.NewCatalog(st, nil)
	p, _, err := cat.EnsureProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	s1, _, err := cat.ApplyService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The pass read revision 1; meanwhile a write made revision 2.
	read := s1.Revision
	next := *s1
	next.Replicas = 3
	s2, _, err := cat.ApplyService(ctx, p, &next, &read)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cat.ClearReconcile(ctx, s1.ID, read); err != nil || ok {
		t.Fatalf("clear of the older request: cleared %v, err %v; want no clear", ok, err)
	}
	got, err := cat.GetServiceByID(ctx, s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reconcile == nil || got.Reconcile.Revision != s2.Revision {
		t.Fatalf("request after the stale clear = %+v; want the one of revision %d", got.Reconcile, s2.Revision)
	}
	if ok, err := cat.ClearReconcile(ctx, s1.ID, s2.Revision); err != nil || !ok {
		t.Fatalf("clear of the request read: cleared %v, err %v", ok, err)
	}
	got, err = cat.GetServiceByID(ctx, s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reconcile != nil || got.Revision != s2.Revision {
		t.Fatalf("after the clear: request %+v at revision %d; want none at revision %d", got.Reconcile, got.Revision, s2.Revision)
	}
	// The revision a client read before the clear still applies.
	expected := s2.Revision
	again := *got
	again.Replicas = 2
	if _, _, err := cat.ApplyService(ctx, p, &again, &expected); err != nil {
		t.Fatalf("apply at the revision read before the clear: %v", err)
	}
	if ok, err := cat.ClearReconcile(ctx, "svc_gone", 1); err != nil || ok {
		t.Fatalf("clear of a missing service: %v, %v; want a miss", ok, err)
	}
}
