package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/pebbletest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// certRounds is how many services BenchmarkApplyToCertificate applies, one after the other.
const certRounds = 3

// BenchmarkApplyToCertificate measures the time from the start of an apply of a `dns: managed`,
// `tls: acme` service to the gateway's TLS listener serving a certificate for its domain that
// verifies against the CA's root: the whole path with real parts on loopback (knot serving
// example.test with TSIG-signed updates, pebble validating DNS-01 against knot, berthd with the
// DNS plugin and its gateway, one agent running hello). Each round applies a new service with a
// new name under example.test, so each is a fresh order through DNS-01. It reports the p50 and
// maximum over certRounds rounds as apply_to_cert_p50_s and apply_to_cert_max_s. The scenario
// runs once whatever b.N.
func BenchmarkApplyToCertificate(b *testing.B) {
	bin := binaries(b)
	for _, name := range []string{"berth-plugin-dns", "berth-plugin-gateway"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			b.Fatalf("%s: %v (run make build, or set BERTH_BIN_DIR)", name, err)
		}
	}
	hello := helloBundle(b)
	knot := knottest.Start(b, "example.test")
	pebble := pebbletest.Start(b, pebbletest.Config{DNSServer: knot.Addr})
	dir := b.TempDir()
	conf, _ := json.Marshal(map[string]any{"server": knot.Addr, "zones": []string{"example.test"},
		"tsig_key_name": knot.Key.Name, "tsig_algorithm": knot.Key.Algorithm, "tsig_secret": knot.Key.Secret})
	confPath := filepath.Join(dir, "dns.json")
	if err := os.WriteFile(confPath, conf, 0o600); err != nil {
		b.Fatal(err)
	}
	secure := proctest.FreeAddr(b)
	// The gateway outlives berthd on purpose: registered before the cluster's stop, so it runs
	// after it and the gateway goes last.
	var data string
	b.Cleanup(func() {
		if data != "" {
			killDetachedGateway(b, data)
		}
	})
	cl := startApplyCluster(b, bin, 1, "--gateway-listen", proctest.FreeAddr(b), "--gateway-tls-listen", secure,
		"--dns-config", confPath, "--edge-addresses", "127.0.0.1",
		"--acme-directory", pebble.Directory, "--acme-ca-root", pebble.CARootFile, "--acme-dns01-zone", "example.test")
	data = filepath.Join(cl.dir, "berthd")
	ctx := context.Background()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, hello, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		b.Fatal(err)
	}
	roots, err := pebble.Roots(ctx)
	if err != nil {
		b.Fatal(err)
	}
	one := 1
	b.ResetTimer()
	each := make([]time.Duration, certRounds)
	for i := range each {
		name := fmt.Sprintf("cert-%d", i)
		host := name + ".example.test"
		t0 := time.Now()
		if _, err := cl.c.ApplyService(ctx, "default", name, client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
			Domains: []string{host}, DNS: "managed", TLS: client.TLS{Mode: "acme"}, Replicas: &one,
			HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}); err != nil {
			b.Fatalf("apply %s: %v", name, err)
		}
		proctest.WaitForEvery(b, applyLimit, 20*time.Millisecond, host+" served with a valid certificate", func() (bool, string) {
			if err := handshake(secure, host, roots); err != nil {
				return false, err.Error()
			}
			each[i] = time.Since(t0)
			return true, ""
		})
	}
	b.StopTimer()
	b.Logf("apply to a valid certificate through DNS-01 with pebble and knot: %v", each)
	slices.Sort(each)
	b.ReportMetric(each[len(each)/2].Seconds(), "apply_to_cert_p50_s")
	b.ReportMetric(each[len(each)-1].Seconds(), "apply_to_cert_max_s")
}

// handshake completes a TLS handshake with the listener at addr for sni, verifying the chain
// against roots for sni.
func handshake(addr, sni string, roots *x509.CertPool) error {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
		Config: &tls.Config{RootCAs: roots, ServerName: sni, MinVersion: tls.VersionTLS12}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// killDetachedGateway SIGKILLs the gateway berthd (data directory data) left running, named by
// its reattach record, once its command line shows it is the gateway plugin.
func killDetachedGateway(b *testing.B, data string) {
	raw, err := os.ReadFile(filepath.Join(data, "plugins", "gateway.reattach.json"))
	if err != nil {
		return
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if json.Unmarshal(raw, &rec) != nil || rec.PID <= 0 {
		b.Logf("gateway reattach record %q holds no pid", raw)
		return
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID)); err == nil && strings.Contains(string(cmdline), "berth-plugin-gateway") {
		_ = syscall.Kill(rec.PID, syscall.SIGKILL)
	}
}
