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

// TestRegistryGC: `registry gc --dry-run` asks for a dry run and prints each deletion and the
// summary; without the flag it asks for a real pass; a refusal is an error.
func TestRegistryGC(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/api/v1/registry/gc" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		if r.Header.Get("Authorization") != "Bearer brt_admin" {
			problem(w, 403, "forbidden", "needs admin")
			return
		}
		var req struct {
			DryRun bool `json:"dry_run"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			problem(w, 400, "bad_request", err.Error())
			return
		}
		mu.Lock()
		asked = append(asked, req.DryRun)
		mu.Unlock()
		answer(w, 200, client.RegistryGCReport{DryRun: req.DryRun, KeptManifests: 4, KeptBlobs: 12, Remaining: true,
			BlobsSkipped: "tags and manifests go first; blobs they held are judged by the next pass",
			Deletions: []client.RegistryGCItem{
				{Kind: "tag", Repository: "shop/web", Tag: "v2", Digest: "sha256:2222"},
				{Kind: "manifest", Repository: "shop/web", Digest: "sha256:2222"},
			}})
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_admin"
	out := c.ok("", "registry", "gc", "--dry-run")
	for _, want := range []string{"tag        shop/web     v2    sha256:2222   -\n", "manifest   shop/web     -     sha256:2222   -\n",
		"would delete 2 objects (0 blob bytes); kept 4 manifests and 12 blobs\n", "blobs not judged: tags and manifests go first", "work remains for the next pass\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("registry gc --dry-run printed %q; want it to hold %q", out, want)
		}
	}
	if out := c.ok("", "registry", "gc"); !strings.Contains(out, "deleted 2 objects") {
		t.Errorf("registry gc printed %q", out)
	}
	mu.Lock()
	if len(asked) != 2 || !asked[0] || asked[1] {
		t.Errorf("dry_run of the passes asked: %v; want [true false]", asked)
	}
	mu.Unlock()
	c.env["BERTH_TOKEN"] = "brt_other"
	if _, errOut, code := c.run("", "registry", "gc"); code == 0 || !strings.Contains(errOut, "forbidden") {
		t.Errorf("registry gc with a token without admin: exit %d, stderr %q", code, errOut)
	}
}
