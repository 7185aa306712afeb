package caddy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/caddytest"
	"github.com/berthhq/berth/plugins/caddy"
	"github.com/berthhq/berth/sdk/provider"

	"github.com/berthhq/berth/internal/proctest"
)

// srv is the one real Caddy of this package, started by TestMain.
var srv *caddytest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	bin, err := caddytest.Find()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "berth-caddy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	admin := ln.Addr().String()
	ln.Close()
	if srv, err = caddytest.StartDir(bin, admin, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Stop()
	return m.Run()
}

// TestGatewayConformance: the adapter passes the gateway cases and the
// provider suite against the real Caddy, as the built-in gateway does
// (docs/plugins.md sections 5.7 and 6.3).
func TestGatewayConformance(t *testing.T) {
	bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-caddy")
	if os.Getenv("BERTH_BIN_DIR") == "" {
		bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-caddy")
	}
	t.Run("gateway", func(t *testing.T) {
		conformance.RunGateway(t, conformance.GatewayConfig{Binary: bin, Args: func(stateDir, listen string) []string {
			return []string{"--admin", srv.Admin, "--listen", listen, "--state-dir", stateDir}
		}})
	})
	t.Run("provider", func(t *testing.T) {
		listen := freeAddr(t)
		conformance.RunProvider(t, conformance.ProviderConfig{Binary: bin, Args: func(stateDir string) []string {
			return []string{"--admin", srv.Admin, "--listen", listen, "--state-dir", stateDir}
		}})
	})
}

func freeAddr(t *testing.T) string { t.Helper(); return freeAddrB(t) }

func freeAddrB(t testing.TB) string { t.Helper(); return proctest.FreeAddr(t) }

func tableResource(t *testing.T, tb routes.Table) provider.Resource {
	t.Helper()
	return tableResourceB(t, tb)
}

func tableResourceB(t testing.TB, tb routes.Table) provider.Resource {
	t.Helper()
	raw, err := json.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
}

