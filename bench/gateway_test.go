package bench

import (
	"context"
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
)

// Load of BenchmarkGatewayVsNginx: wrk with 2 threads and 64 connections for
// gatewayLoad against each proxy in turn, after a short warm-up.
const (
	gatewayWrkThreads = 2
	gatewayWrkConns   = 64
	gatewayLoad       = 8 * time.Second
	gatewayWarmup     = 2 * time.Second
	gatewayHost       = "bench.test"
)

// gatewayBinary returns berth-plugin-gateway from make build (BERTH_BIN_DIR overrides bin/).
func gatewayBinary(b *testing.B) string {
	b.Helper()
	dir := os.Getenv("BERTH_BIN_DIR")
	if dir == "" {
		dir = "bin"
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(moduleRoot(b), dir)
	}
	bin := filepath.Join(dir, "berth-plugin-gateway")
	if _, err := os.Stat(bin); err != nil {
		b.Fatalf("%s: %v (run make build, or set BERTH_BIN_DIR)", bin, err)
	}
	return bin
}

// lookTool finds a program the benchmark needs; scripts/install-bench-tools.sh
// (run by make bench) installs them from Debian.
func lookTool(b *testing.B, name string) string {
	b.Helper()
	for _, p := range []string{name, "/usr/sbin/" + name} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	b.Fatalf("%s not found: run scripts/install-bench-tools.sh (make bench does)", name)
	return ""
}

