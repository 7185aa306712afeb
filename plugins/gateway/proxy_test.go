package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mccutchen/go-httpbin/v2/httpbin"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/syncbuf"
)

const testHost = "app.example.test"

// gateway starts a Proxy serving table behind a real listener. It returns the
// proxy, its server, and the proxy's log output.
func gateway(t testing.TB, table routes.Table) (*Proxy, *httptest.Server, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	p := NewProxy(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	p.SetTable(table)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv, logs
}

// named starts an upstream that answers its name to every request.
func named(t testing.TB, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// deadAddr returns the address of a TCP port nobody listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("close listener: %v", err)
	}
	return addr
}

// addr returns the host:port of an httptest server.
func addr(srv *httptest.Server) string { return srv.Listener.Addr().String() }

// oneRoute is a table routing testHost to the given upstreams.
func oneRoute(ups ...routes.Upstream) routes.Table {
	return routes.Table{Revision: 1, Routes: []routes.Route{{
		Hostname: testHost, Project: "prj_test", Service: "web", Upstreams: ups,
	}}}
}

func healthy(id, address string) routes.Upstream {
	return routes.Upstream{WorkloadID: id, Address: address, Healthy: true}
}

// send makes a request through the gateway for host and returns the response
// with its body read.
func send(t testing.TB, srv *httptest.Server, method, host, path string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, body)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Host = host
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %s %s%s: %v", method, host, path, err)
	}
	return resp, b
}

// wantProblem checks a response the gateway wrote itself.
func wantProblem(t *testing.T, resp *http.Response, body []byte, status int, code, mark string) problem {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", got)
	}
	if got := resp.Header.Get(gatewayHeader); got != mark {
		t.Errorf("%s = %q, want %q", gatewayHeader, got, mark)
	}
	var pb problem
	if err := json.Unmarshal(body, &pb); err != nil {
		t.Fatalf("decode problem %s: %v", body, err)
	}
	if string(pb.Code) != code || pb.Status != status {
		t.Errorf("problem = %+v, want code %q status %d", pb, code, status)
	}
	return pb
}

func TestUnknownHost(t *testing.T) {
	t.Parallel()
	up := named(t, "a")
	_, srv, _ := gateway(t, oneRoute(healthy("wl_a", addr(up))))

	resp, body := send(t, srv, http.MethodGet, "Other.Example.TEST.:8080", "/", nil)
	wantProblem(t, resp, body, http.StatusNotFound, "no_route", "no-route")
	want := `{"title":"no route for host","status":404,"code":"no_route","detail":"no service is routed at host \"other.example.test\""}`
	if string(body) != want {
		t.Errorf("body = %s\nwant   %s", body, want)
	}
}

func TestHostMatching(t *testing.T) {
	t.Parallel()
	up := named(t, "a")
	_, srv, _ := gateway(t, oneRoute(healthy("wl_a", addr(up))))

	for _, host := range []string{testHost, "APP.Example.Test", testHost + ":8443", testHost + ".", "App.Example.Test.:80"} {
		resp, body := send(t, srv, http.MethodGet, host, "/", nil)
		if resp.StatusCode != http.StatusOK || string(body) != "a" {
			t.Errorf("Host %q: %d %q, want 200 \"a\"", host, resp.StatusCode, body)
		}
	}
}

func TestNoHealthyUpstream(t *testing.T) {
	t.Parallel()
	hit := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hit <- struct{}{} }))
	t.Cleanup(up.Close)
	_, srv, _ := gateway(t, oneRoute(routes.Upstream{WorkloadID: "wl_a", Address: addr(up), Healthy: false}))

	resp, body := send(t, srv, http.MethodGet, testHost, "/", nil)
	wantProblem(t, resp, body, http.StatusServiceUnavailable, "no_healthy_upstream", "no-healthy-upstream")
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	select {
	case <-hit:
		t.Error("an unhealthy upstream received a request")
	default:
	}
}

