package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/provider"
)

// GatewayConfig says which gateway provider to check (docs/plugins.md
// section 6.3): a provider plugin that manages the route table (resource
// routes.ResourceType / routes.ResourceID) and serves plain HTTP for it on a
// loopback address the suite picks for each case. The built-in gateway and
// an adapter driving an external proxy (plugins/caddy) are checked alike.
type GatewayConfig struct {
	// Binary is the built plugin, launched afresh for each case.
	Binary string
	// Args returns the binary's arguments for a case: its fresh state
	// directory and the address ("127.0.0.1:port") the routes must be served
	// on. Required.
	Args func(stateDir, listen string) []string
	// PluginConfig is given to ValidateConfig and Configure; nil means {}.
	PluginConfig json.RawMessage
	// Stderr receives the plugin's stderr; nil discards it.
	Stderr io.Writer
}

// GatewayCaseNames lists the gateway cases in order, after "launch".
func GatewayCaseNames() []string {
	var out []string
	for _, c := range gatewayCases(GatewayConfig{}) {
		out = append(out, c.name)
	}
	return out
}

// RunGateway runs the gateway cases as subtests of t (after case launch,
// which checks that the binary starts and advertises the route table). It
// fails t at once when cfg is invalid.
func RunGateway(t *testing.T, cfg GatewayConfig) {
	t.Helper()
	if cfg.Binary == "" || cfg.Args == nil {
		t.Fatal("conformance: GatewayConfig needs Binary and Args")
	}
	runTesting(t, cfg.cases())
}

// CheckGateway runs the gateway cases on cfg outside `go test` and returns
// the report (suite "gateway"); the error is for an invalid cfg only.
func CheckGateway(ctx context.Context, cfg GatewayConfig) (*Report, error) {
	if cfg.Binary == "" || cfg.Args == nil {
		return nil, errors.New("conformance: GatewayConfig needs Binary and Args")
	}
	return runReport(ctx, "gateway", cfg.Binary, cfg.cases()), nil
}

func (cfg GatewayConfig) cases() []testCase {
	return gated(func(t T) error {
		listen, err := freeLoopback()
		if err != nil {
			return err
		}
		s := cfg.launch(t, listen)
		d, err := s.p.Describe(s.ctx(t))
		if err != nil {
			return fmt.Errorf("describe: %w", err)
		}
		if !slices.ContainsFunc(d.Capabilities.ResourceTypes, func(rt provider.ResourceType) bool { return rt.Name == routes.ResourceType }) {
			return fmt.Errorf("the plugin does not advertise the resource type %s (it advertises %v), so it is not a gateway", routes.ResourceType, typeNames(d.Capabilities.ResourceTypes))
		}
		return nil
	}, gatewayCases(cfg))
}

// gwSession is one launched gateway of a case, with the address it serves.
type gwSession struct {
	*provSession
	listen string
	client *http.Client
}

func (cfg GatewayConfig) launch(t T, listen string) *gwSession {
	t.Helper()
	pc := ProviderConfig{Binary: cfg.Binary, PluginConfig: cfg.PluginConfig, Stderr: cfg.Stderr,
		Args: func(stateDir string) []string { return cfg.Args(stateDir, listen) }}
	s := pc.launch(t, t.TempDir())
	// No connection is kept between requests: each one meets the table in
	// force when it is sent.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &gwSession{provSession: s, listen: listen, client: client}
}

// freeLoopback returns a loopback address no listener holds right now.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a loopback port for the gateway: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// upstream starts an HTTP server on loopback that answers every request
// with "upstream NAME" and stops it when the case ends.
func upstream(t T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "upstream "+name)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// table is a route-table resource at rev routing each hostname to the
// upstream address beside it.
func table(rev int64, hostAddr ...string) provider.Resource {
	tb := routes.Table{Revision: rev, Routes: []routes.Route{}}
	for i := 0; i+1 < len(hostAddr); i += 2 {
		svc := strings.SplitN(hostAddr[i], ".", 2)[0]
		tb.Routes = append(tb.Routes, routes.Route{Hostname: hostAddr[i], Project: "conformance", Service: svc, TLSMode: routes.TLSNone,
			Upstreams: []routes.Upstream{{WorkloadID: "wl_" + svc, Address: hostAddr[i+1], Healthy: true}}})
	}
	raw, _ := json.Marshal(tb) // plain structs: cannot fail
	return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
}

// get sends GET / for host to the gateway and returns the status and body.
func (s *gwSession) get(t T, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(s.ctx(t), http.MethodGet, "http://"+s.listen+"/", nil)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	req.Host = host
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s", failure("GET http://"+host+"/ through the gateway at "+s.listen, "an HTTP answer", gotErr(err)))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body)
}

