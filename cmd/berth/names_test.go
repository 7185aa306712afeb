package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/sdk/client"
)

// TestAuditAndLeasesShowNames: audit names projects and services as the change log's own
// entries name them (a deleted service keeps the name it had), and get leases shows each
// lease's service as project/name, falling back to the id for a service nobody lists.
func TestAuditAndLeasesShowNames(t *testing.T) {
	t.Parallel()
	raw := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	at := time.Date(2030, 1, 2, 11, 0, 0, 0, time.UTC)
	entries := []node.LogEntry{
		{Seq: 1, Time: at, ActorID: "user:ann", EntityType: "project", EntityID: "prj_7f3a", Op: node.OpCreate, Payload: raw(client.Project{ID: "prj_7f3a", Name: "shop"})},
		{Seq: 2, Time: at, ActorID: "user:ann", EntityType: "service", EntityID: "svc_91c2", Op: node.OpCreate, Payload: raw(services.Service{ID: "svc_91c2", ProjectID: "prj_7f3a", Project: "shop", Name: "web"})},
		{Seq: 3, Time: at, ActorID: "token:ci", EntityType: "service", EntityID: "svc_91c2", Op: node.OpDelete},
	}
	answers := map[string]any{
		"/changelog": map[string]any{"entries": entries, "head_seq": 3},
		"/leases": client.List[client.Lease]{Items: []client.Lease{
			{LeaseID: "ls_1", ResourceType: "service", ResourceID: "svc_5d00", Holder: "west-1", FencingToken: 3, Mode: "local"},
			{LeaseID: "ls_2", ResourceType: "service", ResourceID: "svc_gone", FencingToken: 9, Mode: "local", Deleted: true},
		}},
		"/projects":               client.List[client.Project]{Items: []client.Project{{ID: "prj_7f3a", Name: "shop"}}},
		"/projects/shop/services": client.List[client.Service]{Items: []client.Service{{ID: "svc_5d00", Project: "shop", Name: "db"}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := answers[strings.TrimPrefix(r.URL.Path, "/api/v1")]
		if !ok {
			problem(w, http.StatusNotFound, "not_found", r.URL.Path)
			return
		}
		answer(w, http.StatusOK, v)
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_good"

	out := c.ok("", "audit")
	for _, want := range []string{"project shop ", "service shop/web   create", "service shop/web   delete"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit printed %q; want it to hold %q", out, want)
		}
	}
	if strings.Contains(out, "prj_7f3a") || strings.Contains(out, "svc_91c2") {
		t.Errorf("audit printed ids, not names: %q", out)
	}
	out = c.ok("", "get", "leases")
	if !strings.Contains(out, "ls_1    shop/db    west-1") || !strings.Contains(out, "ls_2    svc_gone") || strings.Contains(out, "svc_5d00") {
		t.Errorf("get leases printed %q; want shop/db by name and the unlisted svc_gone by id", out)
	}
}
