package api

import (
	"archive/tar"
	"strings"
	"testing"
)

// TestRolloutBoundsAndControls: a service's rollout block is validated and shown as written
// (counts and percentages); pause, resume and restart are one write each, a repeated pause
// writes nothing, and a restart counts a new generation (docs/reconciliation.md section 5.2).
func TestRolloutBoundsAndControls(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	body := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: body}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	base := "/api/v1/projects/default/services/"
	for _, tc := range []struct {
		rollout  map[string]any
		stateful bool
		detail   string // "" for accepted
	}{
		{map[string]any{"max_surge": "25%", "max_unavailable": 1}, false, ""},
		{map[string]any{"max_surge": 0, "max_unavailable": 0}, false, "cannot both be 0"},
		{map[string]any{"max_surge": 0}, false, "cannot both be 0"},
		{map[string]any{"max_surge": "150%"}, false, "0% to 100%"},
		{map[string]any{"max_unavailable": -1}, false, "must not be negative"},
		{map[string]any{"max_surge": 1}, true, "stateful"},
		{map[string]any{"max_unavailable": 1}, true, ""},
	} {
		svc := map[string]any{"bundle": "app", "command": []string{"./app"}, "rollout": tc.rollout}
		name := "web"
		if tc.stateful {
			svc["placement_mode"], name = "stateful", "db"
		}
		code, out := f.json("PUT", base+name, svc)
		if tc.detail == "" {
			if code != 200 && code != 201 {
				t.Fatalf("rollout %v: %d %v", tc.rollout, code, out)
			}
			continue
		}
		if detail, _ := out["detail"].(string); code != 422 || out["code"] != "validation_failed" || !strings.Contains(detail, tc.detail) {
			t.Errorf("rollout %v: %d %v, want 422 naming %q", tc.rollout, code, out, tc.detail)
		}
	}
	code, out := f.json("GET", base+"web", nil)
	if r, _ := out["rollout"].(map[string]any); code != 200 || r["max_surge"] != "25%" || r["max_unavailable"].(float64) != 1 {
		t.Fatalf("service as read: %d %v", code, out)
	}
	rev := out["revision"].(float64)
	for _, step := range []struct {
		action  string
		changed bool
		paused  bool
		gen     float64
	}{
		{"pause", true, true, 0}, {"pause", false, true, 0}, {"resume", true, false, 0}, {"resume", false, false, 0},
		{"restart", true, false, 1}, {"restart", true, false, 2},
	} {
		code, out := f.json("POST", base+"web/rollout/"+step.action, nil)
		svc, _ := out["service"].(map[string]any)
		if code != 200 || out["changed"] != step.changed {
			t.Fatalf("%s: %d %v", step.action, code, out)
		}
		paused, _ := svc["rollout_paused"].(bool)
		gen, _ := svc["restart_generation"].(float64)
		if paused != step.paused || gen != step.gen {
			t.Fatalf("%s: paused %v generation %v, want %v %v", step.action, paused, gen, step.paused, step.gen)
		}
		if step.changed {
			rev++
		}
		if svc["revision"].(float64) != rev {
			t.Fatalf("%s: revision %v, want %v", step.action, svc["revision"], rev)
		}
	}
	if code, out := f.json("POST", base+"web/rollout/pause", map[string]any{"expected_revision": 1}); code != 409 || out["code"] != "revision_conflict" {
		t.Fatalf("stale pause: %d %v", code, out)
	}
	if code, out := f.json("POST", base+"nope/rollout/restart", nil); code != 404 || out["code"] != "service_not_found" {
		t.Fatalf("restart of a missing service: %d %v", code, out)
	}
	// An apply keeps the pause and the restart generation, which it does not declare.
	if code, out := f.json("POST", base+"web/rollout/pause", nil); code != 200 {
		t.Fatalf("pause: %d %v", code, out)
	}
	code, out = f.json("PUT", base+"web", map[string]any{"bundle": "app", "command": []string{"./app", "-v"}})
	if code != 200 || out["rollout_paused"] != true || out["restart_generation"].(float64) != 2 || out["rollout"] != nil {
		t.Fatalf("apply over a paused service: %d %v", code, out)
	}
}
