package api

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/identity"
)

const testPassword = "a long enough test password"

// identityFixture is an API fixture whose identity store runs on the fixture's settable
// clock with cheap argon2id parameters.
func identityFixture(t *testing.T) *fixture {
	t.Helper()
	clk := &fakeClock{t: time.Now()}
	f := newFixtureWith(t, func(c *Config) {
		c.Tokens = testTokens(storeOf(c), identity.WithClock(clk.now))
	})
	f.clock = clk
	return f
}

func (f *fixture) as(token, method, path string, body any) (int, map[string]any) {
	f.t.Helper()
	var raw []byte
	ctype := ""
	if body != nil {
		raw, _ = json.Marshal(body)
		ctype = "application/json"
	}
	return f.do(req{method: method, path: path, ctype: ctype, token: token, body: raw})
}

func (f *fixture) login(name, password string) string {
	f.t.Helper()
	code, out := f.as("", "POST", "/api/v1/login", map[string]any{"name": name, "password": password})
	if code != 200 {
		f.t.Fatalf("login %s: %d %v", name, code, out)
	}
	tok, _ := out["token"].(string)
	if !strings.HasPrefix(tok, identity.PrefixSession) {
		f.t.Fatalf("login %s answered no session token: %v", name, out)
	}
	return tok
}

func wantCode(t *testing.T, what string, code int, out map[string]any, status int, c string) {
	t.Helper()
	if code != status || out["code"] != c {
		t.Fatalf("%s: %d %v; want %d %s", what, code, out, status, c)
	}
}

