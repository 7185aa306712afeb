package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestModuleListNoTrunc: module list shows 12-digit digests, and --no-trunc the full ones.
func TestModuleListNoTrunc(t *testing.T) {
	t.Parallel()
	full := "sha256:" + strings.Repeat("7d26931d", 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+r.URL.Path != "GET /api/v1/modules" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		answer(w, 200, client.List[client.Module]{Items: []client.Module{{Digest: full, Kind: "policy", Name: "cap-replicas",
			Version: "1", ABI: "1.0", Size: 1024, CreatedAt: testNow()}}})
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x"}
	if out := c.ok("", append(base, "module", "list")...); strings.Contains(out, full) || !strings.Contains(out, full[:len("sha256:")+12]+" ") {
		t.Errorf("module list:\n%s\nwant the 12-digit digest only", out)
	}
	if out := c.ok("", append(base, "module", "list", "--no-trunc")...); !strings.Contains(out, full) {
		t.Errorf("module list --no-trunc:\n%s\nwant the full digest %s", out, full)
	}
}
