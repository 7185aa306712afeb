package nodes

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/core/store/storetest"
)

// enrolled returns a registry over the real embedded store and one node enrolled in it with
// allocatable a.
func enrolled(t *testing.T, a Resources) (*Registry, *Node) {
	t.Helper()
	r := NewRegistry(storetest.Open(t), nil)
	ctx := context.Background()
	tok, _, err := r.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n1", Address: "127.0.0.1", Allocatable: a})
	if err != nil {
		t.Fatal(err)
	}
	return r, n
}

func TestCapacityMergesOverridePerField(t *testing.T) {
	reported := Resources{CPUMilli: 4000, MemoryMiB: 8192, DiskMiB: 100000, Extended: map[string]int64{"gpu": 1, "fpga": 2}}
	for _, tc := range []struct {
		name     string
		override *Resources
		want     Resources
	}{
		{"none", nil, reported},
		{"cpu only", &Resources{CPUMilli: 2000}, Resources{CPUMilli: 2000, MemoryMiB: 8192, DiskMiB: 100000, Extended: map[string]int64{"gpu": 1, "fpga": 2}}},
		{"memory and disk", &Resources{MemoryMiB: 4096, DiskMiB: 5}, Resources{CPUMilli: 4000, MemoryMiB: 4096, DiskMiB: 5, Extended: map[string]int64{"gpu": 1, "fpga": 2}}},
		{"extended replaces per name, 0 hides", &Resources{Extended: map[string]int64{"gpu": 0, "tpu": 4}},
			Resources{CPUMilli: 4000, MemoryMiB: 8192, DiskMiB: 100000, Extended: map[string]int64{"gpu": 0, "fpga": 2, "tpu": 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{Allocatable: reported, CapacityOverride: tc.override}
			got := n.Capacity()
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("Capacity() (-want +got):\n%s", d)
			}
			got.Extended["gpu"] = 99 // the result shares nothing with the node
			if n.Allocatable.Extended["gpu"] != 1 {
				t.Fatal("Capacity() returned the node's own Extended map")
			}
		})
	}
}

func TestEnrollAndReportAllocatable(t *testing.T) {
	ctx := context.Background()
	r, n := enrolled(t, Resources{CPUMilli: 2000, MemoryMiB: 1024, Extended: map[string]int64{"gpu": 1}})
	got, err := r.Get(ctx, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Resources{CPUMilli: 2000, MemoryMiB: 1024, Extended: map[string]int64{"gpu": 1}}, got.Allocatable); d != "" {
		t.Fatalf("allocatable stored at enrollment (-want +got):\n%s", d)
	}
	next := Resources{CPUMilli: 1500, MemoryMiB: 900, DiskMiB: 10}
	if err := r.ReportAllocatable(ctx, n.ID, next, "cgroup2"); err != nil {
		t.Fatal(err)
	}
	got, _ = r.Get(ctx, n.ID)
	if !got.Allocatable.Equal(next) || got.ResourceLimits != "cgroup2" || got.ReportRev != 1 {
		t.Fatalf("after a report: allocatable %+v, limits %q, report_rev %d", got.Allocatable, got.ResourceLimits, got.ReportRev)
	}
	// The same report again writes nothing.
	if err := r.ReportAllocatable(ctx, n.ID, next, "cgroup2"); err != nil {
		t.Fatal(err)
	}
	if got, _ = r.Get(ctx, n.ID); got.ReportRev != 1 {
		t.Fatalf("an unchanged report wrote: report_rev %d, want 1", got.ReportRev)
	}
	if err := r.ReportAllocatable(ctx, n.ID, Resources{CPUMilli: -1}, ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative report: %v, want ErrInvalid", err)
	}
	tok, _, _ := r.CreateJoinToken(ctx, 0)
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n2", Address: "127.0.0.1",
		Allocatable: Resources{Extended: map[string]int64{"Bad Name": 1}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("enrollment with a bad extended name: %v, want ErrInvalid", err)
	}
}