// TestIdentityDeployTokenBounds: a human logs in, creates a deploy token for one service,
// deploys with it, is refused on another service and another project, revokes it, and the next
// request fails.
func TestIdentityDeployTokenBounds(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "ops", "kind": "human", "roles": []string{"operator"}, "password": testPassword})
	if code != 201 || out["password"] != nil || out["verifier"] != nil || out["generation"] != float64(1) {
		t.Fatalf("create user: %d %v", code, out)
	}
	ops := f.login("ops", testPassword)
	bundle := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	for _, p := range []string{"shop", "other"} {
		if code, out := f.as(ops, "PUT", "/api/v1/projects/"+p, nil); code != 201 {
			t.Fatalf("create project %s: %d %v", p, code, out)
		}
		if code, out := f.do(req{method: "POST", path: "/api/v1/projects/" + p + "/bundles?name=app", ctype: "application/gzip", token: ops, body: bundle}); code != 201 {
			t.Fatalf("push bundle: %d %v", code, out)
		}
	}
	svc := map[string]any{"bundle": "app", "command": []string{"./app"}}
	for _, p := range []string{"shop/db", "other/web"} {
		if code, out := f.as(ops, "PUT", "/api/v1/projects/"+strings.Replace(p, "/", "/services/", 1), svc); code != 201 {
			t.Fatalf("create %s: %d %v", p, code, out)
		}
	}

	// A human-only scope on a machine token is refused by name.
	code, out = f.as(ops, "POST", "/api/v1/tokens", map[string]any{"name": "bad", "scopes": []string{"node:fence_ack"}})
	wantCode(t, "machine token with node:fence_ack", code, out, 422, "scope_human_only")
	// A caller cannot hand out more than it holds.
	code, out = f.as(ops, "POST", "/api/v1/tokens", map[string]any{"name": "esc", "scopes": []string{"admin"}})
	wantCode(t, "operator creating an admin token", code, out, 403, "forbidden")
	if d, _ := out["detail"].(string); !strings.Contains(d, "admin") {
		t.Errorf("operator creating an admin token: detail %q; want it to name the scope it lacks", d)
	}
	// A route's 403 names the scope it needs: an operator session listing modules.
	code, out = f.as(ops, "GET", "/api/v1/modules", nil)
	wantCode(t, "operator listing modules", code, out, 403, "forbidden")
	if d, _ := out["detail"].(string); d != "this request needs scope admin; the credential does not hold it there" {
		t.Errorf("operator listing modules: detail %q; want it to name scope admin", d)
	}
	// Expiry beyond one year.
	code, out = f.as(ops, "POST", "/api/v1/tokens", map[string]any{"name": "long", "scopes": []string{"service:deploy"}, "project": "shop", "expires_in_seconds": 366 * 86400})
	wantCode(t, "token for 366 days", code, out, 422, "validation_failed")

	// A machine token cannot create one that outlives it.
	code, out = f.as(f.admin, "POST", "/api/v1/tokens", map[string]any{"name": "minter", "scopes": []string{"services:read", "tokens:write"}, "expires_in_seconds": 3600})
	if code != 201 {
		t.Fatalf("create minter: %d %v", code, out)
	}
	minter, _ := out["token"].(string)
	code, out = f.as(minter, "POST", "/api/v1/tokens", map[string]any{"name": "child", "scopes": []string{"services:read"}, "expires_in_seconds": 7200})
	wantCode(t, "a child outliving its machine creator", code, out, 422, "validation_failed")
	if code, out := f.as(minter, "POST", "/api/v1/tokens", map[string]any{"name": "child", "scopes": []string{"services:read"}, "expires_in_seconds": 600}); code != 201 {
		t.Fatalf("a shorter child: %d %v", code, out)
	}
	code, out = f.as(ops, "POST", "/api/v1/tokens", map[string]any{"name": "ci-deploy", "scopes": []string{"service:deploy"}, "project": "shop", "service": "web", "expires_in_seconds": 90 * 86400})
	if code != 201 {
		t.Fatalf("create deploy token: %d %v", code, out)
	}
	ci, _ := out["token"].(string)
	bundle2 := tarGz(t, &tar.Header{Name: "app2", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app2", ctype: "application/gzip", token: ci, body: bundle2}); code != 201 {
		t.Fatalf("deploy token pushes a bundle into its project: %d %v", code, out)
	}
	if code, out := f.as(ci, "PUT", "/api/v1/projects/shop/services/web", svc); code != 201 {
		t.Fatalf("deploy token applies its service: %d %v", code, out)
	}
	if code, out := f.as(ci, "GET", "/api/v1/projects/shop/services/web", nil); code != 200 {
		t.Fatalf("deploy token reads its service: %d %v", code, out)
	}
	for _, c := range []struct{ method, path string }{
		{"PUT", "/api/v1/projects/shop/services/db"},
		{"DELETE", "/api/v1/projects/shop/services/web"},
		{"GET", "/api/v1/projects/shop/services/db"},
		{"GET", "/api/v1/projects/other/services"},
		{"GET", "/api/v1/projects/other/services/web"},
		{"PUT", "/api/v1/projects/other/services/web"},
		{"GET", "/api/v1/projects/shop/services"},
		{"GET", "/api/v1/projects"},
		{"GET", "/api/v1/workloads"},
		{"GET", "/api/v1/dns-records"},
		{"GET", "/api/v1/nodes"},
		{"PUT", "/api/v1/projects/shop"},
		{"GET", "/api/v1/tokens"},
	} {
		var body any
		if c.method == "PUT" {
			body = svc
		}
		code, out := f.as(ci, c.method, c.path, body)
		wantCode(t, "deploy token on "+c.method+" "+c.path, code, out, 403, "forbidden")
		// The detail names the scope the route needs and where it was asked, and nothing
		// about the credential or whether the object exists.
		detail, _ := out["detail"].(string)
		if !strings.HasPrefix(detail, "this request needs scope ") {
			t.Errorf("deploy token on %s %s: detail %q; want the scope the route needs", c.method, c.path, detail)
		}
		if p, _, _ := strings.Cut(strings.TrimPrefix(c.path, "/api/v1/projects/"), "/"); strings.HasPrefix(c.path, "/api/v1/projects/") && !strings.Contains(detail, p) {
			t.Errorf("deploy token on %s %s: detail %q; want it to name project %s", c.method, c.path, detail, p)
		}
	}

	// The list shows the token's bounds and never a secret.
	code, out = f.as(ops, "GET", "/api/v1/tokens", nil)
	raw, _ := json.Marshal(out)
	if code != 200 || !strings.Contains(string(raw), `"name":"ci-deploy"`) || !strings.Contains(string(raw), `"service":"web"`) ||
		strings.Contains(string(raw), ci) || strings.Contains(string(raw), identity.Digest(ci)) || !strings.Contains(string(raw), "last_used_at") {
		t.Fatalf("token list: %d %s", code, raw)
	}

	// Rotation: the old secret fails on the very next request.
	code, out = f.as(ops, "POST", "/api/v1/tokens/ci-deploy/rotate", nil)
	if code != 200 {
		t.Fatalf("rotate: %d %v", code, out)
	}
	ci2, _ := out["token"].(string)
	code, out = f.as(ci, "GET", "/api/v1/projects/shop/services/web", nil)
	wantCode(t, "rotated-out token", code, out, 401, "unauthenticated")
	if code, out := f.as(ci2, "GET", "/api/v1/projects/shop/services/web", nil); code != 200 {
		t.Fatalf("rotated token: %d %v", code, out)
	}
	if code, out := f.as(ops, "DELETE", "/api/v1/tokens/ci-deploy", nil); code != 204 {
		t.Fatalf("revoke: %d %v", code, out)
	}
	code, out = f.as(ci2, "GET", "/api/v1/projects/shop/services/web", nil)
	wantCode(t, "revoked token", code, out, 401, "unauthenticated")

	// The change log names the actor of each change, never a secret.
	code, out = f.as(f.admin, "GET", "/api/v1/changelog", nil)
	raw, _ = json.Marshal(out)
	if code != 200 || !strings.Contains(string(raw), "user:ops") || !strings.Contains(string(raw), "token:ci-deploy") || strings.Contains(string(raw), ci2[4:]) {
		t.Fatalf("change log actors: %d %s", code, raw)
	}
}

