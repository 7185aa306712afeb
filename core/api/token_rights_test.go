package api

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/identity"
)

// mkToken creates a machine token as who and returns its secret.
func (f *fixture) mkToken(who, name string, body map[string]any) string {
	f.t.Helper()
	body["name"] = name
	code, out := f.as(who, "POST", "/api/v1/tokens", body)
	if code != 201 {
		f.t.Fatalf("create token %s: %d %v", name, code, out)
	}
	tok, _ := out["token"].(string)
	return tok
}

// TestTokenRotationNeedsCreationRights: rotating or revoking a token takes every right creating
// it would take. A token holding tokens:write alone, a project-bound token and a machine token
// holding admin may neither rotate nor revoke a wider token of the same owner (the bootstrap
// token included), and get no secret; a wider token still rotates a narrower one;
// another owner's token needs admin and a recent login. Rotating bootstrap rewrites
// DATA/admin-token with the new secret. Before, tokens:write alone rotated bootstrap and got
// the admin secret, and the file kept the dead one.
func TestTokenRotationNeedsCreationRights(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	if created, err := f.api.cfg.Tokens.BootstrapAdmin(context.Background(), "root", testPassword); err != nil || !created {
		t.Fatalf("bootstrap admin: %v %v", created, err)
	}
	root := f.login("root", testPassword)
	minter := f.mkToken(root, "minter", map[string]any{"scopes": []string{"tokens:write"}})
	wide := f.mkToken(root, "wide", map[string]any{"scopes": []string{"services:write", "tokens:write"}})
	shopMinter := f.mkToken(root, "shop-minter", map[string]any{"scopes": []string{"services:write", "tokens:write"}, "project": "shop"})
	f.mkToken(root, "shop-web", map[string]any{"scopes": []string{"service:deploy"}, "project": "shop", "service": "web"})
	robot := f.mkToken(root, "robot", map[string]any{"scopes": []string{"admin"}})

	for _, c := range []struct{ what, caller, target string }{
		{"tokens:write alone on bootstrap", minter, identity.BootstrapTokenName},
		{"tokens:write alone on a wider token", minter, "wide"},
		{"a project-bound token on an unbounded one", shopMinter, "wide"},
		{"a machine token holding admin on bootstrap (human-only scopes)", robot, identity.BootstrapTokenName},
	} {
		code, out := f.as(c.caller, "POST", "/api/v1/tokens/"+c.target+"/rotate", nil)
		wantCode(t, "rotate: "+c.what, code, out, 403, "forbidden")
		if out["token"] != nil {
			t.Fatalf("rotate: %s: answered a secret: %v", c.what, out)
		}
		code, out = f.as(c.caller, "DELETE", "/api/v1/tokens/"+c.target, nil)
		wantCode(t, "revoke: "+c.what, code, out, 403, "forbidden")
	}
	if code, out := f.as(f.admin, "GET", "/api/v1/tokens", nil); code != 200 {
		t.Fatalf("the bootstrap token after the refused attempts: %d %v", code, out)
	}
	// A token holding every scope of a narrower one still manages it.
	if code, out := f.as(wide, "POST", "/api/v1/tokens/shop-web/rotate", nil); code != 200 {
		t.Fatalf("a wider token rotating a narrower one: %d %v", code, out)
	}

	// Another owner's token: admin and a login within 5 minutes.
	if code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "dev", "roles": []string{"operator"}, "password": testPassword}); code != 201 {
		t.Fatalf("create dev: %d %v", code, out)
	}
	f.mkToken(f.login("dev", testPassword), "dev-ci", map[string]any{"scopes": []string{"services:read"}})
	f.clock.add(6 * time.Minute)
	code, out := f.as(root, "POST", "/api/v1/tokens/dev-ci/rotate", nil)
	wantCode(t, "rotating another owner's token by an old login", code, out, 401, "reauthentication_required")
	code, out = f.as(root, "DELETE", "/api/v1/tokens/dev-ci", nil)
	wantCode(t, "revoking another owner's token by an old login", code, out, 401, "reauthentication_required")
	root = f.login("root", testPassword)
	if code, out := f.as(root, "POST", "/api/v1/tokens/dev-ci/rotate", nil); code != 200 {
		t.Fatalf("an admin's fresh login rotating another owner's token: %d %v", code, out)
	}

	// The owner rotates bootstrap: the new secret is answered and written to DATA/admin-token.
	code, out = f.as(root, "POST", "/api/v1/tokens/bootstrap/rotate", nil)
	if code != 200 {
		t.Fatalf("root rotating bootstrap: %d %v", code, out)
	}
	next, _ := out["token"].(string)
	path := filepath.Join(f.dir, identity.AdminTokenFile)
	if out["admin_token_file"] != path {
		t.Errorf("rotate bootstrap: answer %v; want admin_token_file %q", out, path)
	}
	raw, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(raw)) != next {
		t.Fatalf("DATA/admin-token after the rotation: %q %v; want the new secret", raw, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("DATA/admin-token mode: %v %v; want 0600", fi.Mode(), err)
	}
	code, out = f.as(f.admin, "GET", "/api/v1/tokens", nil)
	wantCode(t, "the rotated-out bootstrap secret", code, out, 401, "unauthenticated")
	if code, out := f.as(next, "GET", "/api/v1/tokens", nil); code != 200 {
		t.Fatalf("the new bootstrap secret: %d %v", code, out)
	}
}

