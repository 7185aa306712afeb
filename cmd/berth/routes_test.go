package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/client"
)

// TestRoutesShowsExclusions: `berth routes` lists the hostnames route claims
// exclude below the table, with their reason, and -o json carries them in
// table.excluded (docs/routes.md section 2).
func TestRoutesShowsExclusions(t *testing.T) {
	t.Parallel()
	st := client.RouteStatus{SHA256: strings.Repeat("b", 64), Compiler: "native", Table: abiroutes.Table{Revision: 3,
		Routes: []abiroutes.Route{{Hostname: "blog.example.com", Project: "blog", Service: "api", Upstreams: []abiroutes.Upstream{},
			PathPrefix: "/api", StripPrefix: true, Headers: []abiroutes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
			{Hostname: "blog.example.com", Project: "blog", Service: "www", Upstreams: []abiroutes.Upstream{}}},
		Excluded: []abiroutes.Exclusion{{Hostname: "shop.example.com", Reason: "claimed by blog/www and shop/web; none of them holds its claim"}}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+r.URL.Path != "GET /api/v1/routes" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		answer(w, 200, st)
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x"}
	out := c.ok("", append(base, "routes")...)
	i := strings.Index(out, "excluded (served for no service):")
	if i < 0 || !strings.Contains(out[i:], "shop.example.com") || !strings.Contains(out[i:], "none of them holds its claim") || strings.Contains(out[i:], "blog.example.com ") {
		t.Fatalf("routes:\n%s\nwant shop.example.com and its reason under the exclusions", out)
	}
	if !strings.Contains(out[:i], "blog.example.com") {
		t.Fatalf("routes:\n%s\nwant blog.example.com in the table", out)
	}
	// A hostname's routes are told apart by their match conditions.
	if !strings.Contains(out[:i], "/api (strip) X-Env=canary") || !strings.Contains(out[:i], "MATCH") {
		t.Fatalf("routes:\n%s\nwant the /api route's match conditions in the MATCH column", out)
	}
	var got client.RouteStatus
	if err := json.Unmarshal([]byte(c.ok("", append(base, "routes", "-o", "json")...)), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Table.Excluded) != 1 || got.Table.Excluded[0] != st.Table.Excluded[0] {
		t.Fatalf("-o json excluded %+v", got.Table.Excluded)
	}
}
