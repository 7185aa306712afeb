// Package pebbletest starts a real ACME CA (pebble v2.10.3) and its DNS test
// server (pebble-challtestsrv) for tests, on loopback ports, and stops them at test end.
package pebbletest

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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
)

// Module is the pebble module whose binaries, test configuration and
// certificates the tests use; the Makefile's test target installs both
// binaries from it.
const Module = "github.com/letsencrypt/pebble/v2@v2.10.3"

// startTimeout bounds the wait for a started server to answer.
const startTimeout = 30 * time.Second

// Config says how to start pebble. The zero value works only with DNSServer
// set.
type Config struct {
	// DNSServer is the "host:port" (UDP) of the DNS server pebble resolves
	// names with for every validation (pebble's -dnsserver): a
	// [ChallSrv.DNSAddr] or an authoritative server such as knot. Required.
	DNSServer string
	// HTTPPort is the port pebble connects to for HTTP-01 validation, on the
	// address the name resolves to; zero picks a free loopback port (read it
	// back from [Server.HTTPPort]).
	HTTPPort int
	// Blocklist names domains pebble refuses to issue for (rejectedIdentifier).
	Blocklist []string
	// ValidityS is the lifetime of issued certificates in seconds; zero means
	// pebble's default profile (90 days).
	ValidityS int64
}

// Server is a running pebble.
type Server struct {
	// Directory is the ACME directory URL (https, served with the module's
	// localhost certificate).
	Directory string
	// CARootFile is the PEM file of the private CA that signed the
	// certificate pebble's ACME and management listeners serve: what a
	// client needs to trust to talk to pebble at all.
	CARootFile string
	// HTTPPort is the port pebble validates HTTP-01 answers on.
	HTTPPort int
	mgmt     string
	proc     *proctest.Proc
}

// Binary returns the path of the named binary of [Module] ("pebble" or
// "pebble-challtestsrv"), from PATH or GOPATH/bin, and fails t when it is
// not installed.
func Binary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("%s is not installed: go install github.com/letsencrypt/pebble/v2/cmd/%s@v2.10.3 (make test does)", name, name)
	return ""
}

