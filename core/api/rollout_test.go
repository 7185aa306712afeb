package api

import (
	"archive/tar"
	"testing"
)

// TestRuntimeSpecEndpoints: the spec read and its compare-and-set write with named refusals,
// spec-owns-placement on service updates, the slot view, rollout undo and node retirement
// refusals (docs/reconciliation.md sections 1, 10 and 11).
func TestRuntimeSpecEndpoints(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, name := range []string{"app", "app2"} {
		body := tarGz(t, &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755})
		if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=" + name, ctype: "application/gzip", token: f.admin, body: body}); code != 201 {
			t.Fatalf("push bundle: %d %v", code, out)
		}
	}
	svc := map[string]any{"bundle": "app", "command": []string{"./app"}, "replicas": 2}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", svc); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	base := "/api/v1/projects/default/services/web"

	// Before any sweep decided, a new service is converging, not without a verdict.
	code, out := f.json("GET", base, nil)
	if v, _ := out["verdict"].(map[string]any); code != 200 || v["state"] != "converging" || v["spec_revision"].(float64) != 1 {
		t.Fatalf("verdict right after the apply: %d %v", code, out)
	}

	// The derived spec follows the service.
	code, out = f.json("GET", base+"/spec", nil)
	if code != 200 || out["source"] != "service" {
		t.Fatalf("get spec: %d %v", code, out)
	}
	spec := out["spec"].(map[string]any)
	if spec["revision"].(float64) != 1 || spec["replicas"].(map[string]any)["total"].(float64) != 2 {
		t.Fatalf("derived spec %v", spec)
	}

	// A number while no operator spec exists is a conflict; null is the first operator write.
	write := map[string]any{"expected_revision": 1, "spec": map[string]any{"replicas": map[string]any{"total": 3}}}
	if code, out := f.json("PUT", base+"/spec", write); code != 409 || out["code"] != "conflict" {
		t.Fatalf("numbered write over a derived spec: %d %v", code, out)
	}
	write["expected_revision"] = nil
	code, out = f.json("PUT", base+"/spec", write)
	if code != 200 || out["source"] != "operator" || out["spec"].(map[string]any)["revision"].(float64) != 2 {
		t.Fatalf("first operator write: %d %v", code, out)
	}
	// Named refusals of the values, and a stale revision.
	for _, tc := range []struct {
		body map[string]any
		code int
		want string
	}{
		{map[string]any{"expected_revision": 2, "spec": map[string]any{"placement": map[string]any{"mode": "pinned", "nodes": []string{"nod_nope"}}, "replicas": map[string]any{"per_node": 1}}}, 422, "spec_node_unknown"},
		{map[string]any{"expected_revision": 2, "spec": map[string]any{"replicas": map[string]any{"total": 999}}}, 422, "spec_replicas_invalid"},
		{map[string]any{"expected_revision": 2, "spec": map[string]any{"readiness": map[string]any{"kind": "http", "port": 9999}, "replicas": map[string]any{"total": 1}}}, 422, "spec_readiness_target_undeclared"},
		{map[string]any{"expected_revision": 1, "spec": map[string]any{"replicas": map[string]any{"total": 1}}}, 409, "conflict"},
		{map[string]any{"expected_revision": nil, "spec": map[string]any{"replicas": map[string]any{"total": 1}}}, 409, "conflict"},
	} {
		if code, out := f.json("PUT", base+"/spec", tc.body); code != tc.code || out["code"] != tc.want {
			t.Errorf("write %v: %d %v, want %d %s", tc.body, code, out, tc.code, tc.want)
		}
	}
	// The operator spec owns placement: a service update stating replicas is refused, one
	// leaving them out is accepted and keeps the spec.
	if code, out := f.json("PUT", base, svc); code != 409 || out["code"] != "spec_owns_placement" {
		t.Fatalf("update stating replicas: %d %v", code, out)
	}
	delete(svc, "replicas")
	svc["bundle"] = "app2"
	if code, out := f.json("PUT", base, svc); code != 200 {
		t.Fatalf("update without replicas: %d %v", code, out)
	}
	if code, out := f.json("GET", base, nil); code != 200 || out["replicas"].(float64) != 3 {
		t.Fatalf("a service under an operator spec shows the spec's replicas: %d %v", code, out)
	}

	// Views answer without writing.
	if code, out := f.json("GET", base+"/workloads", nil); code != 200 || len(out["items"].([]any)) != 0 {
		t.Fatalf("slots view: %d %v", code, out)
	}
	code, out = f.json("GET", base+"/rollout", nil)
	if code != 200 || out["desired"].(float64) != 3 || out["previous_release"] == "" {
		t.Fatalf("rollout: %d %v", code, out)
	}

	// A dry run lists what the undo changes and writes nothing; a stale expected revision is
	// refused.
	code, out = f.json("POST", base+"/rollout/undo", map[string]any{"dry_run": true})
	changes, _ := out["changes"].([]any)
	if code != 200 || out["dry_run"] != true || out["bundle"] != "app2" || len(changes) != 1 || changes[0].(map[string]any)["field"] != "release" {
		t.Fatalf("undo dry run: %d %v", code, out)
	}
	if code, out := f.json("GET", base, nil); code != 200 || out["bundle"] != "app2" {
		t.Fatalf("after the dry run: %d %v", code, out)
	}
	if code, out := f.json("POST", base+"/rollout/undo", map[string]any{"expected_revision": 1}); code != 409 || out["code"] != "revision_conflict" {
		t.Fatalf("undo at a stale revision: %d %v", code, out)
	}
	// Undo goes back to the previous bundle; a service that never changed release has none.
	code, out = f.json("POST", base+"/rollout/undo", nil)
	if code != 200 || out["bundle"] != "app" {
		t.Fatalf("undo: %d %v", code, out)
	}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/other", map[string]any{"bundle": "app", "command": []string{"./app"}}); code != 201 {
		t.Fatalf("create other: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/projects/default/services/other/rollout/undo", nil); code != 409 || out["code"] != "no_previous_release" {
		t.Fatalf("undo without history: %d %v", code, out)
	}
	// A change of the environment alone is undone too; replicas and domains stay.
	other := map[string]any{"bundle": "app", "command": []string{"./app"}, "env": map[string]string{"GREETING": "hi"}, "replicas": 3}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/other", other); code != 200 {
		t.Fatalf("env change: %d %v", code, out)
	}
	code, out = f.json("POST", "/api/v1/projects/default/services/other/rollout/undo", nil)
	if code != 200 || out["env"] != nil || out["replicas"].(float64) != 3 {
		t.Fatalf("undo of an env change: %d %v", code, out)
	}

	// Deletion marks the service deleting; writes are then refused by name.
	if code, out := f.json("DELETE", base, nil); code != 202 || out["deleting"] != true {
		t.Fatalf("delete: %d %v", code, out)
	}
	if code, out := f.json("PUT", base+"/spec", map[string]any{"expected_revision": 2, "spec": map[string]any{}}); code != 409 || out["code"] != "service_deleting" {
		t.Fatalf("spec write while deleting: %d %v", code, out)
	}
	if code, out := f.json("PUT", base, svc); code != 409 || out["code"] != "service_deleting" {
		t.Fatalf("service write while deleting: %d %v", code, out)
	}

	// Node retirement refusals.
	if code, out := f.json("POST", "/api/v1/nodes/nod_nope/retire", map[string]any{"disposition": "lost"}); code != 404 || out["code"] != "node_not_found" {
		t.Fatalf("retire unknown node: %d %v", code, out)
	}
}
