package api

import (
	"archive/tar"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/wasmtest"
)

// TestUndoRefusedByPolicy: rollout undo is a change like an apply (rollout.undo): a bound
// policy that refuses where the undo goes back to answers 403 policy_denied with its reasons,
// and the service keeps what it runs. Before core/deploy the undo wrote without asking.
func TestUndoRefusedByPolicy(t *testing.T) {
	t.Parallel()
	f := newPolicyFixture(t)
	for i, name := range []string{"app", "app2"} {
		body := tarGz(t, &tar.Header{Name: "app" + strings.Repeat("x", i), Typeflag: tar.TypeReg, Mode: 0o755})
		if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=" + name, ctype: "application/gzip", token: f.admin, body: body}); code != 201 {
			t.Fatalf("push bundle %s: %d %v", name, code, out)
		}
	}
	base := "/api/v1/projects/default/services/web"
	if code, out := f.json("PUT", base, map[string]any{"bundle": "app", "command": []string{"./app"}}); code != 201 {
		t.Fatalf("apply app: %d %v", code, out)
	}
	code, out := f.json("PUT", base, map[string]any{"bundle": "app2", "command": []string{"./app"}})
	if code != 200 {
		t.Fatalf("apply app2: %d %v", code, out)
	}
	digest2 := out["bundle_digest"].(string)
	// From now on a bundle must be named by its digest: the current one is, the previous is not.
	code, out = f.json("PUT", base, map[string]any{"bundle": digest2, "command": []string{"./app"}})
	if code != 200 {
		t.Fatalf("apply by digest: %d %v", code, out)
	}
	rev := out["revision"].(float64)
	code, out = f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: wasmtest.BuildGo(t, "examples/policies/require-digest")})
	if code != 201 {
		t.Fatalf("push module: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": out["digest"]}); code != 201 {
		t.Fatalf("bind: %d %v", code, out)
	}

	code, out = f.json("POST", base+"/rollout/undo", nil)
	reasons, _ := out["reasons"].([]any)
	if code != 403 || out["code"] != "policy_denied" || len(reasons) != 1 || !strings.Contains(reasons[0].(string), "bundle app is not named by digest") {
		t.Fatalf("undo to a bundle named by name: %d %v", code, out)
	}
	code, out = f.json("GET", base, nil)
	if code != 200 || out["bundle"] != digest2 || out["revision"].(float64) != rev {
		t.Fatalf("after the refused undo: %d %v", code, out)
	}
	// The caller was answered: the refusal is not the service's verdict.
	if v, _ := out["verdict"].(map[string]any); v != nil && v["state"] == "refused" {
		t.Fatalf("verdict after an answered refusal: %v", v)
	}
}

// TestRolloutControlRefusedByPolicy: a pause, a resume and a restart are changes like an apply
// (rollout.pause, rollout.resume, rollout.restart): a bound policy that refuses the service as
// it is stored answers each 403 policy_denied, and the service keeps its revision, its pause and
// its restart generation. Before they went through core/deploy they wrote without asking.
func TestRolloutControlRefusedByPolicy(t *testing.T) {
	t.Parallel()
	f := newPolicyFixture(t)
	body := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: body}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	base := "/api/v1/projects/default/services/web"
	if code, out := f.json("PUT", base, map[string]any{"bundle": "app", "command": []string{"./app"}}); code != 201 {
		t.Fatalf("apply: %d %v", code, out)
	}
	// Paused before the policy is bound, so a resume has something to do.
	code, out := f.json("POST", base+"/rollout/pause", nil)
	if code != 200 || out["changed"] != true {
		t.Fatalf("pause before the binding: %d %v", code, out)
	}
	svc, _ := out["service"].(map[string]any)
	rev := svc["revision"].(float64)
	code, out = f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: wasmtest.BuildGo(t, "examples/policies/require-digest")})
	if code != 201 {
		t.Fatalf("push module: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": out["digest"]}); code != 201 {
		t.Fatalf("bind: %d %v", code, out)
	}
	for _, action := range []string{"resume", "restart"} {
		code, out = f.json("POST", base+"/rollout/"+action, nil)
		reasons, _ := out["reasons"].([]any)
		if code != 403 || out["code"] != "policy_denied" || len(reasons) != 1 || !strings.Contains(reasons[0].(string), "not named by digest") {
			t.Fatalf("%s of a service the policy refuses: %d %v", action, code, out)
		}
	}
	// A pause of a paused rollout changes nothing, so nothing is judged.
	if code, out := f.json("POST", base+"/rollout/pause", nil); code != 200 || out["changed"] != false {
		t.Fatalf("pause of a paused rollout: %d %v", code, out)
	}
	code, out = f.json("GET", base, nil)
	if code != 200 || out["revision"].(float64) != rev || out["rollout_paused"] != true {
		t.Fatalf("after the refused resume and restart: %d %v", code, out)
	}
	if g, _ := out["restart_generation"].(float64); g != 0 {
		t.Fatalf("restart generation %v after a refused restart", out["restart_generation"])
	}
}
