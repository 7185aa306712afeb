package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/syncbuf"
)

// TestTimeoutsAnswer504AndRefusalsAnswer502: an upstream slower than the
// route's response_header_ms gets 504 gateway_timeout (not retried: the
// upstream may be doing the work), a refused connection 502 bad_gateway, and
// both are counted as upstream errors of their kind.
func TestTimeoutsAnswer504AndRefusalsAnswer502(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); slow.Close() })
	reg := prometheus.NewRegistry()
	p := NewProxyWithConfig(Config{Metrics: reg})
	t.Cleanup(func() { p.Close() })
	p.SetTable(routes.Table{Revision: 1, Routes: []routes.Route{
		{Hostname: "slow.test", Project: "p", Service: "slow", Timeouts: routes.Timeouts{ResponseHeaderMS: 100},
			Upstreams: []routes.Upstream{healthy("wl_slow", addr(slow))}},
		{Hostname: "dead.test", Project: "p", Service: "dead", Upstreams: []routes.Upstream{healthy("wl_dead", deadAddr(t))}},
	}})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	resp, body := send(t, srv, http.MethodGet, "slow.test", "/", nil)
	wantProblem(t, resp, body, http.StatusGatewayTimeout, "gateway_timeout", "gateway-timeout")
	resp, body = send(t, srv, http.MethodGet, "dead.test", "/", nil)
	wantProblem(t, resp, body, http.StatusBadGateway, "bad_gateway", "bad-gateway")

	if got := testutil.ToFloat64(p.obs.upstreamErrors.WithLabelValues("p/slow", addr(slow), "timeout")); got != 1 {
		t.Errorf("timeout errors of p/slow = %v, want 1", got)
	}
	dead := p.Table().Routes[1].Upstreams[0].Address
	if got := testutil.ToFloat64(p.obs.upstreamErrors.WithLabelValues("p/dead", dead, "refused")); got != 1 {
		t.Errorf("refused errors of p/dead = %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.obs.requests.WithLabelValues("p/slow", "5xx", "-")); got != 1 {
		t.Errorf("5xx requests of p/slow = %v, want 1", got)
	}
}

// TestH2CFromClientsHTTP1ToUpstreams: a client speaking HTTP/2 without TLS
// (prior knowledge) is served in HTTP/2, and the upstream sees HTTP/1.1.
func TestH2CFromClientsHTTP1ToUpstreams(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Proto
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	p := NewProxy(nil)
	p.SetTable(oneRoute(healthy("wl_1", addr(up))))
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = NewServer(p)
	srv.Start()
	t.Cleanup(srv.Close)

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = testHost
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("h2c GET: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Fatalf("h2c GET = %s %d %q, want HTTP/2.0 200 \"ok\"", resp.Proto, resp.StatusCode, body)
	}
	if got := <-seen; got != "HTTP/1.1" {
		t.Fatalf("upstream saw %s, want HTTP/1.1", got)
	}
}

// TestRequestID: a usable client id is kept, end to end; a missing or
// unusable one is replaced by a new one, distinct per request; the upstream
// and the client see the same id.
func TestRequestID(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Join(r.Header.Values(RequestIDHeader), ","))
	}))
	t.Cleanup(up.Close)
	_, srv, _ := gateway(t, oneRoute(healthy("wl_1", addr(up))))
	get := func(id ...string) (string, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = testHost
		for _, v := range id {
			req.Header.Add(RequestIDHeader, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.Header.Get(RequestIDHeader)
	}
	if up, back := get("client-id-1"); up != "client-id-1" || back != "client-id-1" {
		t.Errorf("client id: upstream saw %q, client got %q; want client-id-1 for both", up, back)
	}
	a, backA := get()
	b, _ := get()
	if len(a) != 32 || a != backA || a == b {
		t.Errorf("generated ids %q (client got %q) and %q: want 32 hex digits, the same at both ends, distinct", a, backA, b)
	}
	for _, bad := range [][]string{{"has space"}, {strings.Repeat("x", 129)}, {"one", "two"}} {
		if got, _ := get(bad...); got == strings.Join(bad, ",") || len(got) != 32 {
			t.Errorf("unusable id %q reached the upstream as %q", bad, got)
		}
	}
}

// TestAccessLogAndRequestMetrics: every request gives one JSON line with the
// fields the access log promises (and never the query), and the requests
// counter and latency histogram move with bounded labels: a host without a
// route is counted under service "-", not under its name.
func TestAccessLogAndRequestMetrics(t *testing.T) {
	t.Parallel()
	up := named(t, "hello")
	var logBuf syncbuf.Buffer
	reg := prometheus.NewRegistry()
	p := NewProxyWithConfig(Config{Metrics: reg, AccessLog: &logBuf})
	p.SetTable(oneRoute(healthy("wl_1", addr(up))))
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	send(t, srv, http.MethodGet, testHost, "/a/b?token=secret", nil)
	send(t, srv, http.MethodGet, "random-12345.test", "/", nil)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader([]byte(logBuf.String())))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("access log line %q is not JSON: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("access log has %d lines, want 2:\n%s", len(lines), logBuf.String())
	}
	l := lines[0]
	for k, want := range map[string]any{"host": testHost, "method": "GET", "path": "/a/b", "status": 200.0, "bytes": 5.0,
		"upstream": addr(up), "service": "prj_test/web"} {
		if l[k] != want {
			t.Errorf("access log %s = %v, want %v", k, l[k], want)
		}
	}
	if id, _ := l["request_id"].(string); len(id) != 32 {
		t.Errorf("access log request_id = %v", l["request_id"])
	}
	if _, ok := l["duration_ms"].(float64); !ok {
		t.Errorf("access log duration_ms = %v", l["duration_ms"])
	}
	if strings.Contains(logBuf.String(), "secret") {
		t.Errorf("the query reached the access log:\n%s", logBuf.String())
	}
	if lines[1]["status"] != 404.0 {
		t.Errorf("second line status %v, want 404", lines[1]["status"])
	}

	if got := testutil.ToFloat64(p.obs.requests.WithLabelValues("prj_test/web", "2xx", addr(up))); got != 1 {
		t.Errorf("2xx requests = %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.obs.requests.WithLabelValues("-", "4xx", "-")); got != 1 {
		t.Errorf("unrouted 4xx requests = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(p.obs.duration); n != 2 {
		t.Errorf("latency histogram has %d series, want 2", n)
	}
	out, err := testutil.CollectAndLint(p.obs.requests)
	if err != nil || len(out) != 0 {
		t.Errorf("lint: %v %v", out, err)
	}
	if strings.Contains(promText(t, reg), "random-12345") {
		t.Error("a client's Host header became a label value")
	}

	// The upstream leaves the table: its series go with it.
	p.SetTable(routes.Table{Revision: 2})
	if n := testutil.CollectAndCount(p.obs.requests); n != 1 {
		t.Errorf("after the route left the table, %d request series remain, want only the unrouted one", n)
	}
}

func promText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		b.WriteString(f.String())
	}
	return b.String()
}

