package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/tlstest"
)

// tlsBenchHost is the name the HTTPS benchmark serves: wrk and h2load send
// the URL's host as SNI, and localhost resolves without DNS.
const tlsBenchHost = "localhost"

// Load of BenchmarkGatewayTLSVsNginx over HTTP/2: h2load with 2 threads, 64
// clients and 4 streams each.
const (
	h2Threads = 2
	h2Clients = 64
	h2Streams = 4
)

// benchCertificate makes a CA and a leaf for tlsBenchHost, returned as the
// table's Certificate (the chain's PEM and the key's) with the CA's pool,
// and written as cert.pem and key.pem under dir for nginx.
func benchCertificate(b *testing.B, dir string) (routes.Certificate, *x509.CertPool) {
	b.Helper()
	ca := tlstest.NewCA(b)
	leaf := ca.Issue(b, tlsBenchHost)
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), leaf.Chain, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), leaf.KeyPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	return routes.Certificate{Names: []string{tlsBenchHost}, CertPEM: string(leaf.Chain), KeyPEM: string(leaf.KeyPEM), NotAfter: leaf.Cert.NotAfter}, ca.Pool
}

// startTLSGateway launches the gateway plugin through the host with its TLS
// listener and routes tlsBenchHost (tls_mode manual, cert) to backend; it
// returns the TLS address.
func startTLSGateway(b *testing.B, bin, backend string, cert routes.Certificate) string {
	b.Helper()
	addr, tlsAddr := proctest.FreeAddr(b), proctest.FreeAddr(b)
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := plugin.LaunchProvider(ctx, plugin.Config{Name: "gateway", Path: bin,
		Args: []string{"--listen", addr, "--tls-listen", tlsAddr, "--state-dir", filepath.Join(dir, "state")}})
	if err != nil {
		b.Fatalf("launch gateway: %v", err)
	}
	b.Cleanup(func() { g.Close() })
	raw, err := json.Marshal(routes.Table{Revision: 1, Routes: []routes.Route{{Hostname: tlsBenchHost, Project: "prj_bench", Service: "hello",
		TLSMode: routes.TLSManual, Upstreams: []routes.Upstream{{WorkloadID: "wl_bench", Address: backend, Healthy: true}}}},
		Certificates: []routes.Certificate{cert}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := g.PlanAndApply(ctx, abiprovider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw},
		pluginapi.Mutation{IdempotencyKey: "bench", FencingToken: 1}); err != nil {
		b.Fatalf("apply route table: %v", err)
	}
	return tlsAddr
}

// startTLSNginx runs Debian's nginx terminating TLS (HTTP/2 and HTTP/1.1 by
// ALPN) with the certificate under certDir, as a reverse proxy to backend
// with a keep-alive pool, workers as cores, no access log; it returns the
// TLS address. HTTP/2 is set up as nginx's documentation has it for its
// version (1.22: "listen ... ssl http2"), with a shared TLS session cache,
// and client connections are kept for as many requests as the load makes:
// keepalive_requests (1000 by default, which also bounds an HTTP/2
// connection's requests since 1.19.7) closed h2load's connections every
// 1000 requests, and h2load does not open them again, so the nginx HTTP/2
// figure counted ever fewer clients.
func startTLSNginx(b *testing.B, bin, backend, certDir string) string {
	b.Helper()
	addr := proctest.FreeAddr(b)
	dir := b.TempDir()
	user := ""
	if os.Geteuid() == 0 {
		user = "user root root;" // the temporary directory is root's alone
	}
	conf := fmt.Sprintf(`%s
daemon off;
worker_processes auto;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_requests 1000000;
  upstream backend { server %[3]s; keepalive 256; keepalive_requests 1000000; }
  server {
    listen %[4]s ssl http2;
    server_name %[5]s;
    ssl_certificate %[6]s/cert.pem;
    ssl_certificate_key %[6]s/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
    ssl_session_timeout 1h;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto https;
    }
  }
}
`, user, dir, backend, addr, tlsBenchHost, certDir)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path, "-p", dir, "-e", filepath.Join(dir, "error.log"))
	p := proctest.StartCmd(b, filepath.Join(dir, "stdout.log"), cmd)
	b.Cleanup(p.Stop)
	return addr
}

