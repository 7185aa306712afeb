package leases_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

func TestDecider(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, err := leases.Acquire(leases.State{}, "w1", now, time.Minute)
	if err != nil || a.Owner != "w1" || a.Epoch != 1 {
		t.Fatalf("first acquire = %+v, %v", a, err)
	}
	if _, err := leases.Acquire(a, "w2", now.Add(59*time.Second), time.Minute); !errors.Is(err, leases.ErrBusy) {
		t.Fatalf("acquire of a held lease: %v, want ErrBusy", err)
	}
	b, err := leases.Acquire(a, "w2", now.Add(time.Minute), time.Minute)
	if err != nil || b.Epoch != 2 {
		t.Fatalf("acquire of an expired lease = %+v, %v", b, err)
	}
	if _, err := leases.Renew(b, "w1", 1, now.Add(time.Minute), time.Minute); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("renew by the old holder: %v, want ErrLost", err)
	}
	if _, err := leases.Renew(a, "w1", 1, now.Add(time.Minute), time.Minute); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("renew of an expired lease nobody took: %v, want ErrLost", err)
	}
	r, err := leases.Release(b, "w2", 2, now.Add(time.Minute))
	if err != nil || r.Held(now) || r.Epoch != 2 {
		t.Fatalf("release = %+v, %v", r, err)
	}
}

func TestManagerAgainstStore(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m1 := leases.NewManager(st, leases.Config{Owner: "brd_1", TTL: 30 * time.Second, Now: clk.Now})
	m2 := leases.NewManager(st, leases.Config{Owner: "brd_2", TTL: 30 * time.Second, Now: clk.Now})
	key := leases.Key("prj_a")

	l1, err := m1.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Acquire(ctx, key); !errors.Is(err, leases.ErrBusy) {
		t.Fatalf("second worker: %v, want ErrBusy", err)
	}
	if _, err := m2.Acquire(ctx, leases.Key("prj_b")); err != nil {
		t.Fatalf("unrelated project: %v", err)
	}
	clk.Advance(20 * time.Second)
	if l1, err = m1.Renew(ctx, l1); err != nil {
		t.Fatalf("renew: %v", err)
	}
	clk.Advance(20 * time.Second) // still held thanks to the renewal
	if _, err := m2.Acquire(ctx, key); !errors.Is(err, leases.ErrBusy) {
		t.Fatalf("after renewal: %v, want ErrBusy", err)
	}
	clk.Advance(11 * time.Second) // expired
	l2, err := m2.Acquire(ctx, key)
	if err != nil || l2.Epoch != l1.Epoch+1 {
		t.Fatalf("takeover = %+v, %v", l2, err)
	}
	if _, err := m1.Renew(ctx, l1); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("old holder renews: %v, want ErrLost", err)
	}
	if err := m1.Release(ctx, l1); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("old holder releases: %v, want ErrLost", err)
	}
	if err := m2.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Acquire(ctx, key); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

// TestHoldSurfacesLoss: a holder whose lease is taken while it works gets ErrLost even though its
// own work returned nil, and its work's ctx is cancelled.
func TestHoldSurfacesLoss(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	// A short real TTL drives Hold's renewal ticker; the manual clock decides expiry.
	m1 := leases.NewManager(st, leases.Config{Owner: "brd_1", TTL: 300 * time.Millisecond, Now: clk.Now})
	m2 := leases.NewManager(st, leases.Config{Owner: "brd_2", TTL: 300 * time.Millisecond, Now: clk.Now})
	key := leases.Key("prj_a")
	// The second holder works under the test's own ctx, not under the first
	// holder's work ctx: once the clock moves, the first holder's renewal may
	// find its lease expired and cancel its work ctx before the takeover runs,
	// and a takeover under that ctx would fail with context.Canceled.
	err := m1.Hold(ctx, key, func(wctx context.Context, l leases.Lease) error {
		if err := m2.Hold(ctx, key, func(context.Context, leases.Lease) error { return nil }); !errors.Is(err, leases.ErrBusy) {
			t.Errorf("concurrent Hold: %v, want ErrBusy", err)
		}
		clk.Advance(time.Second) // the holding expires before its next renewal
		if _, err := m2.Acquire(ctx, key); err != nil {
			t.Errorf("takeover: %v", err)
		}
		select { // the renewal notices and cancels the work
		case <-wctx.Done():
		case <-time.After(30 * time.Second):
			t.Error("the work ctx was not cancelled after the takeover")
			return nil
		}
		if !errors.Is(context.Cause(wctx), leases.ErrLost) {
			t.Errorf("cause = %v, want ErrLost", context.Cause(wctx))
		}
		return nil
	})
	if !errors.Is(err, leases.ErrLost) {
		t.Fatalf("Hold = %v, want ErrLost", err)
	}
}
