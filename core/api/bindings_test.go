package api

import (
	"archive/tar"
	"fmt"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/operations"
)

// TestServiceBindingsDeclaredAtApply: an unknown kind or a repeated name is 422 with its code and
// writes nothing; a good declaration is kept on the service, makes pending bindings listed by
// GET /bindings with their apply operations, and an apply without them releases them; a delete of
// a binding the service still declares is 409.
func TestServiceBindingsDeclaredAtApply(t *testing.T) {
	t.Parallel()
	var q *operations.Queue
	f := newFixtureWith(t, func(c *Config) {
		st := storeOf(c)
		q = operations.NewQueue(st, operations.Config{})
		c.Bindings = bindings.New(bindings.Config{Store: st, Queue: q, Secrets: c.Secrets.Store})
	})
	opKind := func(id any) string {
		t.Helper()
		o, err := q.Get(t.Context(), fmt.Sprint(id))
		if err != nil {
			t.Fatalf("operation %v: %v", id, err)
		}
		return o.Kind
	}
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	apply := func(b any) (int, map[string]any) {
		return f.json("PUT", "/api/v1/projects/shop/services/web", map[string]any{"bundle": "app", "command": []string{"./app"}, "bindings": b})
	}
	for name, tc := range map[string]struct {
		bindings any
		code     string
	}{
		"unknown kind": {[]map[string]any{{"name": "db", "kind": "redis"}}, "binding_kind_unknown"},
		"name clash":   {[]map[string]any{{"name": "db", "kind": "postgres"}, {"name": "db", "kind": "s3"}}, "binding_name_clash"},
		"bad name":     {[]map[string]any{{"name": "Db_1", "kind": "postgres"}}, "binding_name_clash"},
	} {
		code, out := apply(tc.bindings)
		if code != 422 || out["code"] != tc.code {
			t.Errorf("%s: %d %v; want 422 %s", name, code, out, tc.code)
		}
	}
	if code, _ := f.json("GET", "/api/v1/projects/shop/services/web", nil); code != 404 {
		t.Fatalf("a refused apply wrote the service: %d", code)
	}
	code, out := apply([]map[string]any{{"name": "db", "kind": "postgres"}, {"name": "files", "kind": "s3"}})
	if code != 201 || fmt.Sprint(out["bindings"]) != "[map[kind:postgres name:db] map[kind:s3 name:files]]" {
		t.Fatalf("apply: %d %v", code, out)
	}
	code, out = f.json("GET", "/api/v1/projects/shop/bindings?service=web", nil)
	items, _ := out["items"].([]any)
	if code != 200 || len(items) != 2 {
		t.Fatalf("list bindings: %d %v", code, out)
	}
	for _, it := range items {
		b := it.(map[string]any)
		if b["state"] != bindings.StatePending || opKind(b["operation_id"]) != bindings.KindApply {
			t.Fatalf("binding %v: want pending with an apply operation", b)
		}
	}
	if code, out := f.json("DELETE", "/api/v1/projects/shop/services/web/bindings/db?purge=true", nil); code != 409 {
		t.Fatalf("purge of a declared binding: %d %v; want 409", code, out)
	}
	// Dropped from the spec: released (data kept), and then a purge may follow.
	if code, out := apply([]map[string]any{{"name": "files", "kind": "s3"}}); code != 200 {
		t.Fatalf("apply without db: %d %v", code, out)
	}
	code, out = f.json("GET", "/api/v1/projects/shop/bindings?service=web", nil)
	if code != 200 || !strings.Contains(fmt.Sprint(out), "state:released") {
		t.Fatalf("after dropping db: %d %v; want it released", code, out)
	}
	code, out = f.json("DELETE", "/api/v1/projects/shop/services/web/bindings/db?purge=true", nil)
	if code != 202 || out["state"] != bindings.StateReleased {
		t.Fatalf("purge: %d %v", code, out)
	}
	if k := opKind(out["operation_id"]); k != bindings.KindPurge {
		t.Fatalf("operation after purge: %s; want %s", k, bindings.KindPurge)
	}
}

// TestBindingsRefusedWithoutCorestore: a berthd without the corestore plugin refuses bindings.
func TestBindingsRefusedWithoutCorestore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	code, out := f.json("PUT", "/api/v1/projects/shop/services/web", map[string]any{"bundle": "app", "command": []string{"./app"},
		"bindings": []map[string]any{{"name": "db", "kind": "postgres"}}})
	if code != 422 || out["code"] != "binding_kind_unknown" {
		t.Fatalf("%d %v; want 422 binding_kind_unknown", code, out)
	}
	// The binding routes say why there is nothing, instead of a 404 for the route.
	code, out = f.do(req{method: "GET", path: "/api/v1/projects/shop/bindings", token: f.admin})
	if code != 503 || out["code"] != "unavailable" || !strings.Contains(fmt.Sprint(out["detail"]), "no corestore provider") {
		t.Fatalf("GET bindings: %d %v; want 503 unavailable naming the missing corestore provider", code, out)
	}
}
