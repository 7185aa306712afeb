package nodes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store/storetest"
)

func pubKey(t *testing.T) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(pub)
}

func TestJoinTokenIsConsumedOnceUnderConcurrency(t *testing.T) {
	r := NewRegistry(storetest.Open(t), nil)
	ctx := context.Background()
	if err := r.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	tok, _, err := r.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, ErrJoinTokenUsed):
		default:
			t.Fatalf("unexpected error %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d enrollments won with one token, want exactly 1", won)
	}
	ns, _ := r.List(ctx)
	if len(ns) != 1 {
		t.Fatalf("%d nodes recorded, want 1", len(ns))
	}
}

func TestEnrollAndAuthenticate(t *testing.T) {
	now := time.Now()
	r := NewRegistry(storetest.Open(t), func() time.Time { return now })
	ctx := context.Background()
	tok, _, _ := r.CreateJoinToken(ctx, time.Minute)
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: "AAAA", Hostname: "n"}); !IsBadKey(err) {
		t.Fatalf("bad key: got %v", err)
	}
	n, cred, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if n.Status != StatusPending || n.CredentialDigest == cred {
		t.Fatalf("node %+v", n)
	}
	got, err := r.Authenticate(ctx, cred)
	if err != nil || got.ID != n.ID {
		t.Fatalf("authenticate: %v %v", got, err)
	}
	if _, err := r.Authenticate(ctx, cred+"x"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("wrong credential: %v", err)
	}
	tok2, _, _ := r.CreateJoinToken(ctx, time.Minute)
	now = now.Add(2 * time.Minute)
	if _, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok2, PublicKey: pubKey(t), Hostname: "n"}); !errors.Is(err, ErrJoinTokenExpired) {
		t.Fatalf("expired token: %v", err)
	}
}

func TestSetDesiredIsCompareAndSet(t *testing.T) {
	r := NewRegistry(storetest.Open(t), nil)
	ctx := context.Background()
	tok, _, _ := r.CreateJoinToken(ctx, 0)
	n, _, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	stale := *n
	rev, changed, err := r.SetDesired(ctx, n, "h1", "{}")
	if err != nil || !changed || rev != 1 {
		t.Fatalf("first: %d %v %v", rev, changed, err)
	}
	if rev, changed, err := r.SetDesired(ctx, n, "h1", "{}"); err != nil || changed || rev != 1 {
		t.Fatalf("same hash: %d %v %v", rev, changed, err)
	}
	if _, _, err := r.SetDesired(ctx, &stale, "h2", "{}"); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale writer: %v, want ErrConflict", err)
	}
	got, _ := r.Get(ctx, n.ID)
	if got.DesiredRev != 1 || got.DesiredHash != "h1" {
		t.Fatalf("stored %d %s", got.DesiredRev, got.DesiredHash)
	}
}

func TestSessionEndDoesNotOverwriteNewerSession(t *testing.T) {
	r := NewRegistry(storetest.Open(t), nil)
	ctx := context.Background()
	tok, _, _ := r.CreateJoinToken(ctx, 0)
	n, _, _ := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
	_ = r.SessionStarted(ctx, n.ID, "ses_old", "v", nil)
	_ = r.SessionStarted(ctx, n.ID, "ses_new", "v", nil)
	if err := r.SessionEnded(ctx, n.ID, "ses_old"); err != nil {
		t.Fatal(err)
	}
	got, _ := r.Get(ctx, n.ID)
	if got.Status != StatusConnected {
		t.Fatalf("status %s after the old session ended, want connected", got.Status)
	}
	_ = r.SessionEnded(ctx, n.ID, "ses_new")
	got, _ = r.Get(ctx, n.ID)
	if got.Status != StatusDisconnected {
		t.Fatalf("status %s, want disconnected", got.Status)
	}
}

// TestAuthenticateThroughCredentialIndex: a session finds its node through
// the credential index; a node enrolled before the index existed is found
// by its digest once and indexed then; an index entry whose node holds
// another credential authenticates nothing; a removed node never does.
func TestAuthenticateThroughCredentialIndex(t *testing.T) {
	st := storetest.Open(t)
	r := NewRegistry(st, nil)
	ctx := context.Background()
	tok, _, _ := r.CreateJoinToken(ctx, time.Minute)
	n, cred, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	creds := st.Collection("node_credentials")
	if c, _ := creds.CountDocuments(ctx, bson.M{"_id": n.CredentialDigest}); c != 1 {
		t.Fatalf("enrollment indexed %d credential entries, want 1", c)
	}
	// As if enrolled before the index: the first authentication restores it.
	if _, err := creds.DeleteMany(ctx, bson.M{}); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Authenticate(ctx, cred); err != nil || got.ID != n.ID {
		t.Fatalf("authenticate without an index entry: %v %v", got, err)
	}
	if c, _ := creds.CountDocuments(ctx, bson.M{"_id": n.CredentialDigest}); c != 1 {
		t.Fatalf("authentication did not restore the index entry")
	}
	// An entry pointing at a node that holds another credential is refused.
	other := "brn_" + strings.Repeat("B", 43)
	if _, err := creds.InsertOne(ctx, bson.M{"_id": identity.Digest(other), "node_id": n.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(ctx, other); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("stale index entry authenticated: %v", err)
	}
	if err := r.SessionStarted(ctx, n.ID, "ses_1", "test", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Get(ctx, n.ID); got.Status != StatusConnected || got.SessionID != "ses_1" {
		t.Fatalf("after SessionStarted: %+v", got)
	}
	if _, _, err := r.Remove(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(ctx, cred); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("removed node authenticated: %v", err)
	}
	if err := r.SessionStarted(ctx, n.ID, "ses_2", "test", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Get(ctx, n.ID); got.Status != StatusRemoved {
		t.Fatalf("a session start revived a removed node: %+v", got)
	}
}

// TestCredentialChecksTellStoreErrorsApart pins that a credential check the store could not
// answer is an error other than ErrUnauthenticated, so callers answer it as unavailable rather
// than telling a node its credential is bad.
func TestCredentialChecksTellStoreErrorsApart(t *testing.T) {
	st := storetest.Open(t)
	r := NewRegistry(st, nil)
	ctx := context.Background()
	tok, _, _ := r.CreateJoinToken(ctx, time.Minute)
	_, cred, err := r.Enroll(ctx, EnrollRequest{JoinToken: tok, PublicKey: pubKey(t), Hostname: "n", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(ctx, "brn_wrong"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Authenticate(wrong) = %v, want ErrUnauthenticated", err)
	}
	if _, err := r.Credential(ctx, "brn_wrong"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Credential(wrong) = %v, want ErrUnauthenticated", err)
	}
	if err := st.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(ctx, cred); err == nil || errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Authenticate with the store closed = %v, want a store error", err)
	}
	if _, err := r.Credential(ctx, cred); err == nil || errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Credential with the store closed = %v, want a store error", err)
	}
}
