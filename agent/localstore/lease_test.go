package localstore

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestLeasesFencesAndFailedMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), FileName)
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	vu := int64(123456789)
	rows := []LeaseRow{
		{LeaseID: "lse_b", ResourceType: "service", ResourceID: "svc_b", Mode: "local", Token: 2, State: "held", BootID: "b1"},
		{LeaseID: "lse_a", ResourceType: "service", ResourceID: "svc_a", Mode: "expiring", Token: 7, State: "held",
			DurationMS: 15000, ValidUntilNS: &vu, BootID: "b1", Fence: "", FenceReason: ""},
	}
	for _, r := range rows {
		if err := st.PutLease(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	rows[1].State, rows[1].Fence, rows[1].FenceReason, rows[1].ValidUntilNS = "expired", "fencing", "expired", nil
	if err := st.PutLease(ctx, rows[1]); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := st.RecordFence(ctx, FenceRecord{LeaseID: "lse_a", Token: 7, Reason: "expired", WorkloadIDs: []string{"wl_1"}, Outcome: FenceOutcomeFailed, At: at}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordFence(ctx, FenceRecord{LeaseID: "lse_b", Token: 2, Reason: "revoked", WorkloadIDs: []string{}, Outcome: FenceOutcomeFenced, At: at}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.Leases(ctx)
	if err != nil || len(got) != 2 || got[0].LeaseID != "lse_a" || got[0].State != "expired" || got[0].Fence != "fencing" ||
		got[0].ValidUntilNS != nil || got[1].LeaseID != "lse_b" || got[1].Token != 2 {
		t.Fatalf("leases after reopen = %+v, %v", got, err)
	}
	failed, err := st.Fences(ctx, true)
	if err != nil || len(failed) != 1 || failed[0].LeaseID != "lse_a" || !slices.Equal(failed[0].WorkloadIDs, []string{"wl_1"}) || !failed[0].At.Equal(at) {
		t.Fatalf("failed fences = %+v, %v", failed, err)
	}
	if all, _ := st.Fences(ctx, false); len(all) != 2 {
		t.Errorf("all fences = %+v", all)
	}
	if _, marked, _ := st.Meta(ctx, MetaFailed); !marked {
		t.Errorf("a failed fence did not set the failed mark")
	}
	rem, err := st.AckFences(ctx, []string{"lse_zz"}, at)
	if err != nil || !slices.Equal(rem, []string{"lse_a"}) {
		t.Errorf("ack of an unknown lease: remaining %v, %v", rem, err)
	}
	if _, marked, _ := st.Meta(ctx, MetaFailed); !marked {
		t.Errorf("failed mark cleared while a failed fence remains")
	}
	if rem, err := st.AckFences(ctx, []string{"lse_a"}, at); err != nil || len(rem) != 0 {
		t.Errorf("ack: remaining %v, %v", rem, err)
	}
	if _, marked, _ := st.Meta(ctx, MetaFailed); marked {
		t.Errorf("failed mark kept after every failed fence was acknowledged")
	}
	if f, _ := st.Fences(ctx, true); len(f) != 0 {
		t.Errorf("failed fences after the ack = %+v", f)
	}
	if err := st.PutWorkload(ctx, Workload{WorkloadID: "wl_1", Driver: "fake", Phase: "running", LeaseID: "lse_a"}); err != nil {
		t.Fatal(err)
	}
	if ws, err := st.Workloads(ctx); err != nil || len(ws) != 1 || ws[0].LeaseID != "lse_a" {
		t.Errorf("workload records = %+v, %v", ws, err)
	}
}
