package api

import (
	"archive/tar"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
)

// TestChangelogRecordsServiceChanges: applying and deleting a service append
// chained entries that GET /api/v1/changelog serves (docs/node-protocol.md section 7).
func TestChangelogRecordsServiceChanges(t *testing.T) {
	t.Parallel()
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
	if code, out := f.json("DELETE", "/api/v1/projects/default/services/web", nil); code != 202 {
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
	// The project made on first use, the bundle, then the service's create,
	// update and delete, the delete naming the service by id.
	var got []string
	for _, e := range entries {
		got = append(got, e.EntityType+" "+e.Op)
	}
	want := "[project create bundle create service create service update service delete]"
	if fmt.Sprint(got) != want {
		t.Fatalf("entries %v, want %s", got, want)
	}
	if entries[2].EntityID != entries[4].EntityID || !strings.HasPrefix(entries[4].EntityID, "svc_") {
		t.Fatalf("delete names %q, create %q: want the same svc_ id", entries[4].EntityID, entries[2].EntityID)
	}
	if n, err := node.VerifyChain(0, "", entries); err != nil || n != len(entries) {
		t.Fatalf("served chain verified %d of %d: %v", n, len(entries), err)
	}
	if code, _ := f.json("GET", "/api/v1/changelog?from_seq=0", nil); code != 422 && code != 400 {
		t.Errorf("from_seq=0 answered %d", code)
	}
	if code, out := f.json("GET", "/api/v1/changelog?from_seq=5&limit=1", nil); code != 200 || len(out["entries"].([]any)) != 1 {
		t.Errorf("from_seq=3: %d %v", code, out)
	}
}

// TestRemoveNode: DELETE /api/v1/nodes/{id} marks the node removed, records
// the enrollment and the removal in the change log, and answers 404 for an
// unknown id (docs/node-protocol.md section 10).
func TestRemoveNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tok, _, err := f.reg.CreateJoinToken(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	code, out := f.json("POST", "/api/v1/nodes/enroll", map[string]any{"join_token": tok, "public_key": base64.StdEncoding.EncodeToString(pub), "hostname": "n1"})
	if code != 201 {
		t.Fatalf("enroll: %d %v", code, out)
	}
	id := out["node_id"].(string)
	if code, out := f.json("DELETE", "/api/v1/nodes/"+id, nil); code != 204 {
		t.Fatalf("remove: %d %v", code, out)
	}
	if code, _ := f.json("DELETE", "/api/v1/nodes/"+id, nil); code != 204 {
		t.Fatalf("second remove: %d", code)
	}
	if code, out := f.json("DELETE", "/api/v1/nodes/nod_nope", nil); code != 404 || out["code"] != "node_not_found" {
		t.Fatalf("unknown node: %d %v", code, out)
	}
	if code, out := f.json("GET", "/api/v1/nodes/"+id, nil); code != 200 || out["status"] != "removed" {
		t.Fatalf("node after removal: %d %v", code, out)
	}
	_, out = f.json("GET", "/api/v1/changelog", nil)
	raw, _ := json.Marshal(out["entries"])
	var entries []node.LogEntry
	_ = json.Unmarshal(raw, &entries)
	if len(entries) != 2 || entries[0].Op != node.OpCreate || entries[0].ActorID != id || entries[1].Op != node.OpDelete || entries[1].EntityID != id {
		t.Fatalf("entries %+v", entries)
	}
	if strings.Contains(string(entries[0].Payload), "credential") {
		t.Fatalf("node payload carries its credential digest: %s", entries[0].Payload)
	}
}
