package localstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data", FileName)
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, path
}

func TestIdentityOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path := openTemp(t)
	if _, err := s.Identity(ctx); !errors.Is(err, ErrNotEnrolled) {
		t.Fatalf("Identity on empty store = %v, want ErrNotEnrolled", err)
	}
	id := Identity{NodeID: "nod_1", Credential: "brn_secret", ClusterPublicKey: "key", ClusterID: "cls_1",
		ServerURL: "http://core", PrivateKeyPath: "/d/node.key", Address: "127.0.0.1", Hostname: "h",
		EnrolledAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if err := s.SaveIdentity(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveIdentity(ctx, id); !errors.Is(err, ErrAlreadyEnrolled) {
		t.Fatalf("second SaveIdentity = %v, want ErrAlreadyEnrolled", err)
	}
	got, err := s.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, id) {
		t.Fatalf("Identity = %+v, want %+v", *got, id)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("store file mode %v, want 0600", fi.Mode().Perm())
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Fatalf("store dir mode %v, want 0700", di.Mode().Perm())
	}
}

func TestSnapshotsOnlyMoveForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path := openTemp(t)
	now := time.Now()
	if rev, raw, err := s.LatestSnapshot(ctx); err != nil || rev != 0 || raw != nil {
		t.Fatalf("empty LatestSnapshot = %d %q %v", rev, raw, err)
	}
	for _, step := range []struct {
		rev    int64
		stored bool
	}{{3, true}, {3, false}, {2, false}, {10, true}, {9, false}} {
		ok, err := s.StoreSnapshot(ctx, step.rev, []byte(`{"rev":`+itoa(step.rev)+`}`), now)
		if err != nil || ok != step.stored {
			t.Fatalf("StoreSnapshot(%d) = %v %v, want %v", step.rev, ok, err, step.stored)
		}
	}
	for i := int64(11); i < 20; i++ {
		if _, err := s.StoreSnapshot(ctx, i, []byte(`{}`), now); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM snapshots`).Scan(&n); err != nil || n != snapshotsKept {
		t.Fatalf("kept %d snapshots (%v), want %d", n, err, snapshotsKept)
	}
	if err := s.SetAppliedRev(ctx, 12); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAppliedRev(ctx, 11); err != nil {
		t.Fatal(err)
	}
	// Reopen: everything is durable.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s2.Close() }()
	rev, raw, err := s2.LatestSnapshot(ctx)
	if err != nil || rev != 19 || string(raw) != `{}` {
		t.Fatalf("LatestSnapshot after reopen = %d %q %v", rev, raw, err)
	}
	if got, err := s2.StoredRev(ctx); err != nil || got != 19 {
		t.Fatalf("StoredRev = %d %v", got, err)
	}
	if got, err := s2.AppliedRev(ctx); err != nil || got != 12 {
		t.Fatalf("AppliedRev = %d %v, want 12 (never lowered)", got, err)
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

func TestWorkloadRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := openTemp(t)
	code := 137
	a := Workload{WorkloadID: "wl_a", Driver: "process", Phase: "running", Port: 41000, SpecHash: "h", RestartGeneration: 2,
		RestartCount: 3, LastExitCode: &code, BackoffStep: 2, NextStartAt: time.Date(2026, 1, 1, 0, 0, 1, 5, time.UTC),
		StartedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Message: "m"}
	b := Workload{WorkloadID: "wl_b", Driver: "process", Phase: "starting"}
	for _, w := range []Workload{b, a} {
		if err := s.PutWorkload(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Workloads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []Workload{a, b}) {
		t.Fatalf("Workloads = %+v", got)
	}
	a.Phase = "crashed"
	if err := s.PutWorkload(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteWorkload(ctx, "wl_b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteWorkload(ctx, "wl_missing"); err != nil {
		t.Fatal(err)
	}
	got, err = s.Workloads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []Workload{a}) {
		t.Fatalf("Workloads = %+v", got)
	}
}
