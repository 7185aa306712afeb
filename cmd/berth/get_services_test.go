package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestGetServicesLeavesJobsOut: get services lists the project's services and not its jobs
// (kind: job), in the table and under -o json; berth job ls lists those (a newcomer found a job
// listed as a 0/0 converged service).
func TestGetServicesLeavesJobsOut(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/projects/shop/services" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		web := client.Service{ID: "svc_web", Project: "shop", Name: "web", Revision: 2}
		report := client.Service{ID: "svc_report", Project: "shop", Name: "report", Revision: 1}
		report.Kind = "job"
		answer(w, 200, client.List[client.Service]{Items: []client.Service{web, report}})
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x", "--project", "shop"}
	out := c.ok("", append(base, "get", "services")...)
	if !strings.Contains(out, "web ") || strings.Contains(out, "report") {
		t.Errorf("get services:\n%s", out)
	}
	out = c.ok("", append(base, "-o", "json", "get", "services")...)
	var got []client.Service
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].Name != "web" {
		t.Errorf("get services -o json: %q (%v)", out, err)
	}
}

// TestDeleteJobNamesTheKind: delete job NAME of a job says "job ... deleting"; delete job of a
// service is refused before anything is deleted, naming the right command.
func TestDeleteJobNamesTheKind(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var deleted []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/api/v1/projects/shop/services/")
		svc := client.Service{ID: "svc_" + name, Project: "shop", Name: name, Revision: 1}
		if name == "report" {
			svc.Kind = "job"
		}
		switch r.Method {
		case http.MethodGet:
			answer(w, 200, svc)
		case http.MethodDelete:
			mu.Lock()
			deleted = append(deleted, name)
			mu.Unlock()
			answer(w, 202, svc)
		default:
			problem(w, 405, "method_not_allowed", r.Method)
		}
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x", "--project", "shop"}
	if out := c.ok("", append(base, "delete", "job", "report")...); out != "job shop/report deleting: its running runs stop, then it is removed\n" {
		t.Errorf("delete job report: %q", out)
	}
	_, errOut, code := c.run("", append(base, "delete", "job", "web")...)
	if code == 0 || !strings.Contains(errOut, "shop/web is a service, not a job: berth delete service web") {
		t.Errorf("delete job of a service: exit %d, stderr %q", code, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(deleted, ",") != "report" {
		t.Errorf("deleted %v, want only report", deleted)
	}
}
