package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/conformance"
	hostplugin "github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/internal/tlstest"
	"github.com/berthhq/berth/sdk/provider"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	*tlstest.CA
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	ca := tlstest.NewCA(t)
	return &testCA{CA: ca, pool: ca.Pool}
}

// issue returns a leaf for names signed by the CA, as a table Certificate
// (the chain and the key) and as the parsed leaf.
func (ca *testCA) issue(t testing.TB, names ...string) (routes.Certificate, *x509.Certificate) {
	t.Helper()
	l := ca.Issue(t, names...)
	return routes.Certificate{Names: names, CertPEM: string(l.Chain), KeyPEM: string(l.KeyPEM), NotAfter: l.Cert.NotAfter}, l.Cert
}

// tlsGateway is a Proxy behind a real plain listener and a real TLS
// listener, with its log and metrics.
type tlsGateway struct {
	p      *Proxy
	plain  *httptest.Server
	tlsLn  *TLSListener
	tlsSrv *http.Server
	logs   *syncbuf.Buffer
}

func startTLSGateway(t testing.TB, table routes.Table) *tlsGateway {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	p := NewProxyWithConfig(Config{
		Logger:    slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:   prometheus.NewRegistry(),
		HTTPSPort: raw.Addr().(*net.TCPAddr).Port,
	})
	if err := table.Validate(); err != nil {
		t.Fatalf("test table: %v", err)
	}
	p.SetTable(table)
	g := &tlsGateway{p: p, plain: httptest.NewServer(p), tlsLn: p.NewTLSListener(raw), tlsSrv: p.NewTLSServer(), logs: logs}
	served := make(chan error, 1)
	go func() { served <- g.tlsSrv.Serve(g.tlsLn) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.tlsSrv.Shutdown(ctx); err != nil {
			t.Errorf("shut the TLS server down: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("TLS server ended with %v", err)
		}
		if err := g.tlsLn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("close the TLS listener: %v", err)
		}
		g.plain.Close()
		_ = p.Close()
	})
	return g
}

// client returns an HTTPS client that dials the gateway's TLS listener for
// every host and verifies against roots; protos are its ALPN offers (nil:
// h2 and http/1.1).
func (g *tlsGateway) client(t testing.TB, roots *x509.CertPool, protos ...string) *http.Client {
	t.Helper()
	addr := g.tlsLn.Addr().String()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots, NextProtos: protos},
		ForceAttemptHTTP2: len(protos) == 0,
	}
	if len(protos) > 0 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1 only
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// handshake dials the TLS listener with SNI name and returns the state or
// the handshake's error.
func (g *tlsGateway) handshake(t testing.TB, name string, roots *x509.CertPool) (tls.ConnectionState, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", g.tlsLn.Addr().String(), &tls.Config{ServerName: name, RootCAs: roots})
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	return c.ConnectionState(), nil
}

// get makes one request over c and returns the response with its body.
func get(t testing.TB, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp, string(body)
}

