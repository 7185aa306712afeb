package identity_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// cheap keeps argon2id fast in tests; the verifier format is the production one.
var cheap = identity.Argon2Params{Memory: 64, Time: 1, Threads: 1, KeyLen: 32, SaltLen: 16}

const goodPassword = "correct horse battery staple"

func newUsers(t *testing.T, opts ...identity.TokensOption) (*identity.Tokens, *store.Store, *clock) {
	t.Helper()
	s := openStore(t, t.TempDir())
	clk := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	opts = append([]identity.TokensOption{identity.WithClock(clk.Now), identity.WithArgon2Params(cheap)}, opts...)
	return identity.NewTokens(s, opts...), s, clk
}

func TestPasswordVerifier(t *testing.T) {
	v, err := identity.HashPassword(goodPassword, identity.DefaultArgon2Params)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "$argon2id$v=19$m=65536,t=2,p=1$") || strings.Contains(v, goodPassword) {
		t.Fatalf("verifier %q: want the PHC argon2id form with its parameters", v)
	}
	if !identity.VerifyPassword(goodPassword, v) || identity.VerifyPassword(goodPassword+"x", v) {
		t.Fatalf("VerifyPassword mismatch")
	}
	// Verifiers with other parameters stay readable.
	v2, _ := identity.HashPassword(goodPassword, cheap)
	if !identity.VerifyPassword(goodPassword, v2) {
		t.Fatalf("a verifier with other parameters does not verify")
	}
	for _, bad := range []string{"", "$argon2id$v=19$m=999999999,t=1,p=1$c2FsdHNhbHQ$" + strings.Repeat("A", 43), "$scrypt$x", v[:len(v)-4]} {
		if identity.VerifyPassword(goodPassword, bad) {
			t.Errorf("malformed verifier %q matched", bad)
		}
	}
	for pw, ok := range map[string]bool{
		strings.Repeat("a", 19): false, strings.Repeat("a", 20): true, strings.Repeat("é", 20): true,
		strings.Repeat("a", 1024): true, strings.Repeat("a", 1025): false, "\xff" + strings.Repeat("a", 30): false,
	} {
		if err := identity.CheckPassword(pw); (err == nil) != ok || (err != nil && !errors.Is(err, identity.ErrPasswordPolicy)) {
			t.Errorf("CheckPassword(%d bytes) = %v, want ok=%v", len(pw), err, ok)
		}
	}
}

func TestBootstrapAdminOnce(t *testing.T) {
	ctx := t.Context()
	tokens, s, _ := newUsers(t)
	if _, err := tokens.BootstrapAdmin(ctx, "alice", "short"); !errors.Is(err, identity.ErrPasswordPolicy) {
		t.Fatalf("short password: %v", err)
	}
	created, err := tokens.BootstrapAdmin(ctx, "alice", goodPassword)
	if err != nil || !created {
		t.Fatalf("first bootstrap = %v, %v", created, err)
	}
	// A later start with another password or another name changes nothing.
	for _, name := range []string{"alice", "mallory"} {
		created, err := tokens.BootstrapAdmin(ctx, name, "another password of enough length")
		if err != nil || created {
			t.Fatalf("bootstrap again as %s = %v, %v; want nothing done", name, created, err)
		}
	}
	if _, err := tokens.GetUser(ctx, "mallory"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a second bootstrap admin was made: %v", err)
	}
	if _, err := tokens.Login(ctx, "alice", "another password of enough length", 0); err != identity.ErrUnauthenticated {
		t.Fatalf("the later password works: %v", err)
	}
	sess, err := tokens.Login(ctx, "alice", goodPassword, 0)
	if err != nil {
		t.Fatalf("login with the bootstrap password: %v", err)
	}
	// The stored record holds a verifier, never the password.
	var rec bson.M
	if err := store.FindByID(ctx, s.Collection(identity.UsersCollection), "alice", &rec); err != nil {
		t.Fatal(err)
	}
	for k, v := range rec {
		if str, ok := v.(string); ok && strings.Contains(str, goodPassword) {
			t.Errorf("user field %s holds the password", k)
		}
	}
	p, err := tokens.Authenticate(ctx, sess.Token)
	if err != nil || p.Kind != identity.KindHuman || p.Owner != "alice" || !p.Has(identity.ScopeNodeFenceAck) {
		t.Fatalf("session principal = %+v, %v", p, err)
	}
}

