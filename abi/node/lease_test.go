package node

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestLeaseGrantSignVerify(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	g := &LeaseGrant{LeaseID: "lse_1", ResourceType: LeaseResourceService, ResourceID: "svc_1",
		Mode: LeaseExpiring, FencingToken: 7, DurationMS: 15000, GrantedAt: time.Unix(1, 0).UTC()}
	if err := SignLeaseGrant(g, priv); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(g)
	got, err := VerifyLeaseGrant(raw, pub)
	if err != nil || got.FencingToken != 7 {
		t.Fatalf("verify: %v %+v", err, got)
	}
	g.FencingToken = 8 // tampered after signing
	raw, _ = json.Marshal(g)
	if _, err := VerifyLeaseGrant(raw, pub); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered grant verified: %v", err)
	}
	r := &LeaseRevoke{LeaseID: "lse_1", FencingToken: 8, Reason: RevokeMoved}
	if err := SignLeaseRevoke(r, priv); err != nil {
		t.Fatal(err)
	}
	raw, _ = json.Marshal(r)
	if _, err := VerifyLeaseRevoke(raw, pub); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseMargin(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		3 * time.Second: time.Second, 15 * time.Second: 1500 * time.Millisecond, 10 * time.Second: time.Second,
	} {
		if got := LeaseMargin(d); got != want {
			t.Errorf("LeaseMargin(%v) = %v, want %v", d, got, want)
		}
	}
}
