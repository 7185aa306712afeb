package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestApplyPrintsPolicyWarnings: every Berth-Policy-Warning header of an apply's answer reaches
// stderr as "warning: ..." and, with -o json, the service's policy_warnings.
func TestApplyPrintsPolicyWarnings(t *testing.T) {
	t.Parallel()
	warnings := []string{
		"policy cap-replicas failed: trap (ignored: failure_policy ignore)",
		"policy labels: team label missing",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != "/api/v1/projects/shop/services/web" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		for _, m := range warnings {
			w.Header().Add(client.HeaderPolicyWarning, m)
		}
		answer(w, 200, client.Service{ID: "svc_web", Project: "shop", Name: "web", Revision: 3})
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x", "--project", "shop"}
	file := "name: web\nbundle: web\ncommand: [./server]\n"

	out, errOut, code := c.run(file, append(base, "apply", "-f", "-")...)
	if code != 0 {
		t.Fatalf("apply: exit %d, stderr %q", code, errOut)
	}
	for _, m := range warnings {
		if !strings.Contains(errOut, "warning: shop/web: "+m+"\n") {
			t.Errorf("apply stderr %q; want the line \"warning: shop/web: %s\"", errOut, m)
		}
	}
	if strings.Contains(out, "warning") {
		t.Errorf("apply stdout %q carries a warning; warnings go to stderr", out)
	}

	out, errOut, code = c.run(file, append(base, "-o", "json", "apply", "-f", "-")...)
	if code != 0 {
		t.Fatalf("apply -o json: exit %d, stderr %q", code, errOut)
	}
	var got []client.Service
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("apply -o json printed %q: %v", out, err)
	}
	if len(got) != 1 || strings.Join(got[0].PolicyWarnings, "|") != strings.Join(warnings, "|") {
		t.Errorf("apply -o json: %+v; want one service with policy_warnings %q", got, warnings)
	}
	if !strings.Contains(errOut, "warning: shop/web: "+warnings[0]) {
		t.Errorf("apply -o json stderr %q; want the warnings there too", errOut)
	}
}

// TestApplyRefusedUnderJSONIsJSON: an apply the API refuses prints, under -o json, one JSON
// object on stdout naming the problem's code, status and message (and nothing else there), and
// exits non-zero; without -o json the refusal is a line on stderr naming the code once.
func TestApplyRefusedUnderJSONIsJSON(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem(w, 422, "validation_failed", "replicas must be between 0 and 1000")
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x", "--project", "shop"}
	file := "name: web\nbundle: web\ncommand: [./server]\nreplicas: 5000\n"

	out, _, code := c.run(file, append(base, "-o", "json", "apply", "-f", "-")...)
	var refusal struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
			Status  int    `json:"status"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &refusal); code == 0 || err != nil || refusal.Error.Code != "validation_failed" ||
		refusal.Error.Status != 422 || !strings.Contains(refusal.Error.Message, "replicas must be between") {
		t.Fatalf("apply -o json refused: exit %d, stdout %q (%v)", code, out, err)
	}
	out, errOut, code := c.run(file, append(base, "apply", "-f", "-")...)
	if code == 0 || out != "" || strings.Count(errOut, "validation_failed") != 1 || !strings.Contains(errOut, "replicas must be between") {
		t.Fatalf("apply refused: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