// TestIdentityAttacks: login answers do not tell unknown users from wrong passwords, bearers
// in URLs are refused, a session dies with its generation, and sensitive actions need a recent
// login.
func TestIdentityAttacks(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	if code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "ann", "roles": []string{"admin"}, "password": testPassword}); code != 201 {
		t.Fatalf("create user: %d %v", code, out)
	}
	code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "shorty", "password": "short"})
	wantCode(t, "short password", code, out, 422, "password_policy")
	code, out = f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "Bad:Name", "password": testPassword})
	wantCode(t, "bad user name", code, out, 422, "validation_failed")

	c1, wrong := f.as("", "POST", "/api/v1/login", map[string]any{"name": "ann", "password": "not the password at all"})
	c2, unknown := f.as("", "POST", "/api/v1/login", map[string]any{"name": "nobody", "password": testPassword})
	if c1 != 401 || c2 != 401 || wrong["code"] != "unauthenticated" || wrong["detail"] != unknown["detail"] || wrong["code"] != unknown["code"] {
		t.Fatalf("wrong password %d %v vs unknown user %d %v: want the same 401", c1, wrong, c2, unknown)
	}

	ann := f.login("ann", testPassword)
	for _, path := range []string{"/api/v1/projects?token=" + f.admin, "/api/v1/projects?access_token=x", "/api/v1/projects?q=" + ann, "/api/v1/login?password=x"} {
		code, out := f.do(req{method: "GET", path: path, token: ann})
		wantCode(t, "credential in "+path, code, out, 400, "credential_in_url")
	}
	if code, out := f.as(ann, "GET", "/api/v1/projects", nil); code != 200 {
		t.Fatalf("session: %d %v", code, out)
	}

	// Sensitive actions need a login within 5 minutes.
	f.clock.add(6 * time.Minute)
	code, out = f.as(ann, "DELETE", "/api/v1/nodes/nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP", nil)
	wantCode(t, "node removal by an old login", code, out, 401, "reauthentication_required")
	code, out = f.as(ann, "POST", "/api/v1/users/ann/credential", map[string]any{"op": "rotate_password", "password": "the next long enough password"})
	wantCode(t, "password rotation by an old login", code, out, 401, "reauthentication_required")
	code, out = f.as(ann, "POST", "/api/v1/tokens", map[string]any{"name": "for-bob", "owner": "ann2", "scopes": []string{"services:read"}})
	if code == 201 {
		t.Fatalf("a token for another owner by an old login: %d %v", code, out)
	}
	if code, out := f.as(ann, "GET", "/api/v1/projects", nil); code != 200 {
		t.Fatalf("an ordinary read by an old login: %d %v", code, out)
	}

	// A fresh login rotates the password; the session of generation 1 dies at once.
	ann2 := f.login("ann", testPassword)
	code, out = f.as(ann2, "POST", "/api/v1/users/ann/credential", map[string]any{"op": "rotate_password", "expected_generation": 1, "password": "the next long enough password"})
	if code != 200 || out["generation"] != float64(2) {
		t.Fatalf("rotate: %d %v", code, out)
	}
	for _, tok := range []string{ann, ann2} {
		code, out := f.as(tok, "GET", "/api/v1/projects", nil)
		wantCode(t, "generation-1 session after the rotation", code, out, 401, "unauthenticated")
	}
	ann3 := f.login("ann", "the next long enough password")
	if code, out := f.as(ann3, "POST", "/api/v1/logout", nil); code != 204 {
		t.Fatalf("logout: %d %v", code, out)
	}
	code, out = f.as(ann3, "GET", "/api/v1/projects", nil)
	wantCode(t, "session after logout", code, out, 401, "unauthenticated")

	// Roles change on the next request: a viewer cannot write, then an operator grant on one
	// project lets it write there only.
	if code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "vera", "roles": []string{"viewer"}, "password": testPassword}); code != 201 {
		t.Fatalf("create vera: %d %v", code, out)
	}
	vera := f.login("vera", testPassword)
	code, out = f.as(vera, "PUT", "/api/v1/projects/shop", nil)
	wantCode(t, "viewer writing", code, out, 403, "forbidden")
	code, out = f.as(f.admin, "PUT", "/api/v1/users/vera/roles", map[string]any{"roles": []string{"viewer"}, "grants": []map[string]string{{"project": "shop", "role": "operator"}}})
	if code != 200 {
		t.Fatalf("set roles: %d %v", code, out)
	}
	if code, out := f.as(vera, "PUT", "/api/v1/projects/shop", nil); code != 201 {
		t.Fatalf("operator grant on shop: %d %v", code, out)
	}
	code, out = f.as(vera, "PUT", "/api/v1/projects/other", nil)
	wantCode(t, "operator grant outside its project", code, out, 403, "forbidden")
	code, out = f.as(f.admin, "PUT", "/api/v1/users/vera/roles", map[string]any{"roles": []string{"root"}})
	wantCode(t, "unknown role", code, out, 422, "validation_failed")

	// The bootstrap token is the token named bootstrap.
	code, out = f.as(f.admin, "GET", "/api/v1/tokens", nil)
	raw, _ := json.Marshal(out)
	if code != 200 || !strings.Contains(string(raw), `"name":"bootstrap"`) {
		t.Fatalf("token list lacks bootstrap: %d %s", code, raw)
	}
}