func TestSetCapacityOverride(t *testing.T) {
	ctx := context.Background()
	r, n := enrolled(t, Resources{CPUMilli: 4000, MemoryMiB: 8192})
	o := &Resources{MemoryMiB: 4096, Extended: map[string]int64{"gpu": 2}}
	got, err := r.SetCapacityOverride(ctx, n.ID, o)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Resources{CPUMilli: 4000, MemoryMiB: 4096, Extended: map[string]int64{"gpu": 2}}, got.Capacity()); d != "" {
		t.Fatalf("capacity after the override (-want +got):\n%s", d)
	}
	stored, _ := r.Get(ctx, n.ID)
	if stored.OpRev != 1 || stored.CapacityOverride == nil || !stored.CapacityOverride.Equal(*o) {
		t.Fatalf("stored override %+v at op_rev %d", stored.CapacityOverride, stored.OpRev)
	}
	// The agent's next report keeps the override.
	if err := r.ReportAllocatable(ctx, n.ID, Resources{CPUMilli: 3000, MemoryMiB: 8000}, ""); err != nil {
		t.Fatal(err)
	}
	stored, _ = r.Get(ctx, n.ID)
	if c := stored.Capacity(); c.CPUMilli != 3000 || c.MemoryMiB != 4096 {
		t.Fatalf("capacity after a new report = %+v, want cpu 3000 reported and memory 4096 overridden", c)
	}
	// Idempotent.
	if _, err := r.SetCapacityOverride(ctx, n.ID, &Resources{MemoryMiB: 4096, Extended: map[string]int64{"gpu": 2}}); err != nil {
		t.Fatal(err)
	}
	if stored, _ = r.Get(ctx, n.ID); stored.OpRev != 1 {
		t.Fatalf("the same override again wrote: op_rev %d", stored.OpRev)
	}
	if _, err := r.SetCapacityOverride(ctx, n.ID, &Resources{DiskMiB: -5}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative override: %v, want ErrInvalid", err)
	}
	if _, err := r.SetCapacityOverride(ctx, "nod_missing", o); !errors.Is(err, ErrNotFound) {
		t.Fatalf("override of an unknown node: %v, want ErrNotFound", err)
	}
	// Clearing removes the field from the document.
	if _, err := r.SetCapacityOverride(ctx, n.ID, nil); err != nil {
		t.Fatal(err)
	}
	if stored, _ = r.Get(ctx, n.ID); stored.CapacityOverride != nil || stored.OpRev != 2 {
		t.Fatalf("after clearing: override %+v, op_rev %d", stored.CapacityOverride, stored.OpRev)
	}
}

func TestCordonDrainUncordon(t *testing.T) {
	ctx := context.Background()
	r, n := enrolled(t, Resources{})
	if !n.Schedulable() || n.Draining() {
		t.Fatal("a new node is not schedulable")
	}
	c, err := r.Cordon(ctx, n.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Schedulable() || c.Draining() || c.ShownStatus() != StatusPending {
		t.Fatalf("cordoned: schedulable %v draining %v status %s", c.Schedulable(), c.Draining(), c.ShownStatus())
	}
	deadline := time.Now().Add(10 * time.Minute)
	d, err := r.StartDrain(ctx, n.ID, deadline)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := r.Get(ctx, n.ID)
	if !stored.Draining() || !stored.Cordoned || stored.ShownStatus() != StatusDraining || stored.Drain.Deadline == nil ||
		!stored.Drain.Deadline.Equal(deadline.UTC().Truncate(time.Millisecond)) || !d.Drain.StartedAt.Equal(stored.Drain.StartedAt) {
		t.Fatalf("draining node as stored: %+v %+v", stored, stored.Drain)
	}
	// Draining again keeps the start; the same deadline writes nothing.
	again, err := r.StartDrain(ctx, n.ID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Drain.StartedAt.Equal(d.Drain.StartedAt) || again.OpRev != d.OpRev {
		t.Fatalf("a second drain changed the drain: %+v at op_rev %d, was %+v at %d", again.Drain, again.OpRev, d.Drain, d.OpRev)
	}
	if _, err := r.StartDrain(ctx, n.ID, time.Now().Add(-time.Minute)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a deadline in the past: %v, want ErrInvalid", err)
	}
	u, err := r.Cordon(ctx, n.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ = r.Get(ctx, n.ID)
	if !u.Schedulable() || !stored.Schedulable() || stored.Drain != nil || stored.Cordoned {
		t.Fatalf("uncordon left cordoned %v, drain %+v", stored.Cordoned, stored.Drain)
	}
	// A retiring node takes no operator change.
	if _, err := r.Retire(ctx, n.ID, DispositionWithdrawn); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Cordon(ctx, n.ID, true); !errors.Is(err, ErrNotMember) {
		t.Fatalf("cordon of a retiring node: %v, want ErrNotMember", err)
	}
}

// TestOperatorChangesDoNotLoseEachOther races a cordon, a drain and capacity overrides on one node:
// each is one compare-and-set on op_rev, retried on conflict, so every change lands and op_rev
// counts them all.
func TestOperatorChangesDoNotLoseEachOther(t *testing.T) {
	ctx := context.Background()
	r, n := enrolled(t, Resources{CPUMilli: 1000})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, f := range []func() error{
		func() error { _, err := r.Cordon(ctx, n.ID, true); return err },
		func() error { _, err := r.SetCapacityOverride(ctx, n.ID, &Resources{MemoryMiB: 512}); return err },
		func() error { _, err := r.StartDrain(ctx, n.ID, time.Time{}); return err },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, _ := r.Get(ctx, n.ID)
	if !got.Cordoned || got.Drain == nil || got.CapacityOverride == nil || got.CapacityOverride.MemoryMiB != 512 {
		t.Fatalf("a change was lost: cordoned %v drain %+v override %+v", got.Cordoned, got.Drain, got.CapacityOverride)
	}
	if got.OpRev < 2 || got.OpRev > 3 { // the drain may find the node cordoned already and change the same fields
		t.Fatalf("op_rev %d after three changes", got.OpRev)
	}
}
