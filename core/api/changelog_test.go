package api

import (
	"archive/tar"
	"encoding/json"
	"testing"

	"github.com/berthhq/berth/abi/node"
)

// TestChangelogRecordsServiceChanges: applying and deleting a service append
// chained entries that GET /api/v1/changelog serves (docs/node-protocol.md section 7).
func TestChangelogRecordsServiceChanges(t *testing.T) {
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	spec := map[string]any{"bundle": "app", "command": []string{"./app"}}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", spec); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	spec["replicas"] = 2
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", spec); code != 200 {
		t.Fatalf("update: %d %v", code, out)
	}
	if code, out := f.json("DELETE", "/api/v1/projects/default/services/web", nil); code != 204 {
		t.Fatalf("delete: %d %v", code, out)
	}
	code, out := f.json("GET", "/api/v1/changelog?from_seq=1", nil)
	if code != 200 {
		t.Fatalf("changelog: %d %v", code, out)
	}
	raw, _ := json.Marshal(out["entries"])
	var entries []node.LogEntry
	if err := json.Unmarshal(raw, &entries); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || entries[0].Op != node.OpCreate || entries[1].Op != node.OpUpdate || entries[2].Op != node.OpDelete {
		t.Fatalf("entries %+v", entries)
	}
	if n, err := node.VerifyChain(0, "", entries); err != nil || n != 3 {
		t.Fatalf("served chain verified %d of 3: %v", n, err)
	}
	if code, _ := f.json("GET", "/api/v1/changelog?from_seq=0", nil); code != 422 && code != 400 {
		t.Errorf("from_seq=0 answered %d", code)
	}
	if code, out := f.json("GET", "/api/v1/changelog?from_seq=3&limit=1", nil); code != 200 || len(out["entries"].([]any)) != 1 {
		t.Errorf("from_seq=3: %d %v", code, out)
	}
}
