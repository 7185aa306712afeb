package edge

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/pebbletest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// TestACMEWildcardThroughDNS01: the whole edge with real parts. knot serves example.test and
// takes TSIG-signed updates; pebble validates against knot; berthd runs the DNS plugin, orders
// from pebble with example.test as its DNS-01 zone, and serves HTTPS on the gateway's TLS
// listener; one agent runs hello. A `dns: managed`, `tls: acme` service with shop.example.test
// and *.api.example.test gets A records in knot, a certificate per name through DNS-01 (the
// wildcard's only way), HTTPS that verifies against pebble's root with the right SANs over h2
// for each name and one under the wildcard, and a 308 to https on plain HTTP keeping path and
// query. Deleting it withdraws every record it caused (the challenge TXT records too) and stops
// serving its names on both listeners.
func TestACMEWildcardThroughDNS01(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()

	knot := knottest.Start(t, "example.test")
	pebble := pebbletest.Start(t, pebbletest.Config{DNSServer: knot.Addr})
	dnsConf, _ := json.Marshal(map[string]any{"server": knot.Addr, "zones": []string{"example.test"},
		"tsig_key_name": knot.Key.Name, "tsig_algorithm": knot.Key.Algorithm, "tsig_secret": knot.Key.Secret})
	dnsPath := filepath.Join(dir, "dns.json")
	if err := os.WriteFile(dnsPath, dnsConf, 0o600); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "berthd")
	api, plain, secure := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	// Registered first, so it runs last: the gateway outlives berthd and workloads outlive
	// the agent on purpose, and the test leaves no process behind.
	t.Cleanup(func() { killWorkloads(t, dir); killGateway(t, data) })
	berthd := proctest.Start(t, filepath.Join(dir, "berthd.log"), filepath.Join(env.bin, "berthd"), "--data-dir", data,
		"--listen", api, "--gateway-listen", plain, "--gateway-tls-listen", secure, "--sweep-floor", "1s",
		"--dns-config", dnsPath, "--edge-addresses", "127.0.0.1",
		"--acme-directory", pebble.Directory, "--acme-ca-root", pebble.CARootFile, "--acme-dns01-zone", "example.test")
	proctest.LogTailsOnFailure(t, dir, "berthd.log", "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- knotd.log ----\n%s", knot.Log())
		}
	})
	url := "https://" + api
	d := proctest.WaitBerthdReady(t, berthd, data, url, 2*time.Minute)
	c, err := client.New(url, client.WithToken(d.Token), client.WithFingerprint(d.Fingerprint))
	if err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(env.bin, "berth"), append([]string{"--server", url, "--token", d.Token, "--fingerprint", d.Fingerprint}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("berth %v: %v\n%s", args, err, stderr.String())
		}
		return string(out)
	}

	jt, err := c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(dir, "agent"), filepath.Join(dir, "agent.log")
	enroll := proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "enroll", "--server", url, "--join-token", jt.Token,
		"--fingerprint", d.Fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", agentDir)

	const shop, wild, underWild = "shop.example.test", "*.api.example.test", "orders.api.example.test"
	one := 1
	spec := client.ServiceSpec{Bundle: pushHello(t, c), Command: []string{"./hello"}, Replicas: &one,
		Domains: []string{shop, wild}, DNS: "managed", TLS: client.TLS{Mode: "acme"},
		HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}
	if _, err := c.ApplyService(ctx, "default", "shop", spec); err != nil {
		t.Fatal(err)
	}

	// The A records, in knot, over DNS; the wildcard answers for a name below it.
	for _, name := range []string{shop, wild, underWild} {
		proctest.WaitFor(t, 2*time.Minute, name+" A 127.0.0.1 in knot", func() (bool, string) {
			got := knot.Addresses(t, name, mdns.TypeA)
			return slices.Equal(got, []string{"127.0.0.1"}), strings.Join(got, ",")
		})
	}

	// Both certificates issued, as `berth routes -o json` reports them. Each look starts a CLI
	// process, so it looks once a second rather than every 100 ms: on a loaded machine those
	// processes took the CPU the issuance waited for.
	proctest.WaitForEvery(t, 4*time.Minute, time.Second, "both certificates issued", func() (bool, string) {
		var st client.RouteStatus
		if err := json.Unmarshal([]byte(cli("routes", "-o", "json")), &st); err != nil {
			t.Fatalf("berth routes -o json: %v", err)
		}
		var seen []string
		issued := 0
		for _, h := range []string{shop, wild} {
			cs := st.Certificates[h]
			seen = append(seen, fmt.Sprintf("%s=%s/%s %q", h, cs.State, cs.Challenge, cs.LastError))
			if cs.State == "failed" {
				t.Fatalf("certificate of %s failed: %+v", h, cs)
			}
			if cs.State == "issued" && cs.Challenge == "dns-01" && !cs.NotAfter.IsZero() {
				issued++
			}
		}
		return issued == 2, strings.Join(seen, "; ")
	})

	roots, err := pebble.Roots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for sni, san := range map[string]string{shop: shop, "shop.api.example.test": wild, underWild: wild} {
		var last string
		proctest.WaitFor(t, time.Minute, "HTTPS for "+sni+" through the gateway", func() (bool, string) {
			resp, err := httpsGet(ctx, secure, sni, roots, "/")
			if err != nil {
				last = err.Error()
				return false, last
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			leaf := resp.TLS.PeerCertificates[0]
			last = fmt.Sprintf("%s %d %q SANs %v", resp.Proto, resp.StatusCode, body, leaf.DNSNames)
			if resp.StatusCode != 200 || !strings.Contains(string(body), "from ") {
				return false, last
			}
			if !slices.Equal(leaf.DNSNames, []string{san}) {
				t.Fatalf("%s: leaf SANs %v, want [%s]", sni, leaf.DNSNames, san)
			}
			if resp.Proto != "HTTP/2.0" {
				t.Fatalf("%s: protocol %s, want HTTP/2.0 (ALPN h2)", sni, resp.Proto)
			}
			return true, last
		})
	}

	// Plain HTTP redirects to https with the path and query kept.
	// The TLS listener is not on 443 here, so the location names its port.
	_, securePort, _ := net.SplitHostPort(secure)
	for _, host := range []string{shop, underWild} {
		want := "https://" + host + ":" + securePort + "/cart/items?sku=42&n=1"
		code, h, body := request(plain, host, "/cart/items?sku=42&n=1")
		if code != http.StatusPermanentRedirect || h.Get("Location") != want {
			t.Fatalf("plain HTTP to %s: %d Location %q %q; want 308 to %s", host, code, h.Get("Location"), body, want)
		}
	}
	// The challenge records are cleared once the CA answered.
	for _, name := range []string{"_acme-challenge.shop.example.test", "_acme-challenge.api.example.test"} {
		proctest.WaitFor(t, time.Minute, name+" TXT cleared", func() (bool, string) {
			rrs, err := knot.Lookup(name, mdns.TypeTXT)
			if err != nil {
				return false, err.Error()
			}
			return len(rrs) == 0, fmt.Sprint(rrs)
		})
	}

	// Deleting the service withdraws its records and its names.
	if err := c.DeleteService(ctx, "default", "shop", nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{shop, wild, underWild} {
		for _, rrtype := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
			proctest.WaitFor(t, 2*time.Minute, name+" "+mdns.TypeToString[rrtype]+" withdrawn from knot", func() (bool, string) {
				got := knot.Addresses(t, name, rrtype)
				return len(got) == 0, strings.Join(got, ",")
			})
		}
	}
	for _, name := range []string{"_acme-challenge.shop.example.test", "_acme-challenge.api.example.test"} {
		if rrs, err := knot.Lookup(name, mdns.TypeTXT); err != nil || len(rrs) != 0 {
			t.Fatalf("%s TXT after the delete: %v %v", name, rrs, err)
		}
	}
	if got := knot.Addresses(t, "ns1.example.test", mdns.TypeA); !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Fatalf("the zone's own ns1 A record: %v", got)
	}
	for _, host := range []string{shop, underWild} {
		proctest.WaitFor(t, 2*time.Minute, host+" no longer served", func() (bool, string) {
			state := "https served"
			resp, err := httpsGet(ctx, secure, host, roots, "/")
			if err != nil {
				state = "handshake: " + err.Error()
			} else {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return false, fmt.Sprintf("https %d %q", resp.StatusCode, body)
				}
				if resp.Header.Get("X-Berth-Gateway") != "no-route" {
					return false, fmt.Sprintf("https %d %q without the gateway's no-route mark", resp.StatusCode, body)
				}
				state = fmt.Sprintf("https %d no-route", resp.StatusCode)
			}
			code, h, body := request(plain, host, "/")
			return code == 404 && h.Get("X-Berth-Gateway") == "no-route", fmt.Sprintf("%s; http %d %q", state, code, body)
		})
	}
}

// httpsGet sends GET https://sni<path> to the gateway's TLS listener at addr, verifying the
// chain against roots for sni and offering h2 and http/1.1. The caller closes the body.
func httpsGet(ctx context.Context, addr, sni string, roots *x509.CertPool, path string) (*http.Response, error) {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: sni, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+sni+path, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnClose ends a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// request sends GET http://addr<path> with Host host, following no redirect.
func request(addr, host, path string) (int, http.Header, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Host = host
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header, string(body)
}

// killGateway SIGKILLs the gateway berthd (data directory data) left running: it outlives
// berthd on purpose. It reads the pid from berthd's reattach record and checks the process is
// the gateway plugin before signalling it.
func killGateway(t *testing.T, data string) {
	raw, err := os.ReadFile(filepath.Join(data, "plugins", "gateway.reattach.json"))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Error(err)
		return
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.PID <= 0 {
		t.Errorf("gateway reattach record %q: %v", raw, err)
		return
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID)); err == nil && strings.Contains(string(cmdline), "berth-plugin-gateway") {
		_ = syscall.Kill(rec.PID, syscall.SIGKILL)
	}
}
