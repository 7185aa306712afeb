package nodes

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/core/store/storetest"
)

// A join code enrolls one node, under the id it reserved and with its labels; the second
// enrollment with it is refused and records no node, and the code no longer checks.
func TestJoinCodeEnrollsOnceWithItsLabels(t *testing.T) {
	now := time.Now()
	r := NewRegistry(storetest.Open(t), func() time.Time { return now })
	ctx := context.Background()
	j, err := r.CreateJoin(ctx, JoinRequest{Code: true, Labels: map[string]string{"role": "web"}, MachineID: "m-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !WellFormedJoinCode(j.Secret) || !j.ExpiresAt.Equal(now.UTC().Add(DefaultJoinCodeTTL)) {
		t.Fatalf("code %q expires %s: want 16 base32 characters valid 30 min", j.Secret, j.ExpiresAt)
	}
	if err := r.CheckJoinCode(ctx, j.Secret); err != nil {
		t.Fatalf("fresh code: %v", err)
	}
	n, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: j.Secret, PublicKey: pubKey(t), Hostname: "a", Address: "127.0.0.1", Labels: map[string]string{"role": "db", "zone": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if n.ID != j.NodeID || n.Labels["role"] != "web" || n.Labels["zone"] != "x" {
		t.Fatalf("node %s labels %v: want %s with role=web (the code's) and zone=x (the agent's)", n.ID, n.Labels, j.NodeID)
	}
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: j.Secret, PublicKey: pubKey(t), Hostname: "b", Address: "127.0.0.1"}); !errors.Is(err, ErrJoinTokenUsed) {
		t.Fatalf("second enrollment: %v, want ErrJoinTokenUsed", err)
	}
	if ns, _ := r.List(ctx); len(ns) != 1 {
		t.Fatalf("%d nodes after a code was used twice, want 1", len(ns))
	}
	if err := r.CheckJoinCode(ctx, j.Secret); !errors.Is(err, ErrJoinCodeInvalid) {
		t.Fatalf("used code: %v, want ErrJoinCodeInvalid", err)
	}
}

// Unknown, expired and malformed codes all get the one answer; a code lasts at most 24 h; a
// refused admission consumes nothing.
func TestJoinCodeRefusals(t *testing.T) {
	now := time.Now()
	r := NewRegistry(storetest.Open(t), func() time.Time { return now })
	ctx := context.Background()
	if _, err := r.CreateJoin(ctx, JoinRequest{Code: true, TTL: 25 * time.Hour}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("25 h code: %v, want ErrInvalid", err)
	}
	j, err := r.CreateJoin(ctx, JoinRequest{Code: true, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused by policy")
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: j.Secret, PublicKey: pubKey(t), Hostname: "a", Address: "127.0.0.1",
		Admit: func(context.Context, *Node) error { return refused }}); !errors.Is(err, refused) {
		t.Fatalf("admission: %v", err)
	}
	if err := r.CheckJoinCode(ctx, j.Secret); err != nil {
		t.Fatalf("after a refused admission the code still checks: %v", err)
	}
	for _, code := range []string{"aaaaaaaaaaaaaaaa", "short", j.Secret[:15] + "!"} {
		if err := r.CheckJoinCode(ctx, code); !errors.Is(err, ErrJoinCodeInvalid) {
			t.Fatalf("code %q: %v, want ErrJoinCodeInvalid", code, err)
		}
	}
	now = now.Add(2 * time.Minute)
	if err := r.CheckJoinCode(ctx, j.Secret); !errors.Is(err, ErrJoinCodeInvalid) {
		t.Fatalf("expired code: %v, want ErrJoinCodeInvalid", err)
	}
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: j.Secret, PublicKey: pubKey(t), Hostname: "a", Address: "127.0.0.1"}); !errors.Is(err, ErrJoinTokenExpired) {
		t.Fatalf("expired code enrolls: %v", err)
	}
}