// echoProto starts an upstream that answers its name and the
// X-Forwarded-Proto it saw.
func echoProto(t testing.TB, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name+" "+r.Header.Get("X-Forwarded-Proto"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func tlsRoute(host, mode string, up *httptest.Server) routes.Route {
	return routes.Route{Hostname: host, Project: "prj_t", Service: strings.Split(host, ".")[0], TLSMode: mode,
		Upstreams: []routes.Upstream{healthy("wl_"+host, addr(up))}}
}

// TestTLSChoosesCertificateBySNI: exact names win over wildcards, wildcards
// cover one label, the chain verifies against the CA, h2 is negotiated by
// ALPN (HTTP/1.1 when the client offers only that), HSTS is sent over TLS,
// and names without a route or a certificate fail their handshake, logged
// once and counted, while every other name keeps serving.
func TestTLSChoosesCertificateBySNI(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	exact, exactLeaf := ca.issue(t, "a.example.test")
	wild, wildLeaf := ca.issue(t, "*.example.test")
	up := echoProto(t, "app")
	a := tlsRoute("a.example.test", routes.TLSACME, up)
	a.HSTSMaxAgeS = 31536000
	g := startTLSGateway(t, routes.Table{Revision: 1,
		Routes: []routes.Route{a, tlsRoute("b.example.test", routes.TLSManual, up), tlsRoute("deep.b.example.test", routes.TLSACME, up),
			tlsRoute("plain.example.test", routes.TLSNone, up), tlsRoute("nocert.other.test", routes.TLSACME, up)},
		Certificates: []routes.Certificate{wild, exact}})

	c := g.client(t, ca.pool)
	for host, want := range map[string]*x509.Certificate{"a.example.test": exactLeaf, "b.example.test": wildLeaf} {
		resp, body := get(t, c, "https://"+host+"/x")
		if resp.StatusCode != http.StatusOK || body != "app https" {
			t.Fatalf("%s: %d %q", host, resp.StatusCode, body)
		}
		if resp.Proto != "HTTP/2.0" {
			t.Errorf("%s: proto %s, want HTTP/2.0 by ALPN", host, resp.Proto)
		}
		if got := resp.TLS.PeerCertificates[0]; !got.Equal(want) {
			t.Errorf("%s: served the certificate for %v, want the one for %v", host, got.DNSNames, want.DNSNames)
		}
	}
	resp, _ := get(t, c, "https://a.example.test/")
	if got := resp.Header.Get("Strict-Transport-Security"); got != "max-age=31536000" {
		t.Errorf("HSTS over TLS = %q", got)
	}
	resp, _ = get(t, c, "https://b.example.test/")
	if got := resp.Header.Get("Strict-Transport-Security"); got != "" {
		t.Errorf("HSTS on a route without hsts_max_age_s = %q", got)
	}
	if resp, body := get(t, g.client(t, ca.pool, "http/1.1"), "https://a.example.test/"); resp.Proto != "HTTP/1.1" || body != "app https" {
		t.Errorf("an HTTP/1.1-only client: %s %q", resp.Proto, body)
	}

	failures := []struct{ name, reason string }{
		{"unknown.test", failNoRoute},
		{"plain.example.test", failNoRoute}, // tls_mode none is never terminated
		{"deep.b.example.test", failNoCertificate},
		{"nocert.other.test", failNoCertificate},
	}
	for _, f := range failures {
		for range 2 {
			if _, err := g.handshake(t, f.name, ca.pool); err == nil {
				t.Fatalf("%s: the handshake succeeded", f.name)
			}
		}
	}
	if _, err := g.handshake(t, "", ca.pool); err == nil { // an IP client sends no SNI
		t.Fatal("a handshake without SNI succeeded")
	}
	for reason, want := range map[string]float64{failNoRoute: 4, failNoCertificate: 4, failNoSNI: 1} {
		if got := testutil.ToFloat64(g.p.obs.handshakes.WithLabelValues(reason)); got != want {
			t.Errorf("handshake failures %s = %v, want %v", reason, got, want)
		}
	}
	for _, f := range failures {
		if n := strings.Count(g.logs.String(), `"server_name":"`+f.name+`","reason":"`+f.reason+`"`); n != 1 {
			t.Errorf("%s: logged %d times, want once", f.name, n)
		}
	}
	// Every other name still serves, on a fresh connection.
	if resp, body := get(t, g.client(t, ca.pool), "https://a.example.test/"); resp.StatusCode != http.StatusOK || body != "app https" {
		t.Errorf("after the failures: %d %q", resp.StatusCode, body)
	}
	// A new table logs the names again.
	g.p.SetTable(g.p.Table())
	if _, err := g.handshake(t, "unknown.test", ca.pool); err == nil {
		t.Fatal("unknown.test: the handshake succeeded")
	}
	if n := strings.Count(g.logs.String(), `"server_name":"unknown.test","reason"`); n != 2 {
		t.Errorf("unknown.test logged %d times after a new table, want 2", n)
	}
}

// TestPlainHTTPForTLSRoutes: the plain listener answers HTTP-01 before any
// redirect or route (excluded hosts too), redirects with 308 to https://
// keeping the path and query once a certificate covers the name, answers
// 421 before that and without https_redirect, and never sends HSTS.
func TestPlainHTTPForTLSRoutes(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	cert, _ := ca.issue(t, "a.example.test")
	up := echoProto(t, "app")
	a := tlsRoute("a.example.test", routes.TLSACME, up)
	a.HTTPSRedirect, a.HSTSMaxAgeS = true, 600
	pending := tlsRoute("pending.example.test", routes.TLSACME, up)
	pending.HTTPSRedirect = true
	pass := tlsRoute("pass.example.test", routes.TLSPassthrough, up)
	pass.HTTPSRedirect = true
	g := startTLSGateway(t, routes.Table{Revision: 1,
		Routes:       []routes.Route{a, pending, pass, tlsRoute("noredirect.example.test", routes.TLSACME, up), tlsRoute("plain.example.test", routes.TLSNone, up)},
		Certificates: []routes.Certificate{cert, {Names: []string{"noredirect.example.test"}, CertPEM: cert.CertPEM, KeyPEM: cert.KeyPEM}},
		Challenges: []routes.Challenge{{Host: "a.example.test", Token: "tok_A-1", KeyAuth: "tok_A-1.thumbprint"},
			{Host: "pending.example.test", Token: "tok2", KeyAuth: "tok2.thumb"}, {Host: "gone.example.test", Token: "tok3", KeyAuth: "tok3.thumb"}},
		Excluded: []routes.Exclusion{{Hostname: "gone.example.test", Reason: "claimed by prj_a/web and prj_b/www"}},
	})
	port := strconv.Itoa(g.tlsLn.Addr().(*net.TCPAddr).Port)

	for _, tc := range []struct{ host, token, want string }{
		{"a.example.test", "tok_A-1", "tok_A-1.thumbprint"},
		{"pending.example.test", "tok2", "tok2.thumb"},
		{"gone.example.test", "tok3", "tok3.thumb"},
	} {
		resp, body := sendPlain(t, g.plain, http.MethodGet, tc.host, "/.well-known/acme-challenge/"+tc.token, nil)
		if resp.StatusCode != http.StatusOK || string(body) != tc.want || resp.Header.Get("Content-Type") != "text/plain" {
			t.Errorf("HTTP-01 %s: %d %q %s", tc.host, resp.StatusCode, body, resp.Header.Get("Content-Type"))
		}
	}
	// Another host's token, or an unknown one, is not answered.
	if resp, _ := sendPlain(t, g.plain, http.MethodGet, "a.example.test", "/.well-known/acme-challenge/tok2", nil); resp.StatusCode != http.StatusPermanentRedirect {
		t.Errorf("another host's token: %d, want the route's redirect", resp.StatusCode)
	}

	resp, _ := sendPlain(t, g.plain, http.MethodGet, "a.example.test", "/shop/cart?item=7&q=a%20b", nil)
	if resp.StatusCode != http.StatusPermanentRedirect {
		t.Fatalf("redirect: %d", resp.StatusCode)
	}
	if got, want := resp.Header.Get("Location"), "https://a.example.test:"+port+"/shop/cart?item=7&q=a%20b"; got != want {
		t.Errorf("Location %q, want %q", got, want)
	}
	if got := resp.Header.Get("Strict-Transport-Security"); got != "" {
		t.Errorf("HSTS over plain HTTP: %q", got)
	}
	if resp, _ := sendPlain(t, g.plain, http.MethodPost, "pass.example.test", "/p?x=1", strings.NewReader("x")); resp.StatusCode != http.StatusPermanentRedirect ||
		resp.Header.Get("Location") != "https://pass.example.test:"+port+"/p?x=1" {
		t.Errorf("passthrough redirect: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, host := range []string{"pending.example.test", "noredirect.example.test"} {
		resp, body := sendPlain(t, g.plain, http.MethodGet, host, "/", nil)
		wantProblem(t, resp, body, http.StatusMisdirectedRequest, "tls_unavailable", "tls-unavailable")
	}
	if resp, body := sendPlain(t, g.plain, http.MethodGet, "plain.example.test", "/", nil); resp.StatusCode != http.StatusOK || string(body) != "app http" {
		t.Errorf("plain route: %d %q", resp.StatusCode, body)
	}
	// Over TLS the route is served, with HSTS, and the challenge path is
	// the application's.
	c := g.client(t, ca.pool)
	resp, body := get(t, c, "https://a.example.test/.well-known/acme-challenge/tok_A-1")
	if resp.StatusCode != http.StatusOK || body != "app https" || resp.Header.Get("Strict-Transport-Security") != "max-age=600" {
		t.Errorf("over TLS: %d %q HSTS %q", resp.StatusCode, body, resp.Header.Get("Strict-Transport-Security"))
	}
}

// TestPassthroughBySNI: a passthrough route's connections reach its
// upstream still encrypted, so the client sees the upstream's own
// certificate; a dead upstream is skipped; terminated routes on the same
// listener keep working.
func TestPassthroughBySNI(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	upCert, upLeaf := ca.issue(t, "pass.example.test")
	kp, err := tls.X509KeyPair([]byte(upCert.CertPEM), []byte(upCert.KeyPEM))
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "upstream saw "+r.Host+" "+r.TLS.ServerName+" "+r.URL.RequestURI())
	}))
	upstream.TLS = &tls.Config{Certificates: []tls.Certificate{kp}}
	upstream.StartTLS()
	t.Cleanup(upstream.Close)
	gwCert, gwLeaf := ca.issue(t, "term.example.test")
	pass := routes.Route{Hostname: "pass.example.test", Project: "prj_t", Service: "pass", TLSMode: routes.TLSPassthrough,
		Upstreams: []routes.Upstream{healthy("wl_dead", deadAddr(t)), healthy("wl_up", addr(upstream))}}
	g := startTLSGateway(t, routes.Table{Revision: 1,
		Routes:       []routes.Route{pass, tlsRoute("term.example.test", routes.TLSACME, echoProto(t, "term"))},
		Certificates: []routes.Certificate{gwCert}})

	for i := range 4 { // round robin meets the dead upstream half the time
		c := g.client(t, ca.pool)
		resp, body := get(t, c, "https://pass.example.test/p?i="+strconv.Itoa(i))
		if want := "upstream saw pass.example.test pass.example.test /p?i=" + strconv.Itoa(i); resp.StatusCode != http.StatusOK || body != want {
			t.Fatalf("passthrough: %d %q, want %q", resp.StatusCode, body, want)
		}
		if got := resp.TLS.PeerCertificates[0]; !got.Equal(upLeaf) {
			t.Fatalf("passthrough: the client saw the certificate for %v, not the upstream's", got.DNSNames)
		}
	}
	if got := testutil.ToFloat64(g.p.obs.passthrough.WithLabelValues("prj_t/pass", "relayed")); got != 4 {
		t.Errorf("passthrough connections relayed = %v, want 4", got)
	}
	resp, body := get(t, g.client(t, ca.pool), "https://term.example.test/")
	if resp.StatusCode != http.StatusOK || body != "term https" || !resp.TLS.PeerCertificates[0].Equal(gwLeaf) {
		t.Errorf("terminated beside passthrough: %d %q", resp.StatusCode, body)
	}
	// A request for the passthrough host over a connection the gateway
	// terminated is not sent on in clear.
	req, _ := http.NewRequest(http.MethodGet, "https://term.example.test/", nil)
	req.Host = "pass.example.test"
	resp2, err := g.client(t, ca.pool).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	wantProblem(t, resp2, b, http.StatusMisdirectedRequest, "tls_unavailable", "tls-unavailable")
}

