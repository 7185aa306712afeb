package api

import (
	"archive/tar"
	"strings"
	"testing"
)

// TestApplyPlacementFields: the resources and placement fields of a service apply and come back
// on a GET with the resource defaults filled in; a bad one is refused with 422
// validation_failed naming it; the placement explanation of a service with no node says why its
// replica fits nowhere.
func TestApplyPlacementFields(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	spec := map[string]any{"bundle": "app", "command": []string{"./app"}, "resources": map[string]any{"memory_mib": 512},
		"node_selector": map[string]string{"disk": "ssd"}, "region": "eu", "spread_by": "region", "max_per_node": 1,
		"anti_affinity": []string{"db"}, "preferences": map[string]string{"tier": "fast"}}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", spec); code != 201 {
		t.Fatalf("apply: %d %v", code, out)
	}
	code, out := f.json("GET", "/api/v1/projects/default/services/web", nil)
	res, _ := out["resources"].(map[string]any)
	if code != 200 || res["cpu_m"] != float64(100) || res["memory_mib"] != float64(512) || out["region"] != "eu" || out["spread_by"] != "region" ||
		out["max_per_node"] != float64(1) {
		t.Fatalf("GET: %d %v", code, out)
	}
	for field, bad := range map[string]any{"spread_by": "rack", "max_per_node": -1, "anti_affinity": []string{"web"},
		"resources": map[string]any{"cpu_m": -5}} {
		m := map[string]any{"bundle": "app", "command": []string{"./app"}, field: bad}
		code, out := f.json("PUT", "/api/v1/projects/default/services/web", m)
		detail, _ := out["detail"].(string)
		if code != 422 || out["code"] != "validation_failed" || !strings.Contains(detail, field) {
			t.Errorf("%s: %v: %d %v; want 422 validation_failed naming it", field, bad, code, out)
		}
	}
	code, out = f.json("GET", "/api/v1/projects/default/services/web/placement", nil)
	if code != 200 || out["service"] != "default/web" {
		t.Fatalf("placement: %d %v", code, out)
	}
	reps, _ := out["replicas"].([]any)
	if len(reps) != 1 || reps[0].(map[string]any)["reason"] != "no nodes" {
		t.Fatalf("placement with no node: %v", out)
	}
}