// TestChangeLogActorAndIdempotencyKey: a change made with a machine token carries the token's
// name as actor and the request's Idempotency-Key on its change-log entry; identity operations
// are audited without their secrets.
func TestChangeLogActorAndIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	code, out := f.as(f.admin, "POST", "/api/v1/tokens", map[string]any{"name": "ci", "scopes": []string{"services:write"}})
	if code != 201 {
		t.Fatalf("create token: %d %v", code, out)
	}
	ci, _ := out["token"].(string)
	hr, _ := http.NewRequest("PUT", f.srv.URL+"/api/v1/projects/shop", nil)
	hr.Header.Set("Authorization", "Bearer "+ci)
	hr.Header.Set("Idempotency-Key", "key-0001")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create project: %d", resp.StatusCode)
	}
	code, out = f.as(f.admin, "GET", "/api/v1/changelog", nil)
	if code != 200 {
		t.Fatalf("changelog: %d %v", code, out)
	}
	entries, _ := out["entries"].([]any)
	var project, token map[string]any
	for _, e := range entries {
		m, _ := e.(map[string]any)
		switch m["entity_type"] {
		case "project":
			project = m
		case "token":
			token = m
		}
	}
	if project == nil || project["actor_id"] != "token:ci" || project["idempotency_key"] != "key-0001" {
		t.Fatalf("project entry %v: want actor token:ci and idempotency_key key-0001", project)
	}
	raw, _ := json.Marshal(token)
	if token == nil || token["actor_id"] != "token:bootstrap" || strings.Contains(string(raw), ci) || strings.Contains(string(raw), identity.Digest(ci)) {
		t.Fatalf("token entry %s: want actor token:bootstrap and no secret", raw)
	}
}