// TestStreamRouteFlushesEveryWrite: a route with stream set delivers what
// the upstream flushed even when the response has a Content-Length (which
// otherwise is written in full buffers).
func TestStreamRouteFlushesEveryWrite(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "13")
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(up.Close)
	tb := oneRoute(healthy("wl_1", addr(up)))
	tb.Routes[0].Stream = true
	_, srv, _ := gateway(t, tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = testHost
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "first\n" {
		t.Fatalf("first line %q, %v (the deadline ends a gateway that buffered it)", first, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestKnownLengthBodyTrickles: on a route that does not stream, a response
// with a Content-Length whose body is still incomplete after a write
// reaches the client without waiting for the rest (the gateway flushes it
// at most bufferedFlush later), as a slow download or a drip must.
func TestKnownLengthBodyTrickles(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "13")
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(up.Close)
	_, srv, _ := gateway(t, oneRoute(healthy("wl_1", addr(up))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = testHost
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "first\n" {
		t.Fatalf("first line %q, %v (the deadline ends a gateway that held it)", first, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestUpgradeThroughRecorder: a protocol upgrade (as WebSocket does) passes
// through the gateway's response recorder: 101, then bytes both ways, and
// the access log records the 101.
func TestUpgradeThroughRecorder(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = brw.WriteString(line)
		_ = brw.Flush()
	}))
	t.Cleanup(up.Close)
	var logBuf syncbuf.Buffer
	p := NewProxyWithConfig(Config{AccessLog: &logBuf})
	p.SetTable(oneRoute(healthy("wl_1", addr(up))))
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	conn, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: "+testHost+"\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answer %v, %v; want 101", resp, err)
	}
	if _, err := io.WriteString(conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := br.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("echo %q, %v", got, err)
	}
	conn.Close()
	// The upgraded request ends when the tunnel closes; then it is logged.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logBuf.String(), `"status":101`) {
		if time.Now().After(deadline) {
			p.Close()
			t.Fatalf("access log after the upgrade: %q", logBuf.String())
		}
		p.Close() // flushes; later lines are written through
		time.Sleep(10 * time.Millisecond)
	}
}

// blockedWriter is an access log destination whose writes wait until
// release is closed.
type blockedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	n       int
}

func (w *blockedWriter) Write(b []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(b)
	return len(b), nil
}

// TestAccessLogWritesOffTheRequestPath: requests add their lines to the
// access log without waiting for its file, even while a write to it hangs,
// until accessLogMaxPending bytes wait; every line is written in the end.
func TestAccessLogWritesOffTheRequestPath(t *testing.T) {
	w := &blockedWriter{release: make(chan struct{})}
	l := newAccessLog(w, slog.New(slog.DiscardHandler))
	req := httptest.NewRequest(http.MethodGet, "http://"+testHost+"/", nil)
	rec := &recorder{id: "id", status: http.StatusOK, start: time.Now()}
	done := make(chan int, 1)
	go func() {
		total := 0
		for total < 2*accessLogBatch { // past the batch size: the file write starts and hangs
			l.write(rec, req, time.Millisecond)
			total += len(rec.line)
		}
		done <- total
	}()
	var total int
	select {
	case total = <-done:
	case <-time.After(30 * time.Second):
		close(w.release)
		t.Fatal("requests waited for the access log's file")
	}
	close(w.release)
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n != total {
		t.Fatalf("wrote %d bytes of %d", w.n, total)
	}
}