// getReq sends GET path for host with the header lines given (pairs of
// name and value) and returns the status and body.
func (s *gwSession) getReq(t T, host, path string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(s.ctx(t), http.MethodGet, "http://"+s.listen+path, nil)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s", failure("GET http://"+host+path+" through the gateway at "+s.listen, "an HTTP answer", gotErr(err)))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body)
}

// pathUpstream starts an HTTP server on loopback that answers every
// request with "upstream NAME PATH" (the path as it arrived) and stops it
// when the case ends.
func pathUpstream(t T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "upstream "+name+" "+r.URL.EscapedPath())
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// matchTable is a route-table resource at rev with several routes of
// m.conformance.test chosen by path prefix and header (docs/routes.md
// section 3), each to the upstream of its name in ups, and a host whose
// only route has a prefix.
func matchTable(rev int64, ups map[string]string) provider.Resource {
	r := func(svc, prefix string, strip bool, headers ...routes.HeaderMatch) routes.Route {
		return routes.Route{Hostname: "m.conformance.test", Project: "conformance", Service: svc, TLSMode: routes.TLSNone,
			PathPrefix: prefix, StripPrefix: strip, Headers: headers,
			Upstreams: []routes.Upstream{{WorkloadID: "wl_" + svc, Address: ups[svc], Healthy: true}}}
	}
	canary := routes.HeaderMatch{Name: "X-Env", Value: "canary"}
	only := r("only", "/api", false)
	only.Hostname = "only.conformance.test"
	tb := routes.Table{Revision: rev, Routes: []routes.Route{
		r("site", "", false), r("canary", "", false, canary), r("api", "/api", true),
		r("apicanary", "/api", false, canary), r("vtwo", "/api/v2", false), only,
	}}
	tb.Normalize()
	raw, _ := json.Marshal(tb) // plain structs: cannot fail
	return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
}

// want checks that host is answered by the upstream named name (name ""
// means: not routed, 404).
func (s *gwSession) want(t T, did, host, name string) {
	t.Helper()
	code, body := s.get(t, host)
	if name == "" {
		if code != http.StatusNotFound {
			t.Errorf("%s", failure(did+", then GET http://"+host+"/", "404: no route for the host", fmt.Sprintf("%d %q", code, short(body))))
		}
		return
	}
	if code != http.StatusOK || body != "upstream "+name {
		t.Errorf("%s", failure(did+", then GET http://"+host+"/", fmt.Sprintf("200 %q from the route's upstream", "upstream "+name), fmt.Sprintf("%d %q", code, short(body))))
	}
}