func get(t *testing.T, listen, host string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+listen+"/", nil)
	req.Host = host
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// TestRouteAnswersMatchTheBuiltInGateway: through Caddy, a route without a
// healthy upstream answers 503 no_healthy_upstream, a route asking for TLS
// answers 421 tls_unavailable, a client outside allow_sources 403, an
// unknown host 404 no_route, each marked X-Berth-Gateway as the built-in
// gateway's own answers are; a restarted adapter whose Caddy lost the table
// loads the stored one before any Apply, and Read reports a Caddy changed
// behind its back as drift.
func TestRouteAnswersMatchTheBuiltInGateway(t *testing.T) {
	ctx := context.Background()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "up") }))
	t.Cleanup(up.Close)
	upAddr := strings.TrimPrefix(up.URL, "http://")
	listen := freeAddr(t)
	state := t.TempDir()
	p, err := caddy.Open(ctx, caddy.Config{Admin: srv.Admin, Listen: listen, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	tb := routes.Table{Revision: 1, Routes: []routes.Route{
		{Hostname: "ok.test", Project: "p", Service: "ok", Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: upAddr, Healthy: true}}},
		{Hostname: "sick.test", Project: "p", Service: "sick", Upstreams: []routes.Upstream{{WorkloadID: "wl_2", Address: upAddr}}},
		{Hostname: "tls.test", Project: "p", Service: "tls", TLSMode: routes.TLSACME, Upstreams: []routes.Upstream{{WorkloadID: "wl_3", Address: upAddr, Healthy: true}}},
		{Hostname: "private.test", Project: "p", Service: "private", AllowSources: []string{"10.0.0.0/8"}, Upstreams: []routes.Upstream{{WorkloadID: "wl_4", Address: upAddr, Healthy: true}}},
	}}
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: tableResource(t, tb)})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, mark string
		code       int
	}{{"ok.test", "", 200}, {"sick.test", "no-healthy-upstream", 503}, {"tls.test", "tls-unavailable", 421},
		{"private.test", "source-not-allowed", 403}, {"nobody.test", "no-route", 404}} {
		code, h, body := get(t, listen, c.host)
		if code != c.code || h.Get("X-Berth-Gateway") != c.mark {
			t.Errorf("%s: %d %q (X-Berth-Gateway %q), want %d with %q", c.host, code, body, h.Get("X-Berth-Gateway"), c.code, c.mark)
		}
		if c.mark != "" {
			var pb struct{ Code string }
			if err := json.Unmarshal([]byte(body), &pb); err != nil || pb.Code != strings.ReplaceAll(c.mark, "-", "_") || h.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: body %q (%s), want problem+json with code %s", c.host, body, h.Get("Content-Type"), c.mark)
			}
		}
	}
	if code, h, _ := get(t, listen, "sick.test"); code != 503 || h.Get("Retry-After") != "1" {
		t.Errorf("no healthy upstream: %d Retry-After %q, want 503 and 1", code, h.Get("Retry-After"))
	}

	// Caddy loses the table (another config loaded behind the adapter's
	// back): Read says so, and a new adapter on the same state directory
	// loads the stored table at start.
	resp, err := http.Post("http://"+srv.Admin+"/load", "application/json", strings.NewReader(`{"admin":{"listen":"`+srv.Admin+`"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := p.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID}); abierrors.CodeOf(err) != abierrors.NotFound {
		t.Fatalf("Read of a Caddy without Berth's server: %v, want not_found", err)
	}
	p2, err := caddy.Open(ctx, caddy.Config{Admin: srv.Admin, Listen: listen, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := get(t, listen, "ok.test"); code != 200 || body != "up" {
		t.Fatalf("after a restart of the adapter: %d %q, want the stored table served", code, body)
	}
	got, err := p2.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID})
	if err != nil || !got.State.Equal(applied.State) {
		t.Fatalf("Read after the restart: %v %+v", err, got)
	}
	// A Caddy whose routes were edited by hand: Read reports what it has.
	edited, err := caddy.Render(routes.Table{Routes: []routes.Route{{Hostname: "hand.test", Upstreams: []routes.Upstream{{WorkloadID: "x", Address: upAddr, Healthy: true}}}}}, listen, srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err = http.Post("http://"+srv.Admin+"/load", "application/json", strings.NewReader(string(edited))); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got, err = p2.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID})
	if err != nil {
		t.Fatal(err)
	}
	var back routes.Table
	if err := json.Unmarshal(got.State.Attributes, &back); err != nil || len(back.Routes) != 1 || back.Routes[0].Hostname != "hand.test" {
		t.Fatalf("Read of an edited Caddy: %s, want the hand-made route", got.State.Attributes)
	}
}

// TestHealthFollowsCaddysAdminAPI: the adapter reports healthy while Caddy's
// admin API answers and undetected, saying why, when nothing answers there.
func TestHealthFollowsCaddysAdminAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		admin string
		want  pluginapi.HealthState
	}{{srv.Admin, pluginapi.Healthy}, {freeAddr(t), pluginapi.Undetected}} {
		p, err := caddy.Open(ctx, caddy.Config{Admin: c.admin, Listen: freeAddr(t), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithCancel(ctx)
		ch, err := p.Health(hctx)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-ch:
			if r.State != c.want || (c.want != pluginapi.Healthy && !strings.Contains(r.Description, c.admin)) {
				t.Errorf("admin %s: health %+v, want %s", c.admin, r, c.want)
			}
		case <-ctx.Done():
			t.Fatalf("admin %s: no health report", c.admin)
		}
		hcancel()
	}
}

// TestMatchConditionsThroughCaddy: through the real Caddy, the routes of
// one hostname are chosen by path prefix on segment boundaries and by
// request headers in the table's precedence order, strip_prefix cuts the
// prefix off the upstream's path, a request none of a hostname's routes
// matches answers 404 no_route (never another hostname's route), and Read
// gives back the match conditions Caddy serves.
func TestMatchConditionsThroughCaddy(t *testing.T) {
	ctx := context.Background()
	echo := func(name string) []routes.Upstream {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, name+" "+r.URL.EscapedPath())
		}))
		t.Cleanup(up.Close)
		return []routes.Upstream{{WorkloadID: "wl_" + name, Address: strings.TrimPrefix(up.URL, "http://"), Healthy: true}}
	}
	listen := freeAddr(t)
	p, err := caddy.Open(ctx, caddy.Config{Admin: srv.Admin, Listen: listen, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tb := routes.Table{Revision: 1, Routes: []routes.Route{
		{Hostname: "m.test", Project: "p", Service: "site", Upstreams: echo("site")},
		{Hostname: "m.test", Project: "p", Service: "canary", Upstreams: echo("canary"), Headers: []routes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
		{Hostname: "m.test", Project: "p", Service: "api", Upstreams: echo("api"), PathPrefix: "/api", StripPrefix: true},
		{Hostname: "m.test", Project: "p", Service: "api-canary", Upstreams: echo("api-canary"), PathPrefix: "/api", Headers: []routes.HeaderMatch{{Name: "x-env", Value: "can*ry"}}},
		{Hostname: "m.test", Project: "p", Service: "v2", Upstreams: echo("v2"), PathPrefix: "/api/v2"},
		{Hostname: "only.test", Project: "p", Service: "only", Upstreams: echo("only"), PathPrefix: "/api"},
		{Hostname: "*.test", Project: "p", Service: "wild", Upstreams: echo("wild")},
	}}
	if err := tb.Validate(); err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: tableResource(t, tb)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 1}}); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, tc := range []struct {
		host, path string
		header     [][2]string
		code       int
		want       string
	}{
		{"m.test", "/", nil, 200, "site /"},
		{"m.test", "/apix", nil, 200, "site /apix"},
		{"m.test", "/API/x", nil, 200, "site /API/x"},
		{"m.test", "/api", nil, 200, "api /"},
		{"m.test", "/api/users/7", nil, 200, "api /users/7"},
		{"m.test", "/api/v2/x", [][2]string{{"X-Env", "canary"}}, 200, "v2 /api/v2/x"},
		{"m.test", "/api/x", [][2]string{{"x-env", "can*ry"}}, 200, "api-canary /api/x"},
		{"m.test", "/api/x", [][2]string{{"X-Env", "canary"}}, 200, "api /x"},
		{"m.test", "/", [][2]string{{"X-Env", "canary"}}, 200, "canary /"},
		{"m.test", "/", [][2]string{{"X-Env", "Canary"}}, 200, "site /"},
		{"m.test", "/", [][2]string{{"X-Env", "beta"}, {"X-Env", "canary"}}, 200, "canary /"},
		{"only.test", "/api/x", nil, 200, "only /api/x"},
		{"only.test", "/apix", nil, 404, ""},
		{"only.test", "/", nil, 404, ""},
		{"other.test", "/", nil, 200, "wild /"},
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+listen+tc.path, nil)
		req.Host = tc.host
		for _, h := range tc.header {
			req.Header.Add(h[0], h[1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || (tc.code == 200 && string(body) != tc.want) {
			t.Errorf("GET %s%s %v: %d %q, want %d %q", tc.host, tc.path, tc.header, resp.StatusCode, body, tc.code, tc.want)
		}
		if tc.code == 404 && resp.Header.Get("X-Berth-Gateway") != "no-route" {
			t.Errorf("GET %s%s: 404 not marked no-route: %q", tc.host, tc.path, body)
		}
	}
	// Read of a Caddy that lost the rendering gives back the conditions.
	edited := tb
	edited.Routes = append([]routes.Route(nil), tb.Routes[:3]...)
	raw, err := caddy.Render(edited, listen, srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+srv.Admin+"/load", "application/json", strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got, err := p.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID})
	if err != nil {
		t.Fatal(err)
	}
	var back routes.Table
	if err := json.Unmarshal(got.State.Attributes, &back); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range back.Routes {
		keys = append(keys, fmt.Sprintf("%s %s strip=%v %v", r.Hostname, r.PathPrefix, r.StripPrefix, r.Headers))
	}
	want := []string{"m.test /api strip=true []", "m.test  strip=false [{X-Env canary}]", "m.test  strip=false []"}
	if strings.Join(keys, "|") != strings.Join(want, "|") {
		t.Errorf("Read back %q, want %q", keys, want)
	}
}