func TestApplicationErrorPassesThrough(t *testing.T) {
	t.Parallel()
	app := httptest.NewServer(httpbin.New())
	t.Cleanup(app.Close)
	_, srv, _ := gateway(t, oneRoute(healthy("wl_bin", addr(app))))

	direct, err := app.Client().Get(app.URL + "/status/503")
	if err != nil {
		t.Fatalf("direct request: %v", err)
	}
	wantBody, err := io.ReadAll(direct.Body)
	direct.Body.Close()
	if err != nil {
		t.Fatalf("read direct body: %v", err)
	}

	resp, body := send(t, srv, http.MethodGet, testHost, "/status/503", nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d, want 503", resp.StatusCode)
	}
	if got := resp.Header.Get(gatewayHeader); got != "" {
		t.Errorf("%s = %q on the application's own 503, want absent", gatewayHeader, got)
	}
	if !bytes.Equal(body, wantBody) {
		t.Errorf("body through the gateway = %q, want the application's %q", body, wantBody)
	}
	if got, want := resp.Header.Get("Content-Type"), direct.Header.Get("Content-Type"); got != want {
		t.Errorf("Content-Type = %q, want the application's %q", got, want)
	}
}

func TestForwardedHeaders(t *testing.T) {
	t.Parallel()
	app := httptest.NewServer(httpbin.New())
	t.Cleanup(app.Close)
	table := oneRoute(healthy("wl_bin", addr(app)))

	for _, tc := range []struct {
		name      string
		tls       bool
		wantProto string
	}{
		{"http", false, "http"},
		{"https", true, "https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(nil)
			p.SetTable(table)
			var srv *httptest.Server
			if tc.tls {
				srv = httptest.NewTLSServer(p)
			} else {
				srv = httptest.NewServer(p)
			}
			t.Cleanup(srv.Close)

			req, err := http.NewRequest(http.MethodGet, srv.URL+"/headers", nil)
			if err != nil {
				t.Fatalf("new request: %v", err)
			}
			req.Host = testHost
			req.Header.Set("X-Forwarded-For", "203.0.113.9") // a client's claim the edge must not pass on
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("GET /headers: %v", err)
			}
			defer resp.Body.Close()
			var echo struct {
				Headers http.Header `json:"headers"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&echo); err != nil {
				t.Fatalf("decode /headers: %v", err)
			}
			for name, want := range map[string]string{
				"Host":              testHost,
				"X-Forwarded-For":   "127.0.0.1",
				"X-Forwarded-Proto": tc.wantProto,
				"X-Forwarded-Host":  testHost,
			} {
				if got := strings.Join(echo.Headers.Values(name), ","); got != want {
					t.Errorf("upstream saw %s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestLargeBodyStreamsIntact(t *testing.T) {
	// Not parallel: it measures the process's allocations.
	const blocks = 160 // 160 × 64 KiB = 10 MiB
	block := make([]byte, 64<<10)
	for i := range block {
		block[i] = byte(i % 251)
	}
	want := sha256.New()
	for range blocks {
		want.Write(block)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		for range blocks {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	_, srv, _ := gateway(t, oneRoute(healthy("wl_big", addr(up))))

	req, err := http.NewRequest(http.MethodGet, srv.URL+"/big", nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Host = testHost
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET /big: %v", err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read /big: %v", err)
	}
	runtime.ReadMemStats(&after)

	if n != blocks*int64(len(block)) {
		t.Errorf("read %d bytes, want %d", n, blocks*len(block))
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Errorf("SHA-256 of the body through the gateway = %x, want %x", got.Sum(nil), want.Sum(nil))
	}
	// A gateway that held the body would allocate at least its 10 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Errorf("the transfer allocated %d bytes: the body was buffered", alloc)
	}
}

func TestStreamingArrivesAsProduced(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("upstream flush: %v", err)
			return
		}
		select {
		case <-release: // the test has read "first" through the gateway
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(up.Close)
	_, srv, _ := gateway(t, oneRoute(healthy("wl_stream", addr(up))))

	// The deadline only turns a buffering gateway into a failure instead of a hang.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/stream", nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Host = testHost
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET /stream: %v", err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("read first chunk while the upstream still holds the response open: %v", err)
	}
	if first != "first\n" {
		t.Fatalf("first chunk = %q, want \"first\\n\"", first)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("read rest: %v", err)
	}
	if string(rest) != "second\n" {
		t.Errorf("rest = %q, want \"second\\n\"", rest)
	}
}

func TestRoundRobin(t *testing.T) {
	t.Parallel()
	a, b := named(t, "a"), named(t, "b")
	_, srv, _ := gateway(t, oneRoute(healthy("wl_a", addr(a)), healthy("wl_b", addr(b))))

	var seq []string
	for range 6 {
		resp, body := send(t, srv, http.MethodGet, testHost, "/", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status = %d, want 200", resp.StatusCode)
		}
		seq = append(seq, string(body))
	}
	for i := 1; i < len(seq); i++ {
		if seq[i] == seq[i-1] {
			t.Fatalf("upstreams hit in order %v, want them in turn", seq)
		}
	}
}

func TestDeadUpstream(t *testing.T) {
	t.Parallel()
	live := named(t, "live")
	dead := deadAddr(t)

	t.Run("GET skips it", func(t *testing.T) {
		t.Parallel()
		_, srv, logs := gateway(t, oneRoute(healthy("wl_dead", dead), healthy("wl_live", addr(live))))
		for i := range 4 { // every starting point of the rotation, twice
			resp, body := send(t, srv, http.MethodGet, testHost, "/", nil)
			if resp.StatusCode != http.StatusOK || string(body) != "live" {
				t.Fatalf("GET %d: %d %q, want 200 \"live\"", i, resp.StatusCode, body)
			}
		}
		for _, want := range []string{`"host":"` + testHost + `"`, `"upstream":"` + dead + `"`, `"retrying":true`, "connection refused"} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("log lacks %s:\n%s", want, logs.String())
			}
		}
	})

	t.Run("POST is not retried", func(t *testing.T) {
		t.Parallel()
		_, srv, logs := gateway(t, oneRoute(healthy("wl_dead", dead), healthy("wl_live", addr(live))))
		statuses := map[int]int{}
		for range 2 { // one of the two starts at the dead upstream
			resp, body := send(t, srv, http.MethodPost, testHost, "/", strings.NewReader("secret-body-1234"))
			statuses[resp.StatusCode]++
			if resp.StatusCode == http.StatusBadGateway {
				wantProblem(t, resp, body, http.StatusBadGateway, "bad_gateway", "bad-gateway")
			}
		}
		if statuses[http.StatusOK] != 1 || statuses[http.StatusBadGateway] != 1 {
			t.Errorf("statuses = %v, want one 200 and one 502", statuses)
		}
		if strings.Contains(logs.String(), "secret-body-1234") {
			t.Errorf("the request body was logged:\n%s", logs.String())
		}
	})

	t.Run("all dead", func(t *testing.T) {
		t.Parallel()
		_, srv, _ := gateway(t, oneRoute(healthy("wl_dead1", dead), healthy("wl_dead2", deadAddr(t))))
		resp, body := send(t, srv, http.MethodGet, testHost, "/", nil)
		wantProblem(t, resp, body, http.StatusBadGateway, "bad_gateway", "bad-gateway")
	})
}

func TestSetTableConcurrentWithRequests(t *testing.T) {
	t.Parallel()
	a, b := named(t, "a"), named(t, "b")
	tables := []routes.Table{
		oneRoute(healthy("wl_a", addr(a))),
		oneRoute(healthy("wl_b", addr(b))),
		oneRoute(healthy("wl_a", addr(a)), healthy("wl_b", addr(b))),
	}
	p, srv, _ := gateway(t, tables[0])

	done := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			tb := tables[i%len(tables)]
			tb.Revision = int64(i)
			p.SetTable(tb)
			_ = p.Table()
		}
	})

	var clients sync.WaitGroup
	for range 8 {
		clients.Go(func() {
			for range 50 {
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
				if err != nil {
					t.Errorf("new request: %v", err)
					return
				}
				req.Host = testHost
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Errorf("GET: %v", err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || (string(body) != "a" && string(body) != "b") {
					t.Errorf("GET: %d %q %v, want 200 from a or b", resp.StatusCode, body, err)
					return
				}
			}
		})
	}
	clients.Wait()
	close(done)
	writer.Wait()
}

func TestTableIsCopied(t *testing.T) {
	t.Parallel()
	p := NewProxy(nil)
	if got := p.Table(); got.Revision != 0 || len(got.Routes) != 0 {
		t.Fatalf("initial table = %+v, want empty", got)
	}
	in := oneRoute(healthy("wl_a", "127.0.0.1:1"))
	in.Revision = 7
	p.SetTable(in)
	in.Routes[0].Upstreams[0].Address = "changed:1"

	got := p.Table()
	if got.Revision != 7 || got.Routes[0].Upstreams[0].Address != "127.0.0.1:1" {
		t.Fatalf("Table() = %+v, want the table as set, unaffected by the caller's later edits", got)
	}
	got.Routes[0].Hostname = "mutated"
	if again := p.Table(); again.Routes[0].Hostname != testHost {
		t.Errorf("editing Table()'s result changed the proxy's table: %+v", again)
	}
}

func TestNormalizeHost(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Example.COM":      "example.com",
		"example.com:8080": "example.com",
		"example.com.":     "example.com",
		"EXAMPLE.com.:443": "example.com",
		"[::1]:80":         "::1",
		"[::1]":            "::1",
		"10.0.0.1:80":      "10.0.0.1",
		"":                 "",
	} {
		if got := normalizeHost(in); got != want {
			t.Errorf("normalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkProxyHello(b *testing.B) {
	up := named(b, "hello")
	_, srv, _ := gateway(b, oneRoute(healthy("wl_hello", addr(up))))
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
			if err != nil {
				b.Error(err)
				return
			}
			req.Host = testHost
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Error(fmt.Errorf("status %d", resp.StatusCode))
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// TestAllowSources: a route restricted to prefixes serves clients inside
// them and refuses the others with 403 source_not_allowed, before any
// upstream sees the request; a list whose every entry is invalid lets no one
// in.
func TestAllowSources(t *testing.T) {
	t.Parallel()
	hits := make(chan string, 8)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.Host
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	route := func(host string, allow ...string) routes.Route {
		return routes.Route{Hostname: host, Project: "p", Service: host, AllowSources: allow,
			Upstreams: []routes.Upstream{healthy("wl_"+host, addr(up))}}
	}
	_, srv, logs := gateway(t, routes.Table{Revision: 1, Routes: []routes.Route{
		route("open.test"),
		route("loopback.test", "10.0.0.0/8", "127.0.0.0/8"),
		route("private.test", "10.0.0.0/8", "fd00::/8"),
		route("broken.test", "not-a-prefix"),
		route("v6.test", "::1/128"),
	}})
	for _, host := range []string{"open.test", "loopback.test"} {
		resp, body := send(t, srv, http.MethodGet, host, "/", nil)
		if resp.StatusCode != http.StatusOK || string(body) != "ok" || resp.Header.Get(gatewayHeader) != "" {
			t.Fatalf("%s from 127.0.0.1: %d %q", host, resp.StatusCode, body)
		}
		if got := <-hits; got != host {
			t.Fatalf("upstream saw host %q, want %q", got, host)
		}
	}
	for _, host := range []string{"private.test", "broken.test", "v6.test"} {
		resp, body := send(t, srv, http.MethodGet, host, "/", nil)
		pb := wantProblem(t, resp, body, http.StatusForbidden, "source_not_allowed", "source-not-allowed")
		if !strings.Contains(pb.Detail, host) {
			t.Errorf("%s: detail %q does not name the host", host, pb.Detail)
		}
	}
	select {
	case h := <-hits:
		t.Fatalf("a refused request reached the upstream (host %s)", h)
	default:
	}
	if !strings.Contains(logs.String(), "not-a-prefix") {
		t.Errorf("the invalid allow_sources entry was not logged: %s", logs.String())
	}
}

// TestAllowsComparesThePeer: the TCP peer decides, IPv4-mapped IPv6 peers
// match IPv4 prefixes, and an unparsable peer is refused.
func TestAllowsComparesThePeer(t *testing.T) {
	t.Parallel()
	p := NewProxy(nil)
	p.SetTable(routes.Table{Routes: []routes.Route{{Hostname: "a.test", AllowSources: []string{"10.0.0.0/8", "2001:db8::/32"}}}})
	rt := p.state.Load().byHost["a.test"].routes[0]
	for addr, want := range map[string]bool{
		"10.1.2.3:5":             true,
		"[::ffff:10.1.2.3]:5":    true,
		"[2001:db8::1]:443":      true,
		"11.0.0.1:5":             false,
		"[2001:db9::1]:443":      false,
		"@":                      false,
		"10.1.2.3":               false, // no port: not a peer address
		"[::ffff:192.168.0.1]:5": false,
	} {
		if got := rt.allows(addr); got != want {
			t.Errorf("allows(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestTLSModeNotServedInPlainHTTP: "none" (and empty) is plain HTTP; a route
// that needs TLS the gateway does not serve answers 421 tls_unavailable and
// never reaches its upstream in clear.
func TestTLSModeNotServedInPlainHTTP(t *testing.T) {
	t.Parallel()
	up := named(t, "a")
	mk := func(host, mode string) routes.Route {
		return routes.Route{Hostname: host, TLSMode: mode, Upstreams: []routes.Upstream{healthy("wl_"+host, addr(up))}}
	}
	_, srv, _ := gateway(t, routes.Table{Routes: []routes.Route{mk("none.test", routes.TLSNone), mk("empty.test", ""),
		mk("acme.test", routes.TLSACME), mk("passthrough.test", routes.TLSPassthrough)}})
	for _, host := range []string{"none.test", "empty.test"} {
		if resp, body := send(t, srv, http.MethodGet, host, "/", nil); resp.StatusCode != http.StatusOK || string(body) != "a" {
			t.Fatalf("%s: %d %q", host, resp.StatusCode, body)
		}
	}
	for _, host := range []string{"acme.test", "passthrough.test"} {
		resp, body := send(t, srv, http.MethodGet, host, "/", nil)
		wantProblem(t, resp, body, http.StatusMisdirectedRequest, "tls_unavailable", "tls-unavailable")
	}
}

// TestRequestAfterTheTableSwapTriesTheNewTable: a request that read the route table just before
// a swap withdrew its upstream (a rollout withdraws a workload before its node stops it) finds
// that upstream gone, and is sent to the upstream the new table names instead of answered 502.
func TestRequestAfterTheTableSwapTriesTheNewTable(t *testing.T) {
	t.Parallel()
	live := named(t, "live")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	p, srv, logs := gateway(t, oneRoute(healthy("wl_old", ln.Addr().String())))
	next := oneRoute(healthy("wl_new", addr(live)))
	next.Revision = 2
	go func() {
		// The old workload: the table moves on as its process goes, and the connection the
		// request made is reset before anything is read from it.
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.SetTable(next)
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}()
	resp, body := send(t, srv, http.MethodGet, testHost, "/", nil)
	if resp.StatusCode != http.StatusOK || string(body) != "live" {
		t.Fatalf("GET: %d %q, want 200 \"live\" from the new table's upstream\n%s", resp.StatusCode, body, logs.String())
	}
}
