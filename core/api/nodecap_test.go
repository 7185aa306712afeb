package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
)

// TestNodeCapacityCordonDrainEndpoints: an enrollment carries allocatable resources; the
// operator's override merges into schedulable; cordon, drain and uncordon show in GET /nodes/{id},
// and each refuses what it must with a named code.
func TestNodeCapacityCordonDrainEndpoints(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tok, _, err := f.reg.CreateJoinToken(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	enroll := map[string]any{"join_token": tok, "public_key": base64.StdEncoding.EncodeToString(pub), "hostname": "n1",
		"allocatable": map[string]any{"cpu_m": 4000, "memory_mib": 8192, "disk_mib": 1000, "extended": map[string]any{"gpu": 1}}}
	code, out := f.json("POST", "/api/v1/nodes/enroll", enroll)
	if code != 201 {
		t.Fatalf("enroll: %d %v", code, out)
	}
	id := out["node_id"].(string)
	base := "/api/v1/nodes/" + id

	code, out = f.json("PUT", base+"/capacity", map[string]any{"memory_mib": 4096, "extended": map[string]any{"gpu": 0}})
	sched, _ := out["schedulable"].(map[string]any)
	if code != 200 || sched["cpu_m"].(float64) != 4000 || sched["memory_mib"].(float64) != 4096 || sched["extended"].(map[string]any)["gpu"].(float64) != 0 {
		t.Fatalf("set capacity: %d %v", code, out)
	}
	if al := out["allocatable"].(map[string]any); al["memory_mib"].(float64) != 8192 || out["capacity_override"] == nil {
		t.Fatalf("the reported figures or the override are not shown: %v", out)
	}
	for _, tc := range []struct {
		method, path string
		body         any
		code         int
		want         string
	}{
		{"PUT", base + "/capacity", map[string]any{"cpu_m": -1}, 422, "validation_failed"},
		{"PUT", base + "/capacity", map[string]any{"extended": map[string]any{"GPU!": 1}}, 422, "validation_failed"},
		{"PUT", "/api/v1/nodes/nod_nope/capacity", map[string]any{"cpu_m": 1}, 404, "node_not_found"},
		{"POST", "/api/v1/nodes/nod_nope/cordon", nil, 404, "node_not_found"},
		{"POST", base + "/drain", map[string]any{"deadline_s": -1}, 422, "validation_failed"},
		{"POST", base + "/drain", map[string]any{"deadline_s": 8 * 24 * 3600}, 422, "validation_failed"},
	} {
		if code, out := f.json(tc.method, tc.path, tc.body); code != tc.code || out["code"] != tc.want {
			t.Errorf("%s %s %v: %d %v, want %d %s", tc.method, tc.path, tc.body, code, out, tc.code, tc.want)
		}
	}

	if code, out = f.json("POST", base+"/cordon", nil); code != 200 || out["cordoned"] != true || out["status"] != "pending" {
		t.Fatalf("cordon: %d %v", code, out)
	}
	code, out = f.json("POST", base+"/drain", map[string]any{"deadline_s": 600})
	drain, _ := out["drain"].(map[string]any)
	if code != 200 || out["status"] != "draining" || out["session"] != "pending" || drain["state"] != "drained" || drain["deadline"] == nil {
		t.Fatalf("drain of a node with nothing on it: %d %v", code, out)
	}
	if code, out = f.json("POST", base+"/uncordon", nil); code != 200 || out["cordoned"] != nil || out["drain"] != nil || out["status"] != "pending" {
		t.Fatalf("uncordon: %d %v", code, out)
	}
	if code, out = f.json("PUT", base+"/capacity", map[string]any{"clear": true}); code != 200 || out["capacity_override"] != nil {
		t.Fatalf("clear the override: %d %v", code, out)
	}
	if code, out = f.json("GET", "/api/v1/nodes", nil); code != 200 {
		t.Fatalf("list: %d %v", code, out)
	}
	// Every change is in the change log, a clear as null.
	code, out = f.json("GET", "/api/v1/changelog?from_seq=1", nil)
	raw, _ := json.Marshal(out["entries"])
	var entries []node.LogEntry
	if err := json.Unmarshal(raw, &entries); code != 200 || err != nil {
		t.Fatalf("changelog: %d %v %v", code, out, err)
	}
	var got []string
	for _, e := range entries {
		if e.EntityID == id && e.Op == node.OpUpdate {
			got = append(got, string(e.Payload))
		}
	}
	if len(got) != 5 || !strings.Contains(got[0], `"memory_mib":4096}`) || !strings.Contains(got[1], `"cordoned":true`) ||
		!strings.Contains(got[2], `"drain":{"deadline"`) || !strings.Contains(got[3], `"drain":null`) || !strings.Contains(got[4], `"capacity_override":null`) {
		t.Fatalf("node changes in the change log:\n%s", strings.Join(got, "\n"))
	}
	// A retiring node takes no operator change.
	if code, out := f.json("POST", base+"/retire", nil); code != 202 {
		t.Fatalf("retire: %d %v", code, out)
	}
	if code, out := f.json("POST", base+"/drain", nil); code != 409 || out["code"] != "node_already_retired" {
		t.Fatalf("drain of a retiring node: %d %v", code, out)
	}
}
