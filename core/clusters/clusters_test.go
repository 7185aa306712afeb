package clusters_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store/storetest"
)

func TestCredentialGenerationsAndElection(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := clusters.New(storetest.Open(t), func() time.Time { return now })
	if err := r.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureDefault(ctx); err != nil {
		t.Fatalf("second EnsureDefault: %v", err)
	}
	if _, err := r.Create(ctx, "EU_1", true); !errors.Is(err, clusters.ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := r.Create(ctx, "eu-1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, "eu-1", true); !errors.Is(err, clusters.ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	for name, want := range map[string]bool{"eu-1": true, clusters.Default: false, "nowhere": false} {
		if got, err := r.RequiresRelay(ctx, name); err != nil || got != want {
			t.Fatalf("RequiresRelay(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, _, err := r.EnsureCredential(ctx, clusters.Default); !errors.Is(err, clusters.ErrNoRelay) {
		t.Fatalf("credential of a cluster without relay: %v", err)
	}
	b1, g1, err := r.EnsureCredential(ctx, "eu-1")
	if err != nil || b1 == "" || g1 != 1 {
		t.Fatalf("ensure: %q %d %v", b1, g1, err)
	}
	again, g, err := r.EnsureCredential(ctx, "eu-1")
	if err != nil || again != "" || g != 1 {
		t.Fatalf("second ensure must not show a bearer: %q %d %v", again, g, err)
	}
	c, gen, err := r.AuthenticateRelay(ctx, b1)
	if err != nil || c.Name != "eu-1" || gen != 1 {
		t.Fatalf("authenticate: %v %d %v", c, gen, err)
	}
	if _, err := r.Elect(ctx, "eu-1"); !errors.Is(err, clusters.ErrNotConnected) {
		t.Fatalf("no relay: %v", err)
	}
	reg := clusters.Registration{RelayID: "a", Build: "dev", Address: "10.0.0.1:8443", Sequence: 1, Generation: 1}
	if _, err := r.Register(ctx, "eu-1", reg); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Register(ctx, "eu-1", reg); !errors.Is(err, clusters.ErrSequenceNotAdvancing) {
		t.Fatalf("same sequence again: %v", err)
	}
	if got, err := r.Elect(ctx, "eu-1"); err != nil || got.RelayID != "a" {
		t.Fatalf("one relay: %v %v", got, err)
	}
	regB := reg
	regB.RelayID, regB.Address = "b", "10.0.0.2:8443"
	if _, err := r.Register(ctx, "eu-1", regB); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Elect(ctx, "eu-1"); !errors.Is(err, clusters.ErrAmbiguous) {
		t.Fatalf("two relays: %v", err)
	}
	if err := r.Unregister(ctx, "eu-1", "b", 1); err != nil {
		t.Fatal(err)
	}
	// A registration not renewed within LiveFor stops being live.
	now = now.Add(clusters.LiveFor)
	if _, err := r.Elect(ctx, "eu-1"); !errors.Is(err, clusters.ErrNotConnected) {
		t.Fatalf("expired relay: %v", err)
	}
	if err := r.Renew(ctx, "eu-1", "a", 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Renew(ctx, "eu-1", "a", 0); !errors.Is(err, clusters.ErrSuperseded) {
		t.Fatalf("renew of an older sequence: %v", err)
	}
	// Rotation leaves no overlap: the old bearer is stale at once, the registration stops being
	// live, and renewing it says the generation is gone.
	b2, g2, err := r.RotateCredential(ctx, "eu-1")
	if err != nil || g2 != 2 || b2 == b1 {
		t.Fatalf("rotate: %d %v", g2, err)
	}
	if _, gen, err := r.AuthenticateRelay(ctx, b1); !errors.Is(err, clusters.ErrCredentialStale) || gen != 1 {
		t.Fatalf("old bearer: gen %d %v", gen, err)
	}
	if _, _, err := r.AuthenticateRelay(ctx, "brr_"+b2[4:len(b2)-1]+"x"); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("unknown bearer: %v", err)
	}
	if _, err := r.Elect(ctx, "eu-1"); !errors.Is(err, clusters.ErrNotConnected) {
		t.Fatalf("after rotation: %v", err)
	}
	if err := r.Renew(ctx, "eu-1", "a", 1); !errors.Is(err, clusters.ErrCredentialStale) {
		t.Fatalf("renew after rotation: %v", err)
	}
	if _, err := r.Register(ctx, "eu-1", clusters.Registration{RelayID: "a", Address: "x:1", Sequence: 2, Generation: 1}); !errors.Is(err, clusters.ErrCredentialStale) {
		t.Fatalf("register under the old generation: %v", err)
	}
}