// TestTokenNarrowedByOwnerRoles: a token acts with the scopes it holds that its owner's roles
// also give now, from the next request: emptied roles leave its services:write token unable to
// write or read, an operator grant on one project lets it write there only, and restored roles
// restore it. Before, the token kept writing after its owner lost every role.
func TestTokenNarrowedByOwnerRoles(t *testing.T) {
	t.Parallel()
	f := identityFixture(t)
	if code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "dev", "roles": []string{"operator"}, "password": testPassword}); code != 201 {
		t.Fatalf("create dev: %d %v", code, out)
	}
	dev := f.login("dev", testPassword)
	ci := f.mkToken(dev, "dev-ci", map[string]any{"scopes": []string{"services:write", "tokens:write"}})
	shop := f.mkToken(dev, "dev-shop", map[string]any{"scopes": []string{"services:write"}, "project": "shop"})
	if code, out := f.as(ci, "PUT", "/api/v1/projects/shop", nil); code != 201 {
		t.Fatalf("the token writing while its owner is an operator: %d %v", code, out)
	}
	setRoles := func(body map[string]any) {
		t.Helper()
		if code, out := f.as(f.admin, "PUT", "/api/v1/users/dev/roles", body); code != 200 {
			t.Fatalf("set roles %v: %d %v", body, code, out)
		}
	}
	setRoles(map[string]any{"roles": []string{}})
	for _, c := range []struct{ method, path string }{
		{"PUT", "/api/v1/projects/other"},
		{"GET", "/api/v1/projects"},
		{"GET", "/api/v1/projects/shop"},
		{"GET", "/api/v1/tokens"},
	} {
		code, out := f.as(ci, c.method, c.path, nil)
		wantCode(t, "the token of a user without roles on "+c.method+" "+c.path, code, out, 403, "forbidden")
	}
	code, out := f.as(ci, "POST", "/api/v1/tokens", map[string]any{"name": "child", "scopes": []string{"services:read"}})
	wantCode(t, "the token of a user without roles minting", code, out, 403, "forbidden")
	if code, out := f.as(ci, "GET", "/api/v1/whoami", nil); code != 200 || len(asList(out["scopes"])) != 0 {
		t.Fatalf("whoami of the token of a user without roles: %d %v; want no scopes", code, out)
	}

	setRoles(map[string]any{"roles": []string{}, "grants": []map[string]string{{"project": "shop", "role": "operator"}}})
	if code, out := f.as(ci, "PUT", "/api/v1/projects/shop", nil); code != 200 {
		t.Fatalf("the token within its owner's grant: %d %v", code, out)
	}
	code, out = f.as(ci, "PUT", "/api/v1/projects/other", nil)
	wantCode(t, "the token outside its owner's grant", code, out, 403, "forbidden")
	// A project-bound token counts its owner's grant on that project.
	if code, out := f.as(shop, "GET", "/api/v1/projects/shop/services", nil); code != 200 {
		t.Fatalf("a project-bound token within its owner's grant: %d %v", code, out)
	}

	setRoles(map[string]any{"roles": []string{"viewer"}})
	if code, out := f.as(ci, "GET", "/api/v1/projects", nil); code != 200 {
		t.Fatalf("the token reading as its owner is a viewer: %d %v", code, out)
	}
	code, out = f.as(ci, "PUT", "/api/v1/projects/shop", nil)
	wantCode(t, "the token writing as its owner is a viewer", code, out, 403, "forbidden")

	setRoles(map[string]any{"roles": []string{"operator"}})
	if code, out := f.as(ci, "PUT", "/api/v1/projects/other", nil); code != 201 {
		t.Fatalf("the token once its owner is an operator again: %d %v", code, out)
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }
