package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// TestBindScopeAndDecisionReasons: the projects a binding covers come from
// --scope-project only (the global --project and BERTH_PROJECT are the
// project one works in, and bind refuses --project), and the WHY column of
// `policy decisions` keeps reasons that hold commas apart.
func TestBindScopeAndDecisionReasons(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bound []client.BindingRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /api/v1/policy-bindings":
			var req client.BindingRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			mu.Lock()
			bound = append(bound, req)
			mu.Unlock()
			answer(w, 201, client.Binding{ID: "pbd_1", Hook: req.Hook, Module: "m", Project: req.Project, FailurePolicy: "fail"})
		case "GET /api/v1/policy-decisions":
			answer(w, 200, client.List[client.PolicyDecision]{Items: []client.PolicyDecision{{
				ID: "pdc_1", Hook: "service.apply", Result: "deny", InputSHA256: strings.Repeat("a", 64), At: testNow().Add(-time.Minute),
				Reasons: []string{"needs labels team, tier", "no digest"},
			}}})
		default:
			problem(w, 404, "not_found", r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_PROJECT"] = "shop"
	base := []string{"--server", srv.URL, "--token", "brt_x"}
	c.ok("", append(base, "module", "bind", "sha256:abc", "--hook", "deploy")...)
	c.ok("", append(base, "module", "bind", "sha256:abc", "--hook", "deploy", "--scope-project", "web")...)
	_, errOut, code := c.run("", append(base, "module", "bind", "sha256:abc", "--hook", "deploy", "--project", "web")...)
	if code == 0 || !strings.Contains(errOut, "--scope-project") {
		t.Errorf("bind --project: exit %d, stderr %q; want a refusal naming --scope-project", code, errOut)
	}
	mu.Lock()
	if len(bound) != 2 || bound[0].Project != "" || bound[1].Project != "web" {
		t.Errorf("bindings sent %+v; want every project, then web", bound)
	}
	mu.Unlock()
	out := c.ok("", append(base, "policy", "decisions")...)
	if !strings.Contains(out, "needs labels team, tier; no digest") {
		t.Errorf("policy decisions:\n%s\nwant the reasons separated by \"; \"", out)
	}
}
