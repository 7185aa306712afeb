package identity_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/securefile"
)

// openStore opens a real embedded store in dataDir for the test.
func openStore(t *testing.T, dataDir string) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, store.Config{DataDir: dataDir})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// clock is a settable time source for WithClock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for _, prefix := range []string{identity.PrefixToken, identity.PrefixNode, identity.PrefixJoin, identity.PrefixRunner} {
		tok, digest, err := identity.NewToken(prefix)
		if err != nil {
			t.Fatalf("NewToken(%q): %v", prefix, err)
		}
		if !strings.HasPrefix(tok, prefix) || len(tok) != len(prefix)+43 {
			t.Errorf("token %q: want prefix %q and 43 characters after it", tok, prefix)
		}
		if strings.ContainsAny(tok, "=+/") {
			t.Errorf("token %q is not base64url without padding", tok)
		}
		if !identity.WellFormed(tok, prefix) {
			t.Errorf("WellFormed(%q, %q) = false", tok, prefix)
		}
		if digest != identity.Digest(tok) || len(digest) != 64 || strings.ToLower(digest) != digest {
			t.Errorf("digest %q: want the lower-case hex SHA-256 of the token", digest)
		}
		if !identity.VerifyToken(tok, digest) || identity.VerifyToken(tok+"x", digest) {
			t.Errorf("VerifyToken mismatch for %q", tok)
		}
		if seen[tok] {
			t.Errorf("token repeated: %q", tok)
		}
		seen[tok] = true
	}
	// Known SHA-256 vector.
	if got := identity.Digest("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("Digest(abc) = %s", got)
	}
	for _, bad := range []string{"", "brt_", "brn_" + strings.Repeat("A", 43), "brt_" + strings.Repeat("A", 42), "brt_" + strings.Repeat("*", 43)} {
		if identity.WellFormed(bad, identity.PrefixToken) {
			t.Errorf("WellFormed(%q) = true", bad)
		}
	}
	if !identity.Equal("a", "a") || identity.Equal("a", "b") || identity.Equal("a", "aa") {
		t.Errorf("Equal is wrong")
	}
}

func TestScopesAndPrincipal(t *testing.T) {
	for s, want := range map[identity.Scope]bool{
		identity.ScopeAdmin: false, identity.ScopeNodeEnroll: true, identity.ScopeNodeRemove: true,
		identity.ScopeNodeFenceAck: true, identity.ScopeServicesRead: false,
		identity.ScopeServicesWrite: false, identity.ScopeNodesRead: false,
	} {
		if got := identity.HumanOnly(s); got != want {
			t.Errorf("HumanOnly(%s) = %v, want %v", s, got, want)
		}
		if !identity.Known(s) {
			t.Errorf("Known(%s) = false", s)
		}
	}
	if identity.Known("services:delete") {
		t.Errorf("Known(services:delete) = true")
	}

	admin := &identity.Principal{Kind: identity.KindAdmin, Scopes: []identity.Scope{identity.ScopeAdmin}}
	machineAdmin := &identity.Principal{Kind: identity.KindMachine, Scopes: []identity.Scope{identity.ScopeAdmin}}
	node := &identity.Principal{Kind: identity.KindNode, Scopes: []identity.Scope{identity.ScopeNodeEnroll, identity.ScopeNodesRead}}
	human := &identity.Principal{Kind: identity.KindHuman, Scopes: []identity.Scope{identity.ScopeNodeEnroll}}
	reader := &identity.Principal{Kind: identity.KindMachine, Scopes: []identity.Scope{identity.ScopeServicesRead}}
	for _, c := range []struct {
		p    *identity.Principal
		s    identity.Scope
		want bool
	}{
		{admin, identity.ScopeNodeRemove, true},
		{admin, identity.ScopeServicesWrite, true},
		{machineAdmin, identity.ScopeServicesWrite, true},
		{machineAdmin, identity.ScopeNodeFenceAck, false},
		{node, identity.ScopeNodeEnroll, false},
		{node, identity.ScopeNodesRead, true},
		{human, identity.ScopeNodeEnroll, true},
		{human, identity.ScopeNodeRemove, false},
		{reader, identity.ScopeServicesRead, true},
		{reader, identity.ScopeServicesWrite, false},
		{nil, identity.ScopeServicesRead, false},
	} {
		if got := c.p.Has(c.s); got != c.want {
			t.Errorf("%+v.Has(%s) = %v, want %v", c.p, c.s, got, c.want)
		}
	}
}

