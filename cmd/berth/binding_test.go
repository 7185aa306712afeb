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
	if len(lines) != 3 || !strings.Contains(lines[0], "LAST-ERROR") ||
		!strings.Contains(lines[1], "10.0.0.5:5432") || !strings.Contains(lines[2], "binding_unavailable: the MongoDB server did not answer") {
		t.Fatalf("get bindings:\n%s", out)
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
