package api

import (
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/wasmtest"
)

// TestBindResolvesModulePrefixAndName: a binding may name its module by a digest prefix of at
// least 12 hex digits (as 'berth module list' shows it) or by a name exactly one pushed module
// has; several matches are 409 module_ambiguous listing them, none is module_not_found saying
// what was searched, and a shorter prefix is refused (docs/wasm-abi.md section 5.4).
func TestBindResolvesModulePrefixAndName(t *testing.T) {
	t.Parallel()
	f := newPolicyFixture(t)
	push := func(wasm []byte) string {
		t.Helper()
		code, out := f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: wasm})
		if code != 201 {
			t.Fatalf("push: %d %v", code, out)
		}
		return out["digest"].(string)
	}
	solo := push(wasmtest.Policy(wasmtest.PolicyOptions{Name: "solo"}))
	twinA := push(wasmtest.Policy(wasmtest.PolicyOptions{Name: "twin"}))
	twinB := push(wasmtest.Policy(wasmtest.PolicyOptions{Name: "twin", Answer: `{"decision":"allow","warnings":["w"]}`}))
	if twinA == twinB {
		t.Fatalf("the two twin modules share digest %s", twinA)
	}
	bind := func(module string) (int, map[string]any) {
		t.Helper()
		return f.json("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": module, "project": "default"})
	}

	for _, ref := range []string{solo[:len("sha256:")+12], strings.TrimPrefix(solo, "sha256:")[:20], "solo", solo} {
		code, out := bind(ref)
		if code != 201 || out["module_digest"] != solo {
			t.Errorf("bind %q: %d %v; want 201 bound to %s", ref, code, out, solo)
		}
	}

	code, out := bind("twin")
	detail, _ := out["detail"].(string)
	if code != 409 || out["code"] != "module_ambiguous" || !strings.Contains(detail, twinA) || !strings.Contains(detail, twinB) {
		t.Errorf("bind twin: %d %v; want 409 module_ambiguous listing %s and %s", code, out, twinA, twinB)
	}

	missing := "sha256:" + strings.Repeat("0", 12)
	if strings.HasPrefix(solo, missing) || strings.HasPrefix(twinA, missing) || strings.HasPrefix(twinB, missing) {
		t.Fatalf("a pushed module starts with %s; pick another missing prefix", missing)
	}
	for _, ref := range []string{missing, "nosuch"} {
		code, out = bind(ref)
		detail, _ = out["detail"].(string)
		if code != 404 || out["code"] != "module_not_found" || !strings.Contains(detail, ref) || !strings.Contains(detail, "searched 3 modules") {
			t.Errorf("bind %q: %d %v; want 404 module_not_found naming what was searched", ref, code, out)
		}
	}

	code, out = bind(solo[:len("sha256:")+8])
	if code != 422 || out["code"] != "validation_failed" || !strings.Contains(out["detail"].(string), "12") {
		t.Errorf("bind an 8-digit prefix: %d %v; want 422 validation_failed asking for 12 digits", code, out)
	}
}