// waitHTTPS waits (at most 30 s) until addr answers 200 over TLS for
// tlsBenchHost with a certificate that verifies against roots, in HTTP/2.
func waitHTTPS(b *testing.B, addr string, roots *x509.CertPool) {
	b.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	proctest.WaitFor(b, 30*time.Second, "HTTPS at "+addr+" answering", func() (bool, string) {
		resp, err := c.Get("https://" + tlsBenchHost + "/")
		if err != nil {
			return false, err.Error()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && resp.Proto == "HTTP/2.0", resp.Status + " " + resp.Proto
	})
}

// runWrkTLS loads https://tlsBenchHost at addr's port with wrk for d.
func runWrkTLS(b *testing.B, wrk, addr string, d time.Duration) wrkResult {
	b.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, wrk, "-t", strconv.Itoa(gatewayWrkThreads), "-c", strconv.Itoa(gatewayWrkConns),
		"-d", strconv.Itoa(int(d.Seconds()))+"s", "--latency", "https://"+tlsBenchHost+":"+port+"/").CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	return parseWrk(b, out)
}

// parseWrk reads a wrk --latency report.
func parseWrk(b *testing.B, out []byte) wrkResult {
	b.Helper()
	var r wrkResult
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk printed no Requests/sec:\n%s", out)
	}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, pm := range wrkPct.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(pm[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(pm[3])]
		if string(pm[1]) == "99" {
			r.p99 = time.Duration(v * float64(unit))
		}
	}
	if r.p99 == 0 {
		b.Fatalf("wrk printed no 99%% latency:\n%s", out)
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		r.errors += n
	}
	if m := wrkSockErr.FindSubmatch(out); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.ParseInt(string(s), 10, 64)
			r.errors += n
		}
	}
	return r
}