func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func gatewayCases(cfg GatewayConfig) []testCase {
	start := func(t T) *gwSession {
		listen, err := freeLoopback()
		if err != nil {
			t.Fatalf("%v", err)
		}
		return cfg.launch(t, listen)
	}
	return []testCase{
		{"gateway_routes_host", func(t T) {
			s := start(t)
			a := upstream(t, "a")
			st := s.mustApply(t, table(1, "a.conformance.test", a), nil, s.key("a"), 1)
			s.want(t, "Apply a table routing a.conformance.test", "a.conformance.test", "a")
			s.want(t, "Apply a table routing a.conformance.test", "A.Conformance.Test.", "a")
			got, err := s.read(t, st)
			if err != nil || !got.Equal(st) {
				t.Errorf("%s", failure("Read the route table after Apply", "the applied state "+show(st), readGot(got, err)))
			}
		}},
		{"gateway_unknown_host", func(t T) {
			s := start(t)
			s.want(t, "Before any table", "nothing.conformance.test", "")
			s.mustApply(t, table(1, "a.conformance.test", upstream(t, "a")), nil, s.key("a"), 1)
			s.want(t, "Apply a table routing a.conformance.test only", "other.conformance.test", "")
		}},
		{"gateway_swap_withdraws", func(t T) {
			s := start(t)
			a, b := upstream(t, "a"), upstream(t, "b")
			st1 := s.mustApply(t, table(1, "a.conformance.test", a, "b.conformance.test", b), nil, s.key("1"), 1)
			s.want(t, "Apply a table routing a and b", "a.conformance.test", "a")
			st2 := s.mustApply(t, table(2, "b.conformance.test", a), &st1, s.key("2"), 2)
			did := "Apply a table routing a and b, then one routing b (to a's upstream) only"
			s.want(t, did, "a.conformance.test", "")
			s.want(t, did, "b.conformance.test", "a")
			got, err := s.read(t, st2)
			if err != nil || !got.Equal(st2) {
				t.Errorf("%s", failure("Read after the swap", "the second table "+show(st2), readGot(got, err)))
			}
			if _, err := s.p.Delete(s.ctx(t), &provider.DeleteRequest{Type: routes.ResourceType, ID: routes.ResourceID,
				Mutation: pluginapi.Mutation{IdempotencyKey: s.key("d"), FencingToken: 3}}); err != nil {
				t.Fatalf("%s", failure("Delete the route table", "success", gotErr(err)))
			}
			s.want(t, "Delete the route table", "b.conformance.test", "")
		}},
		{"gateway_replay_changes_nothing", func(t T) {
			s := start(t)
			a, b := upstream(t, "a"), upstream(t, "b")
			key := s.key("first")
			first := table(1, "x.conformance.test", a)
			plan1, st1, err := s.apply(t, first, nil, key, 7)
			if err != nil {
				t.Fatalf("%s", failure("Apply the first table", "success", gotErr(err)))
			}
			st2 := s.mustApply(t, table(2, "x.conformance.test", b), &st1, s.key("second"), 7)
			r, err := s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: plan1, Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: 7}})
			switch {
			case err != nil:
				t.Errorf("%s", failure("replay the first Apply (same key, same request) after a second table", "the first Apply's answer", gotErr(err)))
			case !r.State.Equal(st1):
				t.Errorf("%s", failure("replay the first Apply after a second table", "the first Apply's answer "+show(st1), show(r.State)))
			}
			s.want(t, "replay the first Apply after a second table routed x to b", "x.conformance.test", "b")
			if got, err := s.read(t, st2); err != nil || !got.Equal(st2) {
				t.Errorf("%s", failure("Read after the replay", "the second table "+show(st2), readGot(got, err)))
			}
			_, err = s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: table(3, "x.conformance.test", a), Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: 7}})
			if abierrors.CodeOf(err) != abierrors.IdempotencyKeyReused {
				t.Errorf("%s", failure("Apply another table under the first Apply's key", "a refusal of code "+string(abierrors.IdempotencyKeyReused), gotErr(err)))
			}
			s.want(t, "Apply another table under a used key", "x.conformance.test", "b")
		}},
		{"gateway_routes_path_and_headers", func(t T) {
			s := start(t)
			ups := map[string]string{}
			for _, n := range []string{"site", "canary", "api", "apicanary", "vtwo", "only"} {
				ups[n] = pathUpstream(t, n)
			}
			s.mustApply(t, matchTable(1, ups), nil, s.key("m"), 1)
			did := "Apply a table with routes of m.conformance.test by path prefix (/api stripped, /api/v2) and header X-Env: canary"
			for _, c := range []struct {
				host, path string
				header     []string
				want       string // "" for 404
			}{
				{"m.conformance.test", "/", nil, "site /"},
				{"m.conformance.test", "/apix", nil, "site /apix"},
				{"m.conformance.test", "/api", nil, "api /"},
				{"m.conformance.test", "/api/users/7", nil, "api /users/7"},
				{"m.conformance.test", "/api/v2/x", []string{"X-Env", "canary"}, "vtwo /api/v2/x"},
				{"m.conformance.test", "/api/x", []string{"x-env", "canary"}, "apicanary /api/x"},
				{"m.conformance.test", "/", []string{"X-Env", "canary"}, "canary /"},
				{"m.conformance.test", "/", []string{"X-Env", "Canary"}, "site /"},
				{"m.conformance.test", "/", []string{"X-Env", "beta", "X-Env", "canary"}, "canary /"},
				{"only.conformance.test", "/api/x", nil, "only /api/x"},
				{"only.conformance.test", "/apix", nil, ""},
			} {
				code, body := s.getReq(t, c.host, c.path, c.header...)
				req := "GET http://" + c.host + c.path
				if len(c.header) > 0 {
					req += fmt.Sprintf(" with %q", c.header)
				}
				switch {
				case c.want == "" && code != http.StatusNotFound:
					t.Errorf("%s", failure(did+", then "+req, "404: no route of the host matches", fmt.Sprintf("%d %q", code, short(body))))
				case c.want != "" && (code != http.StatusOK || body != "upstream "+c.want):
					t.Errorf("%s", failure(did+", then "+req, fmt.Sprintf("200 %q", "upstream "+c.want), fmt.Sprintf("%d %q", code, short(body))))
				}
			}
		}},
		{"gateway_stale_token_refused", func(t T) {
			s := start(t)
			a, b := upstream(t, "a"), upstream(t, "b")
			st := s.mustApply(t, table(1, "x.conformance.test", a), nil, s.key("a"), 10)
			_, _, err := s.apply(t, table(2, "x.conformance.test", b, "y.conformance.test", b), &st, s.key("b"), 9)
			if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Apply a table with fencing token 9 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			did := "Apply a table with token 10, then a refused one with token 9"
			s.want(t, did, "x.conformance.test", "a")
			s.want(t, did, "y.conformance.test", "")
			if got, err := s.read(t, st); err != nil || !got.Equal(st) {
				t.Errorf("%s", failure("Read after the refused Apply", "the table applied with token 10 "+show(st), readGot(got, err)))
			}
		}},
	}
}