// startGateway launches the gateway plugin through the host, with or without
// its access log, and routes gatewayHost to backend.
func startGateway(b *testing.B, bin, backend string, accessLog bool) string {
	b.Helper()
	addr := proctest.FreeAddr(b)
	dir := b.TempDir()
	args := []string{"--listen", addr, "--state-dir", filepath.Join(dir, "state")}
	if accessLog {
		args = append(args, "--access-log", filepath.Join(dir, "access.log"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := plugin.LaunchProvider(ctx, plugin.Config{Name: "gateway", Path: bin, Args: args})
	if err != nil {
		b.Fatalf("launch gateway: %v", err)
	}
	b.Cleanup(func() { g.Close() })
	raw, err := json.Marshal(routes.Table{Revision: 1, Routes: []routes.Route{{Hostname: gatewayHost, Project: "prj_bench", Service: "hello",
		Upstreams: []routes.Upstream{{WorkloadID: "wl_bench", Address: backend, Healthy: true}}}}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := g.PlanAndApply(ctx, abiprovider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw},
		pluginapi.Mutation{IdempotencyKey: "bench", FencingToken: 1}); err != nil {
		b.Fatalf("apply route table: %v", err)
	}
	return addr
}

// startNginx runs Debian's nginx as a reverse proxy to backend with a
// configuration in a temporary directory: as many workers as cores, a
// keep-alive pool to the backend, the access log on or off. Connections
// are kept on both sides for as many requests as the load makes
// (keepalive_requests, 1000 by default, would close them every 1000
// requests, which neither the gateway nor Caddy does).
func startNginx(b *testing.B, bin, backend string, accessLog bool) string {
	b.Helper()
	addr := proctest.FreeAddr(b)
	dir := b.TempDir()
	logLine := "access_log off;"
	if accessLog {
		logLine = "access_log " + filepath.Join(dir, "access.log") + ";"
	}
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
  %[3]s
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_requests 1000000;
  upstream backend { server %[4]s; keepalive 256; keepalive_requests 1000000; }
  server {
    listen %[5]s;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }
  }
}
`, user, dir, logLine, backend, addr)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path, "-p", dir, "-e", filepath.Join(dir, "error.log"))
	p := proctest.StartCmd(b, filepath.Join(dir, "stdout.log"), cmd)
	b.Cleanup(p.Stop) // SIGTERM: nginx's fast shutdown, workers included
	waitAnswer(b, addr)
	return addr
}

// waitAnswer waits (at most 30 s) until addr answers 200 for gatewayHost.
func waitAnswer(b *testing.B, addr string) {
	b.Helper()
	proctest.WaitFor(b, 30*time.Second, "proxy at "+addr+" answering", func() (bool, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		req.Host = gatewayHost
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// wrkResult is what one wrk run measured.
type wrkResult struct {
	rps    float64
	p50    time.Duration
	p99    time.Duration
	errors int64 // non-2xx/3xx answers and socket errors
}

var (
	wrkRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct     = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	wrkSockErr = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// runWrk loads addr with wrk for d and parses its report.
func runWrk(b *testing.B, wrk, addr string, d time.Duration) wrkResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, wrk, "-t", strconv.Itoa(gatewayWrkThreads), "-c", strconv.Itoa(gatewayWrkConns),
		"-d", strconv.Itoa(int(d.Seconds()))+"s", "--latency", "-H", "Host: "+gatewayHost, "http://"+addr+"/").CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	var r wrkResult
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk printed no Requests/sec:\n%s", out)
	}
	r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, pm := range wrkPct.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(pm[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(pm[3])]
		d := time.Duration(v * float64(unit))
		if string(pm[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
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

// gatewayRounds is how many times each proxy is loaded per access-log
// setting, alternating; each figure is the median of its rounds, so that a
// burst of other work on the machine moves one round, not the figure.
const gatewayRounds = 3

// gatewayPeers are the proxies the gateway benchmarks load in turn, the
// gateway last in each round.
var gatewayPeers = []string{"nginx", "caddy", "gateway"}

// BenchmarkGatewayVsNginx measures requests/s and latency percentiles of small
// responses (a 13-byte body) through the gateway plugin (launched through
// host/plugin, as berthd does), through Debian's nginx configured as a
// reverse proxy to the same backend (workers as cores, a keep-alive pool)
// and through Caddy (a reverse_proxy with the same pool), under the same
// load from wrk (-t2 -c64, 8 s after a 2 s warm-up), in one run, with the
// access log off and on. The backend is a Go HTTP server in this process;
// the proxies run one at a time, alternating over gatewayRounds rounds,
// each figure the median of its rounds. Figures: <proxy>_<log>_req/s and
// _p99_ms; the ratios gateway/nginx of requests/s and of p99
// (gateway_<log>_rps_ratio, _p99_ratio; a p99 ratio at or below 1 is "no
// worse than nginx") and gateway/Caddy (gateway_<log>_rps_vs_caddy,
// _p99_vs_caddy). The scenario runs once whatever b.N.
func BenchmarkGatewayVsNginx(b *testing.B) {
	gw, ngx, wrk := gatewayBinary(b), lookTool(b, "nginx"), lookTool(b, "wrk")
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
	addr := ln.Addr().String()

	b.ResetTimer()
	for _, logOn := range []bool{false, true} {
		suffix := "log_off"
		if logOn {
			suffix = "log_on"
		}
		b.StopTimer()
		peer := caddyPeer{backend: addr}
		if logOn {
			peer.accessLog = filepath.Join(b.TempDir(), "access.log")
		}
		at := map[string]string{
			"nginx":   startNginx(b, ngx, addr, logOn),
			"caddy":   startCaddy(b, peer),
			"gateway": startGateway(b, gw, addr, logOn),
		}
		rounds := map[string][]wrkResult{}
		for round := range gatewayRounds {
			for _, proxy := range gatewayPeers {
				waitAnswer(b, at[proxy])
				runWrk(b, wrk, at[proxy], gatewayWarmup)
				b.StartTimer()
				r := runWrk(b, wrk, at[proxy], gatewayLoad)
				b.StopTimer()
				if r.errors > 0 {
					b.Fatalf("%s (%s): %d failed requests under load", proxy, suffix, r.errors)
				}
				rounds[proxy] = append(rounds[proxy], r)
				b.Logf("round %d, %s, access log %s: %.0f req/s, p50 %s, p99 %s", round+1, proxy, strings.TrimPrefix(suffix, "log_"), r.rps, r.p50, r.p99)
			}
		}
		med := map[string]wrkResult{}
		for proxy, rs := range rounds {
			med[proxy] = medianResult(rs)
			b.ReportMetric(med[proxy].rps, proxy+"_"+suffix+"_req/s")
			b.ReportMetric(float64(med[proxy].p99.Microseconds())/1000, proxy+"_"+suffix+"_p99_ms")
		}
		reportRatios(b, med, "gateway", "gateway_"+suffix)
		b.StartTimer()
	}
}

// reportRatios reports the ratios of requests/s and of p99 of med[key] to
// nginx's (name_rps_ratio, name_p99_ratio) and to Caddy's
// (name_rps_vs_caddy, name_p99_vs_caddy), the peers' results being under
// key with "gateway" replaced by their name.
func reportRatios(b *testing.B, med map[string]wrkResult, key, name string) {
	g := med[key]
	n, c := med[strings.Replace(key, "gateway", "nginx", 1)], med[strings.Replace(key, "gateway", "caddy", 1)]
	b.ReportMetric(g.rps/n.rps, name+"_rps_ratio")
	b.ReportMetric(float64(g.p99)/float64(n.p99), name+"_p99_ratio")
	b.ReportMetric(g.rps/c.rps, name+"_rps_vs_caddy")
	b.ReportMetric(float64(g.p99)/float64(c.p99), name+"_p99_vs_caddy")
}

// medianResult returns the median requests/s and the median p99 of rs
// (taken separately).
func medianResult(rs []wrkResult) wrkResult {
	rps := make([]float64, len(rs))
	p99 := make([]time.Duration, len(rs))
	for i, r := range rs {
		rps[i], p99[i] = r.rps, r.p99
	}
	slices.Sort(rps)
	slices.Sort(p99)
	return wrkResult{rps: rps[len(rps)/2], p99: p99[len(p99)/2]}
}
