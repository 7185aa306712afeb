package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// bindingAPI answers the binding routes the way berthd does, recording the deletes it gets.
type bindingAPI struct {
	mu      sync.Mutex
	deletes []string // "path?query"
}

func (f *bindingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/projects/shop/bindings":
		_ = json.NewEncoder(w).Encode(map[string]any{"items": []map[string]any{
			{"service": "web", "name": "db", "kind": "postgres", "state": "ready", "endpoint": "10.0.0.5:5432", "database": "berth_shop_web_db_1", "users": "own"},
			{"service": "web", "name": "cache", "kind": "mongodb", "state": "failed", "users": "unsupported",
				"last_error": "binding_unavailable: the MongoDB server\n did not answer"},
			{"service": "old", "name": "files", "kind": "s3", "state": "ready", "endpoint": "10.0.0.6:9000", "database": "berth-shop-old-files-1", "users": "own"},
		}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/projects/shop/services":
		// Service old was deleted: its binding files is left, used by nothing.
		_ = json.NewEncoder(w).Encode(map[string]any{"items": []map[string]any{
			{"id": "svc_1", "project": "shop", "name": "web", "bindings": []map[string]any{{"name": "db", "kind": "postgres"}, {"name": "cache", "kind": "mongodb"}}},
		}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/projects/shop/operations":
		_ = json.NewEncoder(w).Encode(map[string]any{"items": []map[string]any{
			{"id": "op_1", "kind": "binding.apply", "state": "retry", "attempts": 2, "fence": 7, "target_node": "core:bindings", "last_error": "binding_unavailable: down"},
		}})
	case r.Method == http.MethodDelete && r.URL.Path == "/api/v1/projects/shop/services/web/bindings/db":
		f.mu.Lock()
		f.deletes = append(f.deletes, r.URL.Path+"?"+r.URL.RawQuery)
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"service": "web", "name": "db", "kind": "postgres", "state": "released", "operation_id": "op_1"})
	default:
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"code":"not_found","status":404}`))
	}
}

func TestBindingCommands(t *testing.T) {
	t.Parallel()
	f := &bindingAPI{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_good"

	out := c.ok("", "get", "bindings", "--project", "shop")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "LAST-ERROR") ||
		!strings.Contains(lines[1], "10.0.0.5:5432") || !strings.Contains(lines[2], "binding_unavailable: the MongoDB server did not answer") {
		t.Fatalf("get bindings:\n%s", out)
	}
	// USED-BY is derived from the services that declare each binding: a binding whose service
	// is gone is ready yet used by nothing.
	if !strings.Contains(lines[0], "USED-BY") || !strings.Contains(lines[1], "   web   ") ||
		!strings.HasPrefix(lines[3], "old ") || !strings.Contains(lines[3], "   nothing   ") {
		t.Fatalf("get bindings does not show what uses each binding:\n%s", out)
	}
	if out := c.ok("", "get", "operations", "--project", "shop"); !strings.Contains(out, "binding.apply") || !strings.Contains(out, "core:bindings") {
		t.Errorf("get operations:\n%s", out)
	}
	if out := c.ok("", "binding", "delete", "web", "db", "--project", "shop"); !strings.Contains(out, "released; its data is kept") {
		t.Errorf("binding delete: %q", out)
	}
	if out := c.ok("", "binding", "delete", "web", "db", "--purge", "--project", "shop"); !strings.Contains(out, "purge queued (operation op_1)") {
		t.Errorf("binding delete --purge: %q", out)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []string{"/api/v1/projects/shop/services/web/bindings/db?", "/api/v1/projects/shop/services/web/bindings/db?purge=true"}
	if strings.Join(f.deletes, " ") != strings.Join(want, " ") {
		t.Errorf("deletes %q, want %q", f.deletes, want)
	}
}