func TestSessionsAndGenerations(t *testing.T) {
	ctx := t.Context()
	tokens, _, clk := newUsers(t)
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "bob", Kind: identity.KindHuman, Roles: []identity.Role{identity.RoleOperator}, Password: goodPassword}); err != nil {
		t.Fatal(err)
	}
	sess, err := tokens.Login(ctx, "bob", goodPassword, 0)
	if err != nil || !identity.WellFormed(sess.Token, identity.PrefixSession) || !sess.ExpiresAt.Equal(clk.Now().Add(12*time.Hour)) {
		t.Fatalf("login = %+v, %v; want a brs_ session of 12 h", sess, err)
	}
	for _, ttl := range []time.Duration{time.Second, 8 * 24 * time.Hour} {
		if _, err := tokens.Login(ctx, "bob", goodPassword, ttl); !errors.Is(err, identity.ErrInvalid) {
			t.Errorf("session lifetime %v: %v", ttl, err)
		}
	}
	p, err := tokens.Authenticate(ctx, sess.Token)
	if err != nil || !tokens.Fresh(p) {
		t.Fatalf("fresh session: %+v, %v", p, err)
	}
	clk.Advance(identity.ReauthWindow + time.Second)
	if p, _ = tokens.Authenticate(ctx, sess.Token); tokens.Fresh(p) {
		t.Fatalf("a session older than 5 minutes counts as fresh")
	}

	// Rotating the password makes generation g+1; the session of generation g fails at once.
	other, err := tokens.Login(ctx, "bob", goodPassword, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.ChangeCredential(ctx, "bob", 99, identity.OpRotatePassword, "a new password that is long enough"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("rotate at a stale generation: %v", err)
	}
	if _, err := tokens.ChangeCredential(ctx, "bob", 1, identity.OpRotatePassword, "too short"); !errors.Is(err, identity.ErrPasswordPolicy) {
		t.Fatalf("rotate to a short password: %v", err)
	}
	u, err := tokens.ChangeCredential(ctx, "bob", 1, identity.OpRotatePassword, "a new password that is long enough")
	if err != nil || u.Generation != 2 {
		t.Fatalf("rotate = %+v, %v; want generation 2", u, err)
	}
	for _, tok := range []string{sess.Token, other.Token} {
		if _, err := tokens.Authenticate(ctx, tok); err != identity.ErrUnauthenticated {
			t.Fatalf("a generation-1 session after the rotation: %v", err)
		}
	}
	if _, err := tokens.Login(ctx, "bob", goodPassword, 0); err != identity.ErrUnauthenticated {
		t.Fatalf("the old password still logs in: %v", err)
	}
	s2, err := tokens.Login(ctx, "bob", "a new password that is long enough", 0)
	if err != nil || s2.Generation != 2 {
		t.Fatalf("login with the new password = %+v, %v", s2, err)
	}
	// revoke_sessions keeps the password, ends the sessions.
	if _, err := tokens.ChangeCredential(ctx, "bob", 0, identity.OpRevokeSessions, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Authenticate(ctx, s2.Token); err != identity.ErrUnauthenticated {
		t.Fatalf("session after revoke_sessions: %v", err)
	}
	s3, err := tokens.Login(ctx, "bob", "a new password that is long enough", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Logout ends one session; revoke_password ends password login.
	if err := tokens.Logout(ctx, s3.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Authenticate(ctx, s3.Token); err != identity.ErrUnauthenticated {
		t.Fatalf("session after logout: %v", err)
	}
	if _, err := tokens.ChangeCredential(ctx, "bob", 0, identity.OpRevokePassword, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Login(ctx, "bob", "a new password that is long enough", 0); err != identity.ErrUnauthenticated {
		t.Fatalf("login after revoke_password: %v", err)
	}
	// A session token is not a machine token, and the reverse.
	if _, err := tokens.Authenticate(ctx, "brt_"+strings.TrimPrefix(s3.Token, "brs_")); err != identity.ErrUnauthenticated {
		t.Fatalf("a session body under the brt_ prefix: %v", err)
	}
}

func TestLoginUnknownUserAndBackoff(t *testing.T) {
	ctx := t.Context()
	tokens, _, clk := newUsers(t)
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "carol", Kind: identity.KindHuman, Roles: []identity.Role{identity.RoleAdmin}, Password: goodPassword}); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "ci", Kind: identity.KindMachine}); err != nil {
		t.Fatal(err)
	}
	// Wrong password, unknown user, a machine user: the same error value.
	for _, c := range [][2]string{{"carol", "wrong password wrong password"}, {"nobody", goodPassword}, {"ci", goodPassword}, {"carol", strings.Repeat("x", 2000)}} {
		if _, err := tokens.Login(ctx, c[0], c[1], 0); err != identity.ErrUnauthenticated {
			t.Errorf("login %s: %v, want exactly ErrUnauthenticated", c[0], err)
		}
	}
	// backoff is how long an attempt for carol is refused, 0 when it was not.
	backoff := func(password string) time.Duration {
		t.Helper()
		_, err := tokens.Login(ctx, "carol", password, 0)
		var te *identity.LoginThrottledError
		if errors.As(err, &te) {
			if !errors.Is(err, identity.ErrLoginBackoff) {
				t.Fatalf("a refused attempt: %v; want ErrLoginBackoff", err)
			}
			return te.RetryAfter
		}
		return 0
	}
	// 10 failures in a minute are free; then each next attempt is due 1 s after the last
	// failure, doubling, bounded; an attempt before is refused with how long to wait.
	for i := range 8 { // two of carol's failures are above
		if d := backoff("wrong password wrong password"); d != 0 {
			t.Fatalf("failure %d refused with %v", i+3, d)
		}
	}
	var waits []time.Duration
	for range 5 {
		d := backoff("wrong password wrong password")
		if d == 0 {
			t.Fatalf("an attempt right after a failure was not refused")
		}
		waits = append(waits, d)
		clk.Advance(d)
		if d := backoff("wrong password wrong password"); d != 0 {
			t.Fatalf("an attempt when due was refused: %v", d)
		}
	}
	if waits[0] != time.Second || waits[1] != 2*time.Second || waits[4] != identity.MaxLoginDelay {
		t.Fatalf("waits = %v; want 1 s doubling to at most %v", waits, identity.MaxLoginDelay)
	}
	// Another user is not held back; the right password logs in when due and clears the count.
	if _, err := tokens.Login(ctx, "nobody", "x", 0); err != identity.ErrUnauthenticated {
		t.Fatal(err)
	}
	if d := backoff(goodPassword); d == 0 {
		t.Fatalf("the right password before it was due was not refused")
	}
	clk.Advance(identity.MaxLoginDelay)
	if _, err := tokens.Login(ctx, "carol", goodPassword, 0); err != nil {
		t.Fatalf("the right password when due: %v", err)
	}
	if d := backoff("wrong password wrong password"); d != 0 {
		t.Fatalf("a failure after a success was refused: %v", d)
	}
	// The window passes.
	for range 12 {
		clk.Advance(identity.MaxLoginDelay)
		_ = backoff("wrong password wrong password")
	}
	clk.Advance(identity.LoginFailureWindow + time.Second)
	if d := backoff("wrong password wrong password"); d != 0 {
		t.Fatalf("an attempt after the window was refused: %v", d)
	}
}

