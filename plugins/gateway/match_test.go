package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/routes"
)

// echoPath starts an upstream that answers "<name> <escaped path>" to
// every request.
func echoPath(t testing.TB, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name+" "+r.URL.EscapedPath())
	}))
	t.Cleanup(srv.Close)
	return srv
}

// sendWith is send with request headers (each pair one header line).
func sendWith(t testing.TB, srv *httptest.Server, host, path string, header ...[2]string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Host = host
	for _, h := range header {
		req.Header.Add(h[0], h[1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

// TestRoutingByPathAndHeaders: the routes of one hostname are chosen by
// path prefix on segment boundaries and by request headers, in precedence
// order (longest prefix, then most headers), whatever order the table
// lists them in; strip_prefix cuts the prefix off the upstream's path; a
// request no route of its host matches is 404 no_route.
func TestRoutingByPathAndHeaders(t *testing.T) {
	t.Parallel()
	up := func(name string) []routes.Upstream {
		return []routes.Upstream{healthy("wl_"+name, addr(echoPath(t, name)))}
	}
	table := routes.Table{Revision: 1, Routes: []routes.Route{
		// Deliberately not in precedence order: SetTable orders them.
		{Hostname: testHost, Service: "site", Upstreams: up("site")},
		{Hostname: testHost, Service: "canary", Upstreams: up("canary"), Headers: []routes.HeaderMatch{{Name: "x-env", Value: "canary"}}},
		{Hostname: testHost, Service: "api", Upstreams: up("api"), PathPrefix: "/api", StripPrefix: true},
		{Hostname: testHost, Service: "api-canary", Upstreams: up("api-canary"), PathPrefix: "/api", Headers: []routes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
		{Hostname: testHost, Service: "v2", Upstreams: up("v2"), PathPrefix: "/api/v2"},
		{Hostname: testHost, Service: "both", Upstreams: up("both"), Headers: []routes.HeaderMatch{{Name: "X-Env", Value: "canary"}, {Name: "X-Team", Value: "blue"}}},
		{Hostname: "only-api.test", Service: "api", Upstreams: up("only"), PathPrefix: "/api"},
	}}
	if err := table.Validate(); err != nil {
		t.Fatal(err)
	}
	_, srv, _ := gateway(t, table)
	canary := [2]string{"X-Env", "canary"}
	for _, tc := range []struct {
		name, host, path string
		header           [][2]string
		want             string
	}{
		{"host alone", testHost, "/", nil, "site /"},
		{"other path", testHost, "/apix", nil, "site /apix"},
		{"prefix itself, stripped", testHost, "/api", nil, "api /"},
		{"under the prefix, stripped", testHost, "/api/users/7?x=1", nil, "api /users/7"},
		{"trailing slash", testHost, "/api/", nil, "api /"},
		{"longer prefix wins", testHost, "/api/v2/x", nil, "v2 /api/v2/x"},
		{"longer prefix wins over headers", testHost, "/api/v2/x", [][2]string{canary}, "v2 /api/v2/x"},
		{"prefix and header beat the prefix alone", testHost, "/api/x", [][2]string{canary}, "api-canary /api/x"},
		{"header, name in another case", testHost, "/", [][2]string{{"X-ENV", "canary"}}, "canary /"},
		{"header value is exact", testHost, "/", [][2]string{{"X-Env", "Canary"}}, "site /"},
		{"header value not joined", testHost, "/", [][2]string{{"X-Env", "beta, canary"}}, "site /"},
		{"one of repeated lines", testHost, "/", [][2]string{{"X-Env", "beta"}, canary}, "canary /"},
		{"more headers win", testHost, "/", [][2]string{canary, {"X-Team", "blue"}}, "both /"},
		{"dot segments cleaned for matching", testHost, "/site/../api/x", nil, "api /x"},
		{"escapes kept when stripping", testHost, "/api/a%2Fb", nil, "api /a%2Fb"},
	} {
		resp, body := sendWith(t, srv, tc.host, tc.path, tc.header...)
		if resp.StatusCode != http.StatusOK || body != tc.want {
			t.Errorf("%s: GET %s%s: %d %q, want 200 %q", tc.name, tc.host, tc.path, resp.StatusCode, body, tc.want)
		}
	}
	// Segment boundary on a host whose only route has a prefix: no route.
	for _, path := range []string{"/apix", "/", "/ap"} {
		resp, body := send(t, srv, http.MethodGet, "only-api.test", path, nil)
		wantProblem(t, resp, body, http.StatusNotFound, "no_route", "no-route")
	}
	if resp, body := sendWith(t, srv, "only-api.test", "/api/x"); resp.StatusCode != http.StatusOK || body != "only /api/x" {
		t.Errorf("only-api.test/api/x: %d %q; the path is passed on unchanged without strip_prefix", resp.StatusCode, body)
	}
}

// TestRoutingKeepsRoundRobinPerMatch: a route's round-robin position is
// kept across tables by its hostname and match conditions, so routes of
// one hostname do not share or reset each other's.
func TestRoutingKeepsRoundRobinPerMatch(t *testing.T) {
	t.Parallel()
	a, b := named(t, "a"), named(t, "b")
	table := routes.Table{Revision: 1, Routes: []routes.Route{
		{Hostname: testHost, Upstreams: []routes.Upstream{healthy("wl_a", addr(a)), healthy("wl_b", addr(b))}, PathPrefix: "/rr"},
		{Hostname: testHost, Upstreams: []routes.Upstream{healthy("wl_a", addr(a))}},
	}}
	p, srv, _ := gateway(t, table)
	_, first := send(t, srv, http.MethodGet, testHost, "/rr", nil)
	table.Revision = 2
	p.SetTable(table)
	_, second := send(t, srv, http.MethodGet, testHost, "/rr", nil)
	if string(first) == string(second) {
		t.Errorf("after a new table the /rr route answered %q twice: its round-robin position was reset", first)
	}
}

// TestMatchAllocatesNothing: choosing among a hostname's routes allocates
// nothing, with or without match conditions.
func TestMatchAllocatesNothing(t *testing.T) {
	p := NewProxy(nil)
	p.SetTable(routes.Table{Routes: []routes.Route{
		{Hostname: "plain.test"},
		{Hostname: "m.test", PathPrefix: "/api", Headers: []routes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
		{Hostname: "m.test", PathPrefix: "/api"},
		{Hostname: "m.test"},
	}})
	st := p.state.Load()
	req := httptest.NewRequest(http.MethodGet, "http://m.test/api/users/7", nil)
	req.Header.Set("X-Env", "canary")
	for host, want := range map[string]string{"plain.test": "", "m.test": "/api"} {
		vh := st.lookup(host)
		if rt := vh.match(req); rt == nil || rt.prefix != want || (host == "m.test" && len(rt.headers) != 1) {
			t.Fatalf("%s: matched %+v", host, rt)
		}
		if n := testing.AllocsPerRun(200, func() { vh.match(req) }); n != 0 {
			t.Errorf("%s: match allocates %v times per request", host, n)
		}
	}
}