// TestTLSTableSwapDropsNothing: tables that swap certificates (a renewal)
// and upstreams while clients make requests on new and kept-alive
// connections lose no request.
func TestTLSTableSwapDropsNothing(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certs := [2]routes.Certificate{}
	certs[0], _ = ca.issue(t, "a.example.test")
	certs[1], _ = ca.issue(t, "*.example.test")
	ups := [2]*httptest.Server{echoProto(t, "app"), echoProto(t, "app")}
	table := func(rev int) routes.Table {
		return routes.Table{Revision: int64(rev), Routes: []routes.Route{tlsRoute("a.example.test", routes.TLSACME, ups[rev%2])},
			Certificates: []routes.Certificate{certs[rev%2]}}
	}
	g := startTLSGateway(t, table(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const clients, perClient, swaps = 4, 100, 200
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := g.client(t, ca.pool)
			for n := range perClient {
				if ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
				if i%2 == 0 && n%10 == 0 { // half the clients also open new connections
					c.Transport.(*http.Transport).CloseIdleConnections()
				}
				resp, err := c.Get("https://a.example.test/")
				if err != nil {
					errs <- err
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || string(body) != "app https" {
					errs <- errors.New("answer " + resp.Status + " " + string(body))
				}
			}
		}()
	}
	for rev := 1; rev <= swaps && ctx.Err() == nil; rev++ {
		g.p.SetTable(table(rev))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request failed across table swaps: %v", err)
	}
}

// TestPluginKeepsKeysPrivate: the stored table holding keys is 0600, and no
// key reaches a Read or Apply answer, a log line or a metric, including
// when a certificate is refused (its key does not match).
func TestPluginKeepsKeysPrivate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	good, _ := ca.issue(t, "a.example.test")
	other, _ := ca.issue(t, "b.example.test")
	bad := routes.Certificate{Names: []string{"b.example.test"}, CertPEM: other.CertPEM, KeyPEM: good.KeyPEM, NotAfter: other.NotAfter}
	up := echoProto(t, "app")
	table := routes.Table{Revision: 1,
		Routes:       []routes.Route{tlsRoute("a.example.test", routes.TLSACME, up), tlsRoute("b.example.test", routes.TLSManual, up)},
		Certificates: []routes.Certificate{good, bad}}
	raw, err := json.Marshal(table)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	reg := prometheus.NewRegistry()
	proxy := NewProxyWithConfig(Config{Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: reg})
	t.Cleanup(func() { _ = proxy.Close() })
	dir := filepath.Join(t.TempDir(), "gateway")
	plugin, err := OpenPlugin(proxy, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
	plan, err := plugin.Plan(ctx, &provider.PlanRequest{Desired: res})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := plugin.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 1}})
	if err != nil {
		t.Fatal(err)
	}
	read, err := plugin.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, tableFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", tableFile, st.Mode().Perm())
	}
	stored, err := os.ReadFile(filepath.Join(dir, tableFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(stored, []byte(jsonString(t, good.KeyPEM))) {
		t.Error("the stored table lost the key it must serve after a restart")
	}
	metrics, err := testutil.GatherAndCount(reg)
	if err != nil || metrics == 0 {
		t.Fatalf("gather metrics: %d %v", metrics, err)
	}
	var exposed bytes.Buffer
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		exposed.WriteString(mf.String())
	}
	keyBody := strings.Split(good.KeyPEM, "\n")[1] // a line of the key's base64
	for what, out := range map[string][]byte{
		"read": read.State.Attributes, "apply": applied.State.Attributes, "log": []byte(logs.String()), "metrics": exposed.Bytes(),
	} {
		if bytes.Contains(out, []byte(keyBody)) || bytes.Contains(out, []byte("PRIVATE KEY")) || bytes.Contains(out, []byte("BEGIN CERTIFICATE")) {
			t.Errorf("%s shows a key or PEM: %s", what, out)
		}
	}
	var got struct {
		Certificates []map[string]any `json:"certificates"`
	}
	if err := json.Unmarshal(read.State.Attributes, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Certificates) != 2 || len(got.Certificates[0]) != 2 || got.Certificates[0]["names"] == nil || got.Certificates[0]["not_after"] == nil {
		t.Errorf("read lists certificates as %v, want names and not_after of each", got.Certificates)
	}
	if !strings.Contains(logs.String(), `"names":["b.example.test"]`) || testutil.ToFloat64(proxy.obs.certsRefused) != 1 {
		t.Errorf("the mismatched pair was not logged by name and counted: %s", logs.String())
	}
	// A restart serves the stored table, keys included.
	proxy2 := NewProxy(nil)
	t.Cleanup(func() { _ = proxy2.Close() })
	if _, err := OpenPlugin(proxy2, dir); err != nil {
		t.Fatal(err)
	}
	if kp := proxy2.state.Load().certificate("a.example.test"); kp == nil {
		t.Error("the reopened gateway has no certificate for a.example.test")
	}
}