// TestLoginConcurrencyFor: an eighth of memory in 64 MiB verifications, at most 4 per CPU,
// at least 2.
func TestLoginConcurrencyFor(t *testing.T) {
	for _, c := range []struct {
		mem   uint64
		cores int
		want  int
	}{{0, 0, 2}, {512 << 20, 8, 2}, {2 << 30, 0, 4}, {16 << 30, 0, 32}, {16 << 30, 2, 8}, {24 << 30, 64, 48}, {1 << 30, 1, 2}} {
		if got := identity.LoginConcurrencyFor(c.mem, c.cores); got != c.want {
			t.Errorf("LoginConcurrencyFor(%d MiB, %d cores) = %d, want %d", c.mem>>20, c.cores, got, c.want)
		}
	}
}

func TestMachineTokens(t *testing.T) {
	ctx := t.Context()
	tokens, s, clk := newUsers(t)
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "alice", Kind: identity.KindHuman, Roles: []identity.Role{identity.RoleOperator}}); err != nil {
		t.Fatal(err)
	}
	req := identity.MachineTokenRequest{Name: "ci-deploy", Owner: "alice", Scopes: []identity.Scope{identity.ScopeServiceDeploy}, Project: "shop", Service: "web", TTL: 90 * 24 * time.Hour}
	tok, info, err := tokens.CreateMachine(ctx, req)
	if err != nil || !identity.WellFormed(tok, identity.PrefixToken) || info.Name != "ci-deploy" || info.Project != "shop" || info.Service != "web" {
		t.Fatalf("CreateMachine = %q, %+v, %v", tok, info, err)
	}
	if _, _, err := tokens.CreateMachine(ctx, req); !errors.Is(err, identity.ErrExists) {
		t.Fatalf("a second token of the same name: %v", err)
	}
	for name, bad := range map[string]identity.MachineTokenRequest{
		"human-only": {Name: "x", Scopes: []identity.Scope{identity.ScopeNodeRemove}},
		"no scope":   {Name: "x"},
		"unknown":    {Name: "x", Scopes: []identity.Scope{"root"}},
		"upper":      {Name: "CI", Scopes: []identity.Scope{identity.ScopeServicesRead}},
		"colon":      {Name: "a:b", Scopes: []identity.Scope{identity.ScopeServicesRead}},
		"slash":      {Name: "a/b", Scopes: []identity.Scope{identity.ScopeServicesRead}},
		"long":       {Name: strings.Repeat("a", 65), Scopes: []identity.Scope{identity.ScopeServicesRead}},
		"service":    {Name: "x", Scopes: []identity.Scope{identity.ScopeServicesRead}, Service: "web"},
		"over 1y":    {Name: "x", Scopes: []identity.Scope{identity.ScopeServicesRead}, TTL: 366 * 24 * time.Hour},
	} {
		_, _, err := tokens.CreateMachine(ctx, bad)
		want := identity.ErrInvalid
		if name == "human-only" {
			want = identity.ErrHumanOnlyScope
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}

	p, err := tokens.Authenticate(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		scope            identity.Scope
		project, service string
		anyService, want bool
	}{
		{identity.ScopeServiceDeploy, "shop", "web", false, true},
		{identity.ScopeServicesRead, "shop", "web", false, true},
		{identity.ScopeServiceDeploy, "shop", "db", false, false},
		{identity.ScopeServiceDeploy, "other", "web", false, false},
		{identity.ScopeServiceDeploy, "shop", "", false, false},
		{identity.ScopeServiceDeploy, "shop", "", true, true},
		{identity.ScopeServicesWrite, "shop", "web", false, false},
		{identity.ScopeServicesRead, "", "", false, false},
		{identity.ScopeNodesRead, "", "", false, false},
	} {
		if got := p.Allows(c.scope, c.project, c.service, c.anyService); got != c.want {
			t.Errorf("Allows(%s, %q, %q, %v) = %v, want %v", c.scope, c.project, c.service, c.anyService, got, c.want)
		}
	}

	// Last use is written, at most once a minute.
	var rec bson.M
	if err := store.FindByID(ctx, s.Collection(identity.TokensCollection), identity.Digest(tok), &rec); err != nil || rec["last_used_at"] == nil {
		t.Fatalf("last use not recorded: %v %v", rec, err)
	}
	first := rec["last_used_at"]
	clk.Advance(30 * time.Second)
	_, _ = tokens.Authenticate(ctx, tok)
	_ = store.FindByID(ctx, s.Collection(identity.TokensCollection), identity.Digest(tok), &rec)
	if rec["last_used_at"] != first {
		t.Fatalf("last use written twice within a minute")
	}
	clk.Advance(31 * time.Second)
	_, _ = tokens.Authenticate(ctx, tok)
	_ = store.FindByID(ctx, s.Collection(identity.TokensCollection), identity.Digest(tok), &rec)
	if rec["last_used_at"] == first {
		t.Fatalf("last use not written after a minute")
	}

	// Rotation: a new secret, the same grants; the old one fails at once.
	tok2, info2, err := tokens.RotateMachine(ctx, "ci-deploy")
	if err != nil || tok2 == tok || info2.Project != "shop" || info2.Service != "web" || !info2.ExpiresAt.Equal(*info.ExpiresAt) {
		t.Fatalf("rotate = %+v, %v", info2, err)
	}
	if _, err := tokens.Authenticate(ctx, tok); err != identity.ErrUnauthenticated {
		t.Fatalf("the rotated-out token: %v", err)
	}
	if _, err := tokens.Authenticate(ctx, tok2); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	list, err := tokens.ListMachineTokens(ctx, "")
	if err != nil || len(list) != 1 || list[0].Name != "ci-deploy" || list[0].ID != info2.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if _, err := tokens.RevokeMachine(ctx, "ci-deploy"); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Authenticate(ctx, tok2); err != identity.ErrUnauthenticated {
		t.Fatalf("the revoked token: %v", err)
	}
	if _, err := tokens.RevokeMachine(ctx, "ci-deploy"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke of a freed name: %v", err)
	}
	// Expiry.
	short, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "short", Scopes: []identity.Scope{identity.ScopeServicesRead}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if _, err := tokens.Authenticate(ctx, short); err != identity.ErrUnauthenticated {
		t.Fatalf("expired token: %v", err)
	}
}