var (
	h2RPS      = regexp.MustCompile(`finished in [0-9.]+m?s, ([0-9.]+) req/s`)
	h2Requests = regexp.MustCompile(`requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2Codes    = regexp.MustCompile(`status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx`)
)

// runH2load loads https://tlsBenchHost at addr's port over HTTP/2 with
// h2load for d after warmup; p99 comes from h2load's per-request log.
func runH2load(b *testing.B, h2load, addr string, warmup, d time.Duration) wrkResult {
	b.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(b.TempDir(), "h2load.log")
	ctx, cancel := context.WithTimeout(context.Background(), warmup+d+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, h2load, "-t", strconv.Itoa(h2Threads), "-c", strconv.Itoa(h2Clients), "-m", strconv.Itoa(h2Streams),
		"--warm-up-time="+strconv.Itoa(int(warmup.Seconds()))+"s", "-D", strconv.Itoa(int(d.Seconds())),
		"--log-file="+logPath, "https://"+tlsBenchHost+":"+port+"/").CombinedOutput()
	if err != nil {
		b.Fatalf("h2load: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("Application protocol: h2")) {
		b.Fatalf("h2load did not negotiate h2:\n%s", out)
	}
	var r wrkResult
	m := h2RPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("h2load printed no req/s:\n%s", out)
	}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	// With -D, the requests in flight when the time is over are counted
	// as failed and errored: at most one per stream.
	m = h2Requests.FindSubmatch(out)
	if m == nil {
		b.Fatalf("h2load printed no request counts:\n%s", out)
	}
	if failed, _ := strconv.Atoi(string(m[1])); failed > h2Clients*h2Streams {
		r.errors += int64(failed)
	}
	if timeouts, _ := strconv.Atoi(string(m[3])); timeouts > 0 {
		r.errors += int64(timeouts)
	}
	m = h2Codes.FindSubmatch(out)
	if m == nil {
		b.Fatalf("h2load printed no status codes:\n%s", out)
	}
	for _, s := range m[1:] {
		n, _ := strconv.ParseInt(string(s), 10, 64)
		r.errors += n
	}
	if r.errors > 0 {
		b.Fatalf("h2load at %s: %d failed requests:\n%s", addr, r.errors, out)
	}
	r.p99 = h2loadP99(b, logPath)
	return r
}

// h2loadP99 is the 99th percentile of the request durations (third
// column, microseconds) in an h2load --log-file.
func h2loadP99(b *testing.B, path string) time.Duration {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var us []int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		v, err := strconv.ParseInt(fields[2], 10, 64)
		if err == nil {
			us = append(us, v)
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if len(us) == 0 {
		b.Fatalf("h2load logged no requests in %s", path)
	}
	slices.Sort(us)
	return time.Duration(us[(len(us)*99)/100]) * time.Microsecond
}

// BenchmarkGatewayTLSVsNginx measures requests/s and p99 of small responses
// over HTTPS, terminated by the gateway plugin (launched through
// host/plugin, with the certificate in its route table, tls_mode manual),
// by Debian's nginx and by Caddy with the same certificate file pair, all
// proxying to the same backend in this process. Each is loaded in turn,
// alternating over gatewayRounds rounds, by wrk (HTTP/1.1 over TLS, -t2
// -c64, 8 s after a 2 s warm-up) and by h2load (HTTP/2 by ALPN, -t2 -c64
// -m4, the same times, the same settings for every proxy); each figure is
// the median of its rounds. Figures: <proxy>_https_<h1|h2>_req/s and
// _p99_ms, and the gateway's ratios of requests/s and of p99 to nginx's
// (gateway_https_<h1|h2>_rps_ratio, _p99_ratio) and to Caddy's (_rps_vs_caddy,
// _p99_vs_caddy). The scenario runs once whatever b.N.
func BenchmarkGatewayTLSVsNginx(b *testing.B) {
	gw, ngx, wrk, h2load := gatewayBinary(b), lookTool(b, "nginx"), lookTool(b, "wrk"), lookTool(b, "h2load")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello, world\n")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = backend.Serve(ln) }()
	b.Cleanup(func() { backend.Close() })
	certDir := b.TempDir()
	cert, roots := benchCertificate(b, certDir)

	b.StopTimer()
	at := map[string]string{
		"nginx":   startTLSNginx(b, ngx, ln.Addr().String(), certDir),
		"caddy":   startCaddy(b, caddyPeer{backend: ln.Addr().String(), certDir: certDir}),
		"gateway": startTLSGateway(b, gw, ln.Addr().String(), cert),
	}
	rounds := map[string][]wrkResult{}
	for round := range gatewayRounds {
		for _, proxy := range gatewayPeers {
			waitHTTPS(b, at[proxy], roots)
			runWrkTLS(b, wrk, at[proxy], gatewayWarmup)
			b.StartTimer()
			h1 := runWrkTLS(b, wrk, at[proxy], gatewayLoad)
			h2 := runH2load(b, h2load, at[proxy], gatewayWarmup, gatewayLoad)
			b.StopTimer()
			for name, r := range map[string]wrkResult{"h1": h1, "h2": h2} {
				if r.errors > 0 {
					b.Fatalf("%s (%s): %d failed requests under load", proxy, name, r.errors)
				}
				rounds[proxy+"_https_"+name] = append(rounds[proxy+"_https_"+name], r)
				b.Logf("round %d, %s, %s: %.0f req/s, p99 %s", round+1, proxy, name, r.rps, r.p99)
			}
		}
	}
	med := map[string]wrkResult{}
	for key, rs := range rounds {
		med[key] = medianResult(rs)
		b.ReportMetric(med[key].rps, key+"_req/s")
		b.ReportMetric(float64(med[key].p99.Microseconds())/1000, key+"_p99_ms")
	}
	for _, proto := range []string{"h1", "h2"} {
		reportRatios(b, med, "gateway_https_"+proto, "gateway_https_"+proto)
	}
	b.StartTimer()
}
