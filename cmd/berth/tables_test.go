package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// assertAligned fails unless the table that starts out is columns aligned under header: no tabs, and each cell of each row starts
// where its header starts, after a space.
func assertAligned(t *testing.T, what, out string, header []string, rows int) {
	t.Helper()
	if strings.Contains(out, "\t") {
		t.Errorf("%s prints tabs, not aligned columns:\n%s", what, out)
		return
	}
	lines := strings.Split(out, "\n")
	if len(lines) < rows+1 {
		t.Errorf("%s: %d lines, want a header and %d rows:\n%s", what, len(lines), rows, out)
		return
	}
	var starts []int
	from := 0
	for _, h := range header {
		i := strings.Index(lines[0][from:], h)
		if i < 0 {
			t.Errorf("%s: header %q lacks %q", what, lines[0], h)
			return
		}
		starts = append(starts, from+i)
		from += i + len(h)
	}
	for _, l := range lines[1 : rows+1] {
		for c, s := range starts {
			if len(l) <= s || l[s] == ' ' || (c > 0 && l[s-1] != ' ') {
				t.Errorf("%s: column %s of row %q does not start at %d, under its header:\n%s", what, header[c], l, s, out)
				return
			}
		}
	}
}

// TestTablesAreAligned: backup ls, release list, registry gc and operation list print
// aligned columns through the one table writer, whatever the widths of their cells.
func TestTablesAreAligned(t *testing.T) {
	t.Parallel()
	when := time.Date(2030, 1, 2, 11, 0, 0, 0, time.UTC)
	answers := map[string]any{
		"/projects/shop/backups": client.List[client.Backup]{Items: []client.Backup{
			{ID: "bk_1", Service: "web", Binding: "db", Kind: "postgres", State: "succeeded", Size: 12, Digest: "sha256:" + strings.Repeat("a", 64), CreatedAt: when},
			{ID: "bk_long_identifier_2", Service: "a-much-longer-service", Binding: "uploads", Kind: "volume", State: "failed", Size: 123456789, CreatedAt: when},
		}},
		"/projects/shop/services/web/releases": client.List[client.ImageRelease]{Items: []client.ImageRelease{
			{Tag: "v1", Digest: "sha256:" + strings.Repeat("b", 64), Follow: &client.ReleaseFollow{State: client.FollowRefused, Reason: "policy: pushed images wait for review"}},
			{Tag: "main", Digest: "sha256:" + strings.Repeat("e", 64), Follow: &client.ReleaseFollow{State: client.FollowFollowed}},
			{Tag: "release-2030-01-02", ReservedBy: "ci"},
		}},
		"/registry/gc": client.RegistryGCReport{DryRun: true, Deletions: []client.RegistryGCItem{
			{Kind: "tag", Repository: "shop/web", Tag: "v1", Digest: "sha256:" + strings.Repeat("c", 64)},
			{Kind: "blob", Digest: "sha256:" + strings.Repeat("d", 64), Size: 1048576},
		}},
		"/projects/shop/operations": client.List[client.Operation]{Items: []client.Operation{
			{ID: "op_1", Kind: "backup", State: "queued", Attempts: 0, Fence: 0},
			{ID: "op_0123456789abcdef0123456789abcdef_long", Kind: "reconcile-everything", State: "leased", Attempts: 12, Fence: 123456, NodeID: "west-1"},
		}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := answers[strings.TrimPrefix(r.URL.Path, "/api/v1")]
		if !ok {
			problem(w, http.StatusNotFound, "not_found", r.URL.Path)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"], c.env["BERTH_PROJECT"] = srv.URL, "brt_good", "shop"

	assertAligned(t, "backup ls", c.ok("", "backup", "ls"), []string{"ID", "SERVICE", "BINDING", "KIND", "STATE", "SIZE", "DIGEST", "WHEN", "DRILL"}, 2)
	rl := c.ok("", "release", "list", "web")
	assertAligned(t, "release list", rl, []string{"TAG", "DIGEST", "RESERVED", "FOLLOW"}, 3)
	for _, want := range []string{"refused(policy)\n", "followed\n", "ci         -\n"} {
		if !strings.Contains(rl, want) {
			t.Errorf("release list lacks %q:\n%s", want, rl)
		}
	}
	gc := c.ok("", "registry", "gc", "--dry-run")
	assertAligned(t, "registry gc", gc, []string{"KIND", "REPOSITORY", "TAG", "DIGEST", "SIZE"}, 2)
	if !strings.Contains(gc, "would delete 2 objects (1048576 blob bytes)") {
		t.Errorf("registry gc summary: %q", gc)
	}
	assertAligned(t, "operation list", c.ok("", "operation", "list"), []string{"ID", "KIND", "STATE", "ATTEMPTS", "FENCE", "NODE"}, 2)
}