// TestIdentityChangesHandedOverOnce: every identity operation made through the API has exactly
// one change-log entry once it answers, in the order made, by its caller, with the request's
// Idempotency-Key and the action only; a refused operation has none, and no written document
// keeps a pending change.
func TestIdentityChangesHandedOverOnce(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	steps := []struct {
		method, path string
		body         any
		status       int
	}{
		{"POST", "/api/v1/users", map[string]any{"name": "dora", "password": "correct horse battery staple"}, 201},
		{"POST", "/api/v1/users", map[string]any{"name": "dora"}, 409}, // refused: name taken
		{"PUT", "/api/v1/users/dora/roles", map[string]any{"roles": []string{"operator"}}, 200},
		{"POST", "/api/v1/users/dora/credential", map[string]any{"op": "revoke_sessions", "expected_generation": 7}, 409}, // refused: stale
		{"POST", "/api/v1/users/dora/credential", map[string]any{"op": "revoke_sessions"}, 200},
		{"POST", "/api/v1/tokens", map[string]any{"name": "ci", "scopes": []string{"services:read"}}, 201},
		{"POST", "/api/v1/tokens/ci/rotate", nil, 200},
		{"DELETE", "/api/v1/tokens/ci", nil, 204},
		{"DELETE", "/api/v1/tokens/ci", nil, 404}, // refused: gone
	}
	var secrets []string
	for i, st := range steps {
		var raw []byte
		if st.body != nil {
			raw, _ = json.Marshal(st.body)
		}
		hr, _ := http.NewRequest(st.method, f.srv.URL+st.path, strings.NewReader(string(raw)))
		hr.Header.Set("Authorization", "Bearer "+f.admin)
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("Idempotency-Key", fmt.Sprintf("key-%04d", i))
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != st.status {
			t.Fatalf("%s %s: %d %v; want %d", st.method, st.path, resp.StatusCode, out, st.status)
		}
		if tok, ok := out["token"].(string); ok {
			secrets = append(secrets, tok, identity.Digest(tok))
		}
	}
	code, out := f.as(f.admin, "GET", "/api/v1/changelog", nil)
	if code != 200 {
		t.Fatalf("changelog: %d %v", code, out)
	}
	type seen struct{ entityType, entityID, op, action, key string }
	want := []seen{
		{"user", "dora", "create", "create user", "key-0000"},
		{"user", "dora", "update", "set roles", "key-0002"},
		{"user", "dora", "update", "credential revoke_sessions", "key-0004"},
		{"token", "ci", "create", "create token", "key-0005"},
		{"token", "ci", "update", "rotate token", "key-0006"},
		{"token", "ci", "update", "revoke token", "key-0007"},
	}
	var got []seen
	entries, _ := out["entries"].([]any)
	for _, e := range entries {
		m, _ := e.(map[string]any)
		if m["entity_type"] != "user" && m["entity_type"] != "token" {
			continue
		}
		raw, _ := json.Marshal(m)
		for _, sec := range append(secrets, "correct horse battery staple") {
			if strings.Contains(string(raw), sec) {
				t.Fatalf("entry %s holds a secret", raw)
			}
		}
		if m["actor_id"] != "token:bootstrap" {
			t.Fatalf("entry %s: want actor token:bootstrap", raw)
		}
		p, _ := m["payload"].(map[string]any)
		a, _ := p["action"].(string)
		k, _ := m["idempotency_key"].(string)
		got = append(got, seen{m["entity_type"].(string), m["entity_id"].(string), m["op"].(string), a, k})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("identity entries %v; want %v", got, want)
	}
	f.changelogCleared()
	for _, coll := range []string{identity.UsersCollection, identity.TokensCollection, identity.TokenNamesCollection} {
		n, err := f.st.Collection(coll).CountDocuments(context.Background(), bson.M{"log_outbox.0": bson.M{"$exists": true}})
		if err != nil || n != 0 {
			t.Fatalf("%s documents with a pending change: %d, %v; want none", coll, n, err)
		}
	}
}