func TestNewID(t *testing.T) {
	prev := ""
	for range 1000 {
		id := identity.NewID(identity.IDPrefixNode)
		if !identity.ValidID(id, identity.IDPrefixNode) || len(id) != len("nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP") {
			t.Fatalf("NewID = %q, want nod_ + 26 upper-case Crockford characters", id)
		}
		if id <= prev {
			t.Fatalf("ids not increasing: %q after %q", id, prev)
		}
		prev = id
	}
	if !identity.ValidID("nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP", identity.IDPrefixNode) {
		t.Errorf("the example id is refused")
	}
	for _, bad := range []string{"nod_01jc9y2m4q7v8b1n6t3r5k9xzp", "svc_01JC9Y2M4Q7V8B1N6T3R5K9XZP", "nod_01JC9Y2M4Q7V8B1N6T3R5K9XZ", "nod_01JC9Y2M4Q7V8B1N6T3R5K9XZU"} {
		if identity.ValidID(bad, identity.IDPrefixNode) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestTokensCreateAuthenticate(t *testing.T) {
	ctx := t.Context()
	s := openStore(t, t.TempDir())
	clk := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tokens := identity.NewTokens(s, identity.WithClock(clk.Now))

	scopes := []identity.Scope{identity.ScopeServicesRead, identity.ScopeServicesWrite}
	tok, err := tokens.Create(ctx, identity.KindMachine, "ci", scopes, 0)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	p, err := tokens.Authenticate(ctx, tok)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if p.Kind != identity.KindMachine || p.Name != "ci" || !slices.Equal(p.Scopes, scopes) || !identity.ValidID(p.ID, identity.IDPrefixToken) {
		t.Fatalf("principal = %+v", p)
	}

	// Only the digest is stored.
	var rec bson.M
	if err := store.FindByID(ctx, s.Collection(identity.TokensCollection), identity.Digest(tok), &rec); err != nil {
		t.Fatalf("token record: %v", err)
	}
	for k, v := range rec {
		if str, ok := v.(string); ok && strings.Contains(str, tok[len(identity.PrefixToken):]) {
			t.Errorf("record field %s holds the token", k)
		}
	}
	for _, k := range []string{"kind", "name", "scopes", "created_at"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("record lacks %q: %v", k, rec)
		}
	}

	// Human-only scopes are refused on machine tokens, allowed on human and admin ones.
	for _, hs := range []identity.Scope{identity.ScopeNodeEnroll, identity.ScopeNodeRemove, identity.ScopeNodeFenceAck} {
		if _, err := tokens.Create(ctx, identity.KindMachine, "bad", []identity.Scope{identity.ScopeNodesRead, hs}, 0); !errors.Is(err, identity.ErrHumanOnlyScope) {
			t.Errorf("machine token with %s: got %v, want ErrHumanOnlyScope", hs, err)
		}
	}
	if _, err := tokens.Create(ctx, identity.KindHuman, "alice", []identity.Scope{identity.ScopeNodeEnroll}, time.Hour); err != nil {
		t.Errorf("human token with node:enroll: %v", err)
	}
	if _, err := tokens.Create(ctx, identity.KindNode, "n", nil, 0); err == nil {
		t.Errorf("Create of a node token succeeded")
	}
	if _, err := tokens.Create(ctx, identity.KindMachine, "x", []identity.Scope{"nope"}, 0); err == nil {
		t.Errorf("Create with an unknown scope succeeded")
	}
	if _, err := tokens.Create(ctx, identity.KindMachine, "x", nil, -time.Second); err == nil {
		t.Errorf("Create with a negative ttl succeeded")
	}

	// Expiry.
	short, err := tokens.Create(ctx, identity.KindMachine, "short", scopes, time.Minute)
	if err != nil {
		t.Fatalf("Create short: %v", err)
	}
	if _, err := tokens.Authenticate(ctx, short); err != nil {
		t.Fatalf("Authenticate before expiry: %v", err)
	}
	clk.Advance(time.Minute)
	if _, err := tokens.Authenticate(ctx, short); err != identity.ErrUnauthenticated {
		t.Fatalf("Authenticate at expiry: got %v, want exactly ErrUnauthenticated", err)
	}

	// Revocation.
	if err := tokens.Revoke(ctx, p.ID); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if err := tokens.Revoke(ctx, p.ID); err != nil {
		t.Fatalf("second Revoke: %v", err)
	}
	if err := tokens.Revoke(ctx, identity.NewID(identity.IDPrefixToken)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Revoke of an unknown id: got %v, want ErrNotFound", err)
	}

	// Every failure is the same error value.
	unknown, _, _ := identity.NewToken(identity.PrefixToken)
	joinTok, _, _ := identity.NewToken(identity.PrefixJoin)
	for name, bad := range map[string]string{
		"revoked":      tok,
		"expired":      short,
		"unknown":      unknown,
		"empty":        "",
		"wrong prefix": joinTok,
		"malformed":    "brt_short",
		"digest":       identity.Digest(tok),
	} {
		p, err := tokens.Authenticate(ctx, bad)
		if err != identity.ErrUnauthenticated || p != nil {
			t.Errorf("Authenticate(%s) = %v, %v; want nil, exactly ErrUnauthenticated", name, p, err)
		}
	}
}

func TestEnsureAdmin(t *testing.T) {
	ctx := t.Context()
	dataDir := t.TempDir()
	s := openStore(t, dataDir)
	tokens := identity.NewTokens(s)

	created, tok, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil || !created || tok == "" {
		t.Fatalf("first EnsureAdmin = %v, %q, %v; want created", created, tok, err)
	}
	path := filepath.Join(dataDir, identity.AdminTokenFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file: mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
	p, err := tokens.Authenticate(ctx, tok)
	if err != nil || p.Kind != identity.KindAdmin || !p.Has(identity.ScopeNodeFenceAck) {
		t.Fatalf("admin principal = %+v, %v", p, err)
	}

	created2, tok2, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil || created2 || tok2 != tok {
		t.Fatalf("second EnsureAdmin = %v, %q, %v; want the same token, not created", created2, tok2, err)
	}

	// A new database (file present, digest unknown) gets a new admin token.
	if err := s.Collection(identity.TokensCollection).Drop(ctx); err != nil {
		t.Fatal(err)
	}
	created3, tok3, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil || !created3 || tok3 == tok {
		t.Fatalf("EnsureAdmin after the store lost the token = %v, %q, %v; want a new token", created3, tok3, err)
	}
	if got, _ := securefile.ReadFile(path); strings.TrimSpace(string(got)) != tok3 {
		t.Fatalf("admin token file not updated")
	}

	// A revoked admin token stays revoked across restarts.
	p3, err := tokens.Authenticate(ctx, tok3)
	if err != nil {
		t.Fatal(err)
	}
	if err := tokens.Revoke(ctx, p3.ID); err != nil {
		t.Fatal(err)
	}
	created4, tok4, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil || created4 || tok4 != "" {
		t.Fatalf("EnsureAdmin after revocation = %v, %q, %v; want not created, empty token", created4, tok4, err)
	}

	// An insecure file is refused.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tokens.EnsureAdmin(ctx, dataDir); !errors.Is(err, securefile.ErrInsecure) {
		t.Fatalf("EnsureAdmin with a world-readable file: got %v, want ErrInsecure", err)
	}
}

func TestEnsureAdminSurvivesReopen(t *testing.T) {
	ctx := t.Context()
	dataDir := t.TempDir()
	s := openStore(t, dataDir)
	_, tok, err := identity.NewTokens(s).EnsureAdmin(ctx, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, dataDir)
	created, tok2, err := identity.NewTokens(s2).EnsureAdmin(ctx, dataDir)
	if err != nil || created || tok2 != tok {
		t.Fatalf("EnsureAdmin after reopen = %v, %q, %v; want the same token", created, tok2, err)
	}
}

func TestSigningKey(t *testing.T) {
	dataDir := t.TempDir()
	key, created, err := identity.LoadOrCreateSigningKey(dataDir)
	if err != nil || !created || len(key) != ed25519.PrivateKeySize {
		t.Fatalf("first LoadOrCreateSigningKey = %d bytes, %v, %v", len(key), created, err)
	}
	path := filepath.Join(dataDir, identity.SigningKeyFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("key directory mode %v, err %v; want 0700", di.Mode().Perm(), err)
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "-----BEGIN PRIVATE KEY-----\n") {
		t.Errorf("key file is not PEM PRIVATE KEY: %.40q", data)
	}
	key2, created2, err := identity.LoadOrCreateSigningKey(dataDir)
	if err != nil || created2 || !key.Equal(key2) {
		t.Fatalf("second LoadOrCreateSigningKey: created %v, same %v, err %v", created2, key.Equal(key2), err)
	}
	msg := []byte("desired state")
	if !ed25519.Verify(key2.Public().(ed25519.PublicKey), msg, ed25519.Sign(key, msg)) {
		t.Fatalf("reloaded key does not verify a signature of the original")
	}

	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.LoadOrCreateSigningKey(dataDir); err == nil {
		t.Fatalf("a garbage key file was accepted")
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.LoadOrCreateSigningKey(dataDir); !errors.Is(err, securefile.ErrInsecure) {
		t.Fatalf("group-readable key file: got %v, want ErrInsecure", err)
	}
}

func TestClusterID(t *testing.T) {
	dataDir := t.TempDir()
	id, created, err := identity.ClusterID(dataDir)
	if err != nil || !created || !identity.ValidID(id, identity.IDPrefixCluster) {
		t.Fatalf("first ClusterID = %q, %v, %v", id, created, err)
	}
	id2, created2, err := identity.ClusterID(dataDir)
	if err != nil || created2 || id2 != id {
		t.Fatalf("second ClusterID = %q, %v, %v; want %q, not created", id2, created2, err, id)
	}
	if err := os.WriteFile(filepath.Join(dataDir, identity.ClusterIDFile), []byte("cls_nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.ClusterID(dataDir); err == nil {
		t.Fatalf("a malformed cluster id was accepted")
	}
}
