package node

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// relayProc is one berth-relay process started by a benchmark, in front of d.
type relayProc struct {
	proc   *proctest.Proc
	url    string // https://<its node listener>
	health string // http://<its health listener>
	args   []string
	bin    string
	log    string
}

// startRelay writes a relay certificate and the cluster's credential under dir and starts
// berth-relay for d: nodes dial it at 127.0.0.1 over TLS, and it dials d's relay endpoint. It
// returns the relay and an HTTP client pinned to the relay's certificate.
func startRelay(b *testing.B, d *berthd, dir, credential string) (*relayProc, *http.Client) {
	b.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth-relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	pk, _ := x509.MarshalPKCS8PrivateKey(key)
	cert, keyFile, cred := filepath.Join(dir, "relay.crt"), filepath.Join(dir, "relay.key"), filepath.Join(dir, "relay-credential")
	for _, f := range []struct {
		path string
		data []byte
	}{{cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		{keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk})}, {cred, []byte(credential + "\n")}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	listen, health := proctest.FreeAddr(b), proctest.FreeAddr(b)
	r := &relayProc{url: "https://" + listen, health: "http://" + health, bin: filepath.Join(binDir(b), "berth-relay"),
		log: filepath.Join(dir, "relay.log"),
		args: []string{"--core-url", "wss" + d.url[len("https"):] + "/relay/v1/session", "--core-ca", filepath.Join(d.dataDir, "tls", "server.crt"),
			"--tls-cert", cert, "--tls-key", keyFile, "--credential-file", cred, "--listen", listen, "--health-listen", health, "--log-level", "warn"}}
	r.start(b)
	hc, err := client.PinnedHTTPClient(client.Fingerprint(der))
	if err != nil {
		b.Fatal(err)
	}
	return r, hc
}