// sendPlain is send without following redirects.
func sendPlain(t *testing.T, srv *httptest.Server, method, host, path string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	c := &http.Client{Transport: srv.Client().Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

func jsonString(t testing.TB, s string) string {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Trim(string(raw), `"`)
}

// TestBinaryServesTLS: berth-plugin-gateway launched through the host with
// --tls-listen serves the certificate of the applied table over h2, its
// plain listener redirects to the TLS listener's port, and the state the
// host reads back holds no key.
func TestBinaryServesTLS(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-gateway")
	if os.Getenv("BERTH_BIN_DIR") == "" {
		bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-gateway")
	}
	ca := newTestCA(t)
	cert, leaf := ca.issue(t, "*.example.test")
	up := echoProto(t, "app")
	r := tlsRoute("a.example.test", routes.TLSACME, up)
	r.HTTPSRedirect = true
	raw, err := json.Marshal(routes.Table{Revision: 1, Routes: []routes.Route{r}, Certificates: []routes.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	plainAddr, tlsAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := hostplugin.LaunchProvider(ctx, hostplugin.Config{Name: "gateway", Path: bin,
		Args: []string{"--listen", plainAddr, "--tls-listen", tlsAddr, "--state-dir", filepath.Join(t.TempDir(), "state")}})
	if err != nil {
		t.Fatalf("launch gateway: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	applied, err := g.PlanAndApply(ctx, provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw},
		pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 1})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if bytes.Contains(applied.Attributes, []byte("PRIVATE KEY")) {
		t.Errorf("the applied state shows the key: %s", applied.Attributes)
	}
	read, err := g.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(read.State.Attributes, []byte("PRIVATE KEY")) || !bytes.Contains(read.State.Attributes, []byte(`"*.example.test"`)) {
		t.Errorf("read state: %s", read.State.Attributes)
	}

	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: ca.pool}, ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	resp, body := get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://a.example.test/x")
	if resp.StatusCode != http.StatusOK || body != "app https" || resp.Proto != "HTTP/2.0" || !resp.TLS.PeerCertificates[0].Equal(leaf) {
		t.Errorf("HTTPS through the binary: %d %q %s", resp.StatusCode, body, resp.Proto)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+plainAddr+"/x?y=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "a.example.test"
	plain := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	pr, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pr.Body.Close()
	_, port, _ := net.SplitHostPort(tlsAddr)
	if pr.StatusCode != http.StatusPermanentRedirect || pr.Header.Get("Location") != "https://a.example.test:"+port+"/x?y=1" {
		t.Errorf("plain listener: %d Location %q", pr.StatusCode, pr.Header.Get("Location"))
	}
}
