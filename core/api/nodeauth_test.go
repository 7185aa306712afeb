package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/nodes"
)

// TestNodeCredentialStoreFailureIs503 pins that a node credential the store could not check is
// answered 503 unavailable, and only a credential that matches no node 401: a node's pulls must not
// be told its credential is bad while the store is away.
func TestNodeCredentialStoreFailureIs503(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	tok, _, err := f.reg.CreateJoinToken(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	_, cred, err := f.reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "n1", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/bundles/sha256:" + strings.Repeat("0", 64)
	if code, body := f.do(req{method: "GET", path: path, token: "brn_" + strings.Repeat("A", 43)}); code != 401 || body["code"] != "unauthenticated" {
		t.Fatalf("wrong node credential: %d %v, want 401 unauthenticated", code, body)
	}
	if code, body := f.do(req{method: "GET", path: path, token: cred}); code == 401 || code >= 500 {
		t.Fatalf("node credential: %d %v, want it accepted", code, body)
	}
	if err := f.st.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := f.do(req{method: "GET", path: path, token: cred}); code != 503 || body["code"] != "unavailable" {
		t.Fatalf("node credential with the store closed: %d %v, want 503 unavailable", code, body)
	}
}