// ModuleDir returns the directory of [Module] in the module cache
// (downloading it if needed), which holds pebble's test certificates.
func ModuleDir(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", Module).Output()
	if err != nil {
		t.Fatalf("locate %s: %v", Module, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("locate %s: no directory in %q (%v)", Module, out, err)
	}
	return m.Dir
}

// Start runs pebble with cfg on loopback ports (PEBBLE_VA_NOSLEEP=1, no nonce
// rejections, no authorization reuse), waits until its directory answers and
// stops it when t ends. Its log goes to a file in t's temporary directory.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.DNSServer == "" {
		t.Fatal("pebbletest: Config.DNSServer is required")
	}
	mod := ModuleDir(t)
	if cfg.HTTPPort == 0 {
		cfg.HTTPPort = freePort(t)
	}
	dir := t.TempDir()
	listen, mgmt := proctest.FreeAddr(t), proctest.FreeAddr(t)
	validity := cfg.ValidityS
	if validity == 0 {
		validity = 7776000
	}
	conf := map[string]any{"pebble": map[string]any{
		"listenAddress":           listen,
		"managementListenAddress": mgmt,
		"certificate":             filepath.Join(mod, "test/certs/localhost/cert.pem"),
		"privateKey":              filepath.Join(mod, "test/certs/localhost/key.pem"),
		"httpPort":                cfg.HTTPPort,
		"tlsPort":                 freePort(t),
		"domainBlocklist":         append([]string{}, cfg.Blocklist...),
		"retryAfter":              map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm":            "ecdsa",
		"profiles": map[string]any{"default": map[string]any{
			"description": "berth tests", "validityPeriod": validity}},
	}}
	raw, _ := json.Marshal(conf) // plain maps: cannot fail
	confPath := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(confPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Binary(t, "pebble"), "-config", confPath, "-dnsserver", cfg.DNSServer, "-strict")
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	p := proctest.StartCmd(t, filepath.Join(dir, "pebble.log"), cmd)
	s := &Server{
		Directory:  "https://" + listen + "/dir",
		CARootFile: filepath.Join(mod, "test/certs/pebble.minica.pem"),
		HTTPPort:   cfg.HTTPPort,
		mgmt:       mgmt,
		proc:       p,
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		_, err := s.get(ctx, s.Directory)
		if err == nil {
			return s
		}
		if ctx.Err() != nil || p.Exited() {
			t.Fatalf("pebble did not answer at %s: %v (log %s)", s.Directory, err, p.LogPath())
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// HTTPClient returns a client that trusts [Server.CARootFile] only.
func (s *Server) HTTPClient() (*http.Client, error) {
	pem, err := os.ReadFile(s.CARootFile)
	if err != nil {
		return nil, fmt.Errorf("pebbletest: read CA root: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("pebbletest: CA root file holds no certificate")
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

func (s *Server) get(ctx context.Context, url string) ([]byte, error) {
	c, err := s.HTTPClient()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("pebbletest: GET %s: %s", url, res.Status)
	}
	return body, nil
}

// Roots returns the root certificate pebble generated at this start, which
// every chain it issues ends at, fetched from its management port.
func (s *Server) Roots(ctx context.Context) (*x509.CertPool, error) {
	raw, err := s.get(ctx, "https://"+s.mgmt+"/roots/0")
	if err != nil {
		return nil, fmt.Errorf("pebbletest: fetch root: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, errors.New("pebbletest: the management port's root holds no certificate")
	}
	return pool, nil
}

// ChallSrv is a running pebble-challtestsrv serving DNS only: every A query
// answers 127.0.0.1 (so pebble's HTTP-01 validation dials loopback), and TXT
// records are set and cleared through its management API.
type ChallSrv struct {
	// DNSAddr is the DNS server's "127.0.0.1:port" (UDP and TCP).
	DNSAddr string
	mgmt    string
}

// StartChallSrv runs pebble-challtestsrv on loopback ports with only its DNS
// server and management API on, waits until the management API answers and
// stops it when t ends.
func StartChallSrv(t testing.TB) *ChallSrv {
	t.Helper()
	dnsAddr := proctest.FreeAddr(t)
	mgmt := proctest.FreeAddr(t)
	p := proctest.Start(t, filepath.Join(t.TempDir(), "challtestsrv.log"), Binary(t, "pebble-challtestsrv"),
		"-dnsserver", dnsAddr, "-management", mgmt, "-http01", "", "-https01", "", "-doh", "",
		"-tlsalpn01", "", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "")
	c := &ChallSrv{DNSAddr: dnsAddr, mgmt: mgmt}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		err := c.post(ctx, "/set-default-ipv4", map[string]string{"ip": "127.0.0.1"})
		if err == nil {
			return c
		}
		if ctx.Err() != nil || p.Exited() {
			t.Fatalf("pebble-challtestsrv did not answer at %s: %v (log %s)", mgmt, err, p.LogPath())
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *ChallSrv) post(ctx context.Context, path string, body any) error {
	raw, _ := json.Marshal(body) // plain maps: cannot fail
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.mgmt+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("pebbletest: POST %s: %s", path, res.Status)
	}
	return nil
}

// SetTXT sets the TXT record of fqdn (with or without the trailing dot) to
// value, replacing what was there.
func (c *ChallSrv) SetTXT(ctx context.Context, fqdn, value string) error {
	return c.post(ctx, "/set-txt", map[string]string{"host": dotted(fqdn), "value": value})
}

// ClearTXT removes the TXT record of fqdn.
func (c *ChallSrv) ClearTXT(ctx context.Context, fqdn string) error {
	return c.post(ctx, "/clear-txt", map[string]string{"host": dotted(fqdn)})
}

func dotted(s string) string {
	if strings.HasSuffix(s, ".") {
		return s
	}
	return s + "."
}

func freePort(t testing.TB) int {
	t.Helper()
	_, port, err := net.SplitHostPort(proctest.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
