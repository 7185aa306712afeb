package api

import (
	"archive/tar"
	"fmt"
	"strings"
	"testing"
)

// TestSecretReferencesNeedSecretUse: a deploy token bound to one service may roll a new release
// of it with the references the operator gave it, but not make it reference another secret of
// the project (directly, through a set, as a file or as registry credentials, or by undoing to a
// revision that did): 403 secret_use_forbidden naming the secret, before anything is read or
// written. A token that also holds secret:use may.
func TestSecretReferencesNeedSecretUse(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, n := range []string{"db", "stripe-key", "other"} {
		if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/"+n, map[string]any{"value": "v-" + n}); code != 201 {
			t.Fatalf("put %s: %d %v", n, code, out)
		}
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/secret-sets/payments", map[string]any{"secrets": map[string]any{"STRIPE_KEY": "stripe-key"}}); code != 201 {
		t.Fatalf("put set: %d %v", code, out)
	}
	for _, name := range []string{"v1", "v2"} {
		b := tarGz(t, &tar.Header{Name: "app-" + name, Typeflag: tar.TypeReg, Mode: 0o755})
		if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=" + name, ctype: "application/gzip", token: f.admin, body: b}); code != 201 {
			t.Fatalf("push bundle: %d %v", code, out)
		}
	}
	tok := func(name string, scopes ...string) string {
		t.Helper()
		code, out := f.json("POST", "/api/v1/tokens", map[string]any{"name": name, "scopes": scopes, "project": "shop", "service": "api"})
		if code != 201 {
			t.Fatalf("token %s: %d %v", name, code, out)
		}
		return out["token"].(string)
	}
	deploy := tok("ci-deploy", "service:deploy")
	granted := map[string]any{"DB_URL": "db"}
	spec := func(bundle string, secrets map[string]any, extra ...any) map[string]any {
		s := map[string]any{"bundle": bundle, "command": []string{"./app"}, "secrets": secrets}
		for i := 0; i+1 < len(extra); i += 2 {
			s[extra[i].(string)] = extra[i+1]
		}
		return s
	}
	// The operator gives the service its secret.
	if code, out := f.json("PUT", "/api/v1/projects/shop/services/api", spec("v1", granted)); code != 201 {
		t.Fatalf("operator apply: %d %v", code, out)
	}
	// The deploy token rolls a new release with the same references.
	code, out := f.as(deploy, "PUT", "/api/v1/projects/shop/services/api", spec("v2", granted))
	if code != 200 || out["changed"] != true {
		t.Fatalf("deploy with unchanged references: %d %v", code, out)
	}
	rev := out["revision"]
	for name, tc := range map[string]struct {
		spec   map[string]any
		secret string
	}{
		"another secret":        {spec("v2", map[string]any{"DB_URL": "db", "LEAK": "other"}), "other"},
		"another secret a file": {spec("v2", map[string]any{"DB_URL": "db", "LEAK": map[string]any{"secret": "other", "as": "file"}}), "other"},
		"a key moved":           {spec("v2", map[string]any{"DB_URL": "other"}), "other"},
		"registry credentials":  {spec("v2", map[string]any{"DB_URL": "db", "evil.example": map[string]any{"secret": "db", "as": "registry"}}), "db"},
		"another version":       {spec("v2", map[string]any{"DB_URL": map[string]any{"secret": "db", "version": 1}}), "db"},
		"a set":                 {spec("v2", granted, "secret_sets", []string{"payments"}), "payments"},
		"a secret that is not":  {spec("v2", map[string]any{"DB_URL": "db", "X": "ghost"}), "ghost"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := f.as(deploy, "PUT", "/api/v1/projects/shop/services/api", tc.spec)
			if code != 403 || out["code"] != "secret_use_forbidden" || !strings.Contains(fmt.Sprint(out["detail"]), tc.secret) {
				t.Fatalf("%d %v; want 403 secret_use_forbidden naming %s", code, out, tc.secret)
			}
		})
	}
	if code, out := f.json("GET", "/api/v1/projects/shop/services/api", nil); code != 200 || out["revision"] != rev || fmt.Sprint(out["secrets"]) != "map[DB_URL:db]" {
		t.Fatalf("a refused apply changed the service: %d %v", code, out)
	}
	// A token holding secret:use may add the reference.
	user := tok("ci-secrets", "service:deploy", "secret:use")
	if code, out := f.as(user, "PUT", "/api/v1/projects/shop/services/api", spec("v2", map[string]any{"DB_URL": "db", "MORE": "other"})); code != 200 || out["changed"] != true {
		t.Fatalf("secret:use adds a reference: %d %v", code, out)
	}
	// Dropping a reference needs nothing; undoing back to it does.
	if code, out := f.as(deploy, "PUT", "/api/v1/projects/shop/services/api", spec("v1", granted)); code != 200 {
		t.Fatalf("deploy dropping a reference: %d %v", code, out)
	}
	if code, out := f.as(deploy, "POST", "/api/v1/projects/shop/services/api/rollout/undo", nil); code != 403 || out["code"] != "secret_use_forbidden" || !strings.Contains(fmt.Sprint(out["detail"]), "other") {
		t.Fatalf("undo back to a reference: %d %v; want 403 naming other", code, out)
	}
	if code, out := f.as(user, "POST", "/api/v1/projects/shop/services/api/rollout/undo", nil); code != 200 {
		t.Fatalf("undo with secret:use: %d %v", code, out)
	}
	// secret:use is a scope a token creator must hold: a deploy token cannot mint it.
	if code, out := f.json("POST", "/api/v1/tokens", map[string]any{"name": "ops", "scopes": []string{"services:write", "tokens:write"}}); code != 201 {
		t.Fatalf("ops token: %d %v", code, out)
	} else if code, out := f.as(out["token"].(string), "POST", "/api/v1/tokens", map[string]any{"name": "wider", "scopes": []string{"secret:use"}}); code != 403 {
		t.Fatalf("a token without secret:use minted it: %d %v", code, out)
	}
}