func TestRotateRace(t *testing.T) {
	ctx := t.Context()
	tokens, _, _ := newUsers(t)
	tok, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "ci", Scopes: []identity.Scope{identity.ScopeServicesRead}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]string, 4)
	for i := range results {
		wg.Go(func() {
			if tk, _, err := tokens.RotateMachine(ctx, "ci"); err == nil {
				results[i] = tk
			}
		})
	}
	wg.Wait()
	live := 0
	for _, tk := range append(results, tok) {
		if tk == "" {
			continue
		}
		if _, err := tokens.Authenticate(ctx, tk); err == nil {
			live++
		}
	}
	if live != 1 {
		t.Fatalf("%d live secrets after concurrent rotations, want exactly 1", live)
	}
}

func TestRolesAndGrants(t *testing.T) {
	ctx := t.Context()
	tokens, _, _ := newUsers(t)
	mk := func(name string, roles []identity.Role, grants []identity.Grant) *identity.Principal {
		t.Helper()
		if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: name, Kind: identity.KindHuman, Roles: roles, Grants: grants, Password: goodPassword}); err != nil {
			t.Fatal(err)
		}
		s, err := tokens.Login(ctx, name, goodPassword, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := tokens.Authenticate(ctx, s.Token)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	op := mk("olga", []identity.Role{identity.RoleOperator}, nil)
	viewer := mk("vic", []identity.Role{identity.RoleViewer}, []identity.Grant{{Project: "shop", Role: identity.RoleOperator}})
	if !op.Allows(identity.ScopeServicesWrite, "any", "svc", false) || !op.Has(identity.ScopeNodeFenceAck) || op.Has(identity.ScopeAdmin) {
		t.Errorf("operator: %+v", op)
	}
	if viewer.Allows(identity.ScopeServicesWrite, "other", "", false) || !viewer.Allows(identity.ScopeServicesWrite, "shop", "web", false) ||
		!viewer.Allows(identity.ScopeServicesRead, "other", "", false) || viewer.Has(identity.ScopeNodeRemove) {
		t.Errorf("viewer with an operator grant on shop: %+v", viewer)
	}
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "x", Kind: identity.KindHuman, Roles: []identity.Role{"root"}}); !errors.Is(err, identity.ErrInvalid) {
		t.Errorf("unknown role: %v", err)
	}
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "olga", Kind: identity.KindHuman}); !errors.Is(err, identity.ErrExists) {
		t.Errorf("taken name: %v", err)
	}
}

func TestCheckBearer(t *testing.T) {
	node, digest, err := identity.NewToken(identity.PrefixNode)
	if err != nil {
		t.Fatal(err)
	}
	if !identity.CheckBearer(node, identity.PrefixNode, digest) {
		t.Fatalf("a node credential does not check against its digest")
	}
	other, otherDigest, _ := identity.NewToken(identity.PrefixNode)
	for name, c := range map[string][2]string{
		"other digest": {node, otherDigest},
		"wrong prefix": {"brt_" + strings.TrimPrefix(node, "brn_"), identity.Digest("brt_" + strings.TrimPrefix(node, "brn_"))},
		"malformed":    {"brn_short", identity.Digest("brn_short")},
		"empty":        {"", identity.Digest("")},
		"swapped":      {other, digest},
	} {
		if identity.CheckBearer(c[0], identity.PrefixNode, c[1]) {
			t.Errorf("%s: CheckBearer accepted", name)
		}
	}
}

// TestBootstrapTokenIsNamed: the admin token is the machine token named bootstrap, owned by
// the bootstrap admin; rotating it kills the file's token, and a restart does not revive it.
func TestBootstrapTokenIsNamed(t *testing.T) {
	ctx := t.Context()
	dataDir := t.TempDir()
	s := openStore(t, dataDir)
	tokens := identity.NewTokens(s, identity.WithArgon2Params(cheap))
	_, tok, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.BootstrapAdmin(ctx, "root", goodPassword); err != nil {
		t.Fatal(err)
	}
	list, err := tokens.ListMachineTokens(ctx, "root")
	if err != nil || len(list) != 1 || list[0].Name != identity.BootstrapTokenName || list[0].Kind != identity.KindAdmin {
		t.Fatalf("tokens of root = %+v, %v; want the bootstrap token", list, err)
	}
	next, _, err := tokens.RotateMachine(ctx, identity.BootstrapTokenName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Authenticate(ctx, tok); err != identity.ErrUnauthenticated {
		t.Fatalf("the file's token after rotation: %v", err)
	}
	p, err := tokens.Authenticate(ctx, next)
	if err != nil || !p.Has(identity.ScopeNodeEnroll) {
		t.Fatalf("the rotated bootstrap token = %+v, %v; want the admin principal", p, err)
	}
	// The rotation's new secret goes to the file, once: a rewrite of a secret the name no
	// longer points at is refused.
	if path, err := tokens.RewriteAdminFile(ctx, next); err != nil || path != filepath.Join(dataDir, identity.AdminTokenFile) {
		t.Fatalf("RewriteAdminFile = %q, %v", path, err)
	}
	if path, err := tokens.RewriteAdminFile(ctx, tok); err != nil || path != "" {
		t.Fatalf("RewriteAdminFile of the rotated-out secret = %q, %v; want nothing written", path, err)
	}
	created, again, err := tokens.EnsureAdmin(ctx, dataDir)
	if err != nil || created || again != next {
		t.Fatalf("EnsureAdmin after rotation = %v, %q, %v; want the rotated secret from the file", created, again, err)
	}
	if _, err := tokens.RevokeMachine(ctx, identity.BootstrapTokenName); err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Authenticate(ctx, next); err != identity.ErrUnauthenticated {
		t.Fatalf("the revoked bootstrap token: %v", err)
	}
}

// TestMachineTokenNarrowedByOwner: Authenticate and Recheck (the registry's path) give a
// machine token the scopes both it and its owner's current roles hold, from the next call; a
// token whose owner is gone is refused; a project-bound token counts its owner's grant there.
func TestMachineTokenNarrowedByOwner(t *testing.T) {
	ctx := t.Context()
	tokens, _, _ := newUsers(t)
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "dev", Kind: identity.KindMachine, Roles: []identity.Role{identity.RoleOperator}}); err != nil {
		t.Fatal(err)
	}
	wide, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "wide", Owner: "dev", Scopes: []identity.Scope{identity.ScopeServicesWrite, identity.ScopeNodesRead}})
	if err != nil {
		t.Fatal(err)
	}
	bound, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "bound", Owner: "dev", Scopes: []identity.Scope{identity.ScopeServicesWrite}, Project: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	orphan, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "orphan", Owner: "gone", Scopes: []identity.Scope{identity.ScopeServicesRead}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what, tok string, scope identity.Scope, project string, want bool) {
		t.Helper()
		for name, get := range map[string]func() (*identity.Principal, error){
			"Authenticate": func() (*identity.Principal, error) { return tokens.Authenticate(ctx, tok) },
			"Recheck":      func() (*identity.Principal, error) { return tokens.Recheck(ctx, identity.Digest(tok)) },
		} {
			p, err := get()
			if err != nil {
				t.Fatalf("%s: %s: %v", what, name, err)
			}
			if got := p.Allows(scope, project, "", false); got != want {
				t.Errorf("%s: %s: Allows(%s, %q) = %v, want %v (scopes %v, grants %v)", what, name, scope, project, got, want, p.Scopes, p.Grants)
			}
		}
	}
	check("an operator's token", wide, identity.ScopeServicesWrite, "shop", true)
	check("an operator's token", wide, identity.ScopeNodesRead, "", true)
	if _, err := tokens.SetRoles(ctx, "dev", []identity.Role{identity.RoleViewer}, []identity.Grant{{Project: "shop", Role: identity.RoleOperator}}); err != nil {
		t.Fatal(err)
	}
	check("a viewer's token", wide, identity.ScopeServicesWrite, "other", false)
	check("a viewer's token", wide, identity.ScopeServicesRead, "other", true)
	check("a viewer's token in its owner's grant", wide, identity.ScopeServicesWrite, "shop", true)
	check("a viewer's project-bound token in its owner's grant", bound, identity.ScopeServicesWrite, "shop", true)
	if _, err := tokens.SetRoles(ctx, "dev", nil, nil); err != nil {
		t.Fatal(err)
	}
	check("the token of a user without roles", wide, identity.ScopeServicesRead, "shop", false)
	check("the project-bound token of a user without roles", bound, identity.ScopeServicesRead, "shop", false)
	if _, err := tokens.Authenticate(ctx, orphan); err != identity.ErrUnauthenticated {
		t.Errorf("a token whose owner is gone: %v; want ErrUnauthenticated", err)
	}
}

// TestParallelGuessesCountAsFailures: attempts for one name still being verified count as
// failures, so a burst of parallel guesses is admitted no further than the same guesses one
// after another (LoginFailuresFree), and the rest are refused before verifying.
func TestParallelGuessesCountAsFailures(t *testing.T) {
	ctx := t.Context()
	const burst = 3 * identity.LoginFailuresFree
	entered := make(chan struct{}, burst)
	release := make(chan struct{})
	tokens, _, _ := newUsers(t, identity.WithLoginConcurrency(burst),
		identity.WithVerifyHookForTest(func(context.Context) {
			entered <- struct{}{}
			<-release
		}))
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "dave", Kind: identity.KindHuman, Roles: []identity.Role{identity.RoleViewer}, Password: goodPassword}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, burst)
	for range burst {
		go func() {
			_, err := tokens.Login(ctx, "dave", "wrong password wrong password", 0)
			errs <- err
		}()
	}
	// Every attempt either holds a verification or was refused; none is left undecided.
	verifying, refused := 0, 0
	deadline := time.After(time.Minute)
	for verifying+refused < burst {
		select {
		case <-entered:
			verifying++
		case err := <-errs:
			if !errors.Is(err, identity.ErrLoginBackoff) {
				t.Fatalf("an attempt ended before the held ones were released: %v; want ErrLoginBackoff", err)
			}
			refused++
		case <-deadline:
			t.Fatalf("after a minute %d attempts verify and %d were refused, of %d", verifying, refused, burst)
		}
	}
	close(release)
	for range verifying {
		if err := <-errs; err != identity.ErrUnauthenticated {
			t.Fatalf("a released guess: %v; want ErrUnauthenticated", err)
		}
	}
	if verifying != identity.LoginFailuresFree {
		t.Fatalf("%d of %d parallel guesses for one name were verified; want %d, as many as sequential guesses get before the backoff",
			verifying, burst, identity.LoginFailuresFree)
	}
}