// start runs the relay process and waits until its /readyz answers 200 (a core session is up).
func (r *relayProc) start(b *testing.B) {
	b.Helper()
	r.proc = proctest.Start(b, r.log, r.bin, r.args...)
	hc := &http.Client{Timeout: 2 * time.Second}
	proctest.WaitFor(b, 30*time.Second, "relay ready", func() (bool, string) {
		if r.proc.Exited() {
			log, _ := os.ReadFile(r.log)
			b.Fatalf("berth-relay exited:\n%s", log)
		}
		resp, err := hc.Get(r.health + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// BenchmarkRelay measures the cluster relay (docs/relay.md section 13) with simulated agents on
// one machine: BERTH_BENCH_RELAY_NODES (default 500) node sessions through one berth-relay
// process and BERTH_BENCH_DIRECT_NODES (default 100) straight to the same berthd, each over real
// TLS WebSockets with heartbeats every 5 s. It reports:
//
//   - the relay's CPU over a 15 s window once the sessions settled, and its resident memory;
//   - desired-state delivery through the relay and direct, p50 and p99, over
//     BERTH_BENCH_RELAY_SAMPLES (default 100) nodes of each group, each given a change of its
//     own: per node, from the issued_at berthd stamps right before it signs and sends the
//     desired_state to the moment the simulated node read it, and the relay's added p99; and,
//     beside it, from the apply's answer to the read;
//   - after a restart of the relay (SIGTERM, then a new process), the time from the new
//     process's start until every relayed node was welcomed again (the simulated nodes redial
//     1 s after a session ends).
func BenchmarkRelay(b *testing.B) {
	nRelay, nDirect := envInt("BERTH_BENCH_RELAY_NODES", 500), envInt("BERTH_BENCH_DIRECT_NODES", 100)
	deadline := time.Now().Add(benchBudget)
	d := startBerthd(b)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })

	if _, err := d.c.CreateCluster(ctx, "bench-relay", true); err != nil {
		b.Fatal(err)
	}
	rc, err := d.c.EnsureRelayCredential(ctx, "bench-relay")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	r, relayHC := startRelay(b, d, dir, rc.Credential)
	b.Cleanup(func() { r.proc.Stop() })

	relayed, rate := enroll(ctx, b, d, nRelay, "bench-relay")
	direct, _ := enroll(ctx, b, d, nDirect, "")
	note(b, "enrolled %d relayed and %d direct nodes (relayed at %.0f nodes/s)", nRelay, nDirect, rate)
	seq, hash := d.logHead(ctx, b)
	for _, s := range relayed {
		wg.Add(1)
		go func() { defer wg.Done(); s.run(ctx, r.url, relayHC, seq, hash) }()
	}
	for _, s := range direct {
		wg.Add(1)
		go func() { defer wg.Done(); s.run(ctx, d.url, d.hc, seq, hash) }()
	}
	all := append(slices.Clone(relayed), direct...)
	if !waitConnected(b, all, min(3*time.Minute, time.Until(deadline))) {
		c, dropped := countConnected(all)
		b.Fatalf("%d of %d nodes connected within 3 min (%d sessions dropped)", c, len(all), dropped)
	}
	note(b, "%d sessions up, %d of them through the relay", len(all), nRelay)

	// The relay's cost while it carries the sessions: heartbeats every 5 s, a status report every 30 s.
	time.Sleep(10 * time.Second)
	pid := r.proc.Cmd().Process.Pid
	cpu0 := procCPUSeconds(b, pid)
	t0 := time.Now()
	time.Sleep(15 * time.Second)
	cpu1, rss := procCPUSeconds(b, pid), procRSSBytes(b, pid)
	cores := (cpu1 - cpu0) / time.Since(t0).Seconds()
	note(b, "relay with %d sessions: %.3f cores, RSS %.1f MiB", nRelay, cores, rss/(1<<20))
	b.ReportMetric(cores, "relay_cores")
	b.ReportMetric(rss/(1<<20), "relay_rss_MiB")

	// Delivery. One single-replica service is pinned (by its sim label) to each of samples nodes
	// of either group, and then changed: a domain added, so a new route in that one node's
	// desired state and no workload replacement. The changes are applied back to back, relayed
	// and direct taking turns, so both groups meet the same load; each reaches one node, so
	// berthd's passes send a few desired states at a time rather than hundreds at once (a change
	// of every node measures the machine's queues: berthd's sends and the simulated nodes' reads
	// share its cores).
	samples := min(envInt("BERTH_BENCH_RELAY_SAMPLES", 100), nRelay, nDirect)
	app := pushApp(ctx, b, d)
	type target struct {
		s       *simNode
		svc     string
		label   string
		relayed bool
	}
	var targets []target
	for i := range samples {
		targets = append(targets, target{relayed[i], fmt.Sprintf("relayed%d", i), simLabel("bench-relay", i), true},
			target{direct[i], fmt.Sprintf("direct%d", i), simLabel("", i), false})
	}
	one := 1
	spec := func(tg target, domain string) client.ServiceSpec {
		sp := client.ServiceSpec{Bundle: app, Command: []string{"./app"}, Env: map[string]string{"BENCH_GEN": "1"}, Replicas: &one,
			Scheduling: client.Scheduling{NodeSelector: map[string]string{"sim": tg.label}}}
		if domain != "" {
			sp.Domains = []string{domain}
		}
		return sp
	}
	for _, tg := range targets {
		tg.s.mu.Lock()
		tg.s.wanted, tg.s.sawAt = "1", time.Time{}
		tg.s.mu.Unlock()
		if _, err := d.c.ApplyService(ctx, "default", tg.svc, spec(tg, "")); err != nil {
			b.Fatal(err)
		}
	}
	saw := func(s *simNode) (time.Time, time.Duration) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sawAt, s.sawLag
	}
	proctest.WaitFor(b, 3*time.Minute, "every sampled node placed", func() (bool, string) {
		n := 0
		for _, tg := range targets {
			if at, _ := saw(tg.s); !at.IsZero() {
				n++
			}
		}
		return n == len(targets), fmt.Sprintf("%d of %d", n, len(targets))
	})
	answered := make([]time.Time, len(targets))
	for i, tg := range targets {
		tg.s.mu.Lock()
		tg.s.wanted, tg.s.sawAt, tg.s.sawLag = "2", time.Time{}, 0
		tg.s.mu.Unlock()
		if _, err := d.c.ApplyService(ctx, "default", tg.svc, spec(tg, "gen2-"+tg.svc+".localhost")); err != nil {
			b.Fatal(err)
		}
		answered[i] = time.Now()
	}
	var lagRelay, lagDirect, e2eRelay, e2eDirect []time.Duration
	proctest.WaitFor(b, 3*time.Minute, "every sampled node saw its change", func() (bool, string) {
		lagRelay, lagDirect, e2eRelay, e2eDirect = lagRelay[:0], lagDirect[:0], e2eRelay[:0], e2eDirect[:0]
		for i, tg := range targets {
			at, lag := saw(tg.s)
			if at.IsZero() {
				return false, tg.svc + " not yet"
			}
			if tg.relayed {
				lagRelay, e2eRelay = append(lagRelay, lag), append(e2eRelay, at.Sub(answered[i]))
			} else {
				lagDirect, e2eDirect = append(lagDirect, lag), append(e2eDirect, at.Sub(answered[i]))
			}
		}
		return true, ""
	})
	pct := func(v []time.Duration, p float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return float64(s[int(math.Ceil(p*float64(len(s))))-1].Microseconds()) / 1000
	}
	load, _ := os.ReadFile("/proc/loadavg")
	note(b, "machine load average (1, 5, 15 min) after the delivery rounds: %s", strings.Join(strings.Fields(string(load))[:3], " "))
	note(b, "delivery, issued_at to read: relay p50 %.2f ms p99 %.2f ms, direct p50 %.2f ms p99 %.2f ms (%d samples each)",
		pct(lagRelay, .5), pct(lagRelay, .99), pct(lagDirect, .5), pct(lagDirect, .99), samples)
	note(b, "delivery, apply's answer to read: relay p50 %.1f ms p99 %.1f ms, direct p50 %.1f ms p99 %.1f ms",
		pct(e2eRelay, .5), pct(e2eRelay, .99), pct(e2eDirect, .5), pct(e2eDirect, .99))
	b.ReportMetric(pct(lagRelay, .5), "relay_p50_ms")
	b.ReportMetric(pct(lagRelay, .99), "relay_p99_ms")
	b.ReportMetric(pct(lagDirect, .5), "direct_p50_ms")
	b.ReportMetric(pct(lagDirect, .99), "direct_p99_ms")
	b.ReportMetric(pct(lagRelay, .99)-pct(lagDirect, .99), "added_p99_ms")
	b.ReportMetric(pct(e2eRelay, .99), "relay_apply_p99_ms")
	b.ReportMetric(pct(e2eDirect, .99), "direct_apply_p99_ms")

	// A relay restart: every relayed node is welcomed again through the new process.
	r.proc.Stop()
	restarted := time.Now()
	r.start(b)
	up := time.Now()
	back := func() int {
		c := 0
		for _, s := range relayed {
			if s.connected.Load() {
				c++
			}
		}
		return c
	}
	for back() < len(relayed) && time.Since(restarted) < 2*time.Minute {
		time.Sleep(20 * time.Millisecond)
	}
	if c := back(); c < len(relayed) {
		b.Fatalf("%d of %d relayed nodes back within 2 min of the relay's restart", c, len(relayed))
	}
	rereg := time.Since(restarted)
	note(b, "relay restart: ready %.2f s after its start, every relayed node welcomed again %.2f s after its start", up.Sub(restarted).Seconds(), rereg.Seconds())
	b.ReportMetric(rereg.Seconds(), "reregistered_s")
	b.ReportMetric(float64(nRelay), "relayed_nodes")
}

// pushApp pushes, as "app", a one-file bundle whose app sleeps, and returns its name.
func pushApp(ctx context.Context, b *testing.B, d *berthd) string {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app"), []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, dir, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := d.c.PushBundle(ctx, "default", "app", &buf); err != nil {
		b.Fatal(err)
	}
	return "app"
}

// envInt is the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
