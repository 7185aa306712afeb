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
	proc     *proc
}

// Binary returns the path of the named binary of [Module] ("pebble" or
// "pebble-challtestsrv"), from PATH or GOPATH/bin; an error says how to
// install it when it is missing.
func Binary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("pebbletest: %s is not installed: go install github.com/letsencrypt/pebble/v2/cmd/%s@v2.10.3 (make test does)", name, name)
}

// ModuleDir returns the directory of [Module] in the module cache
// (downloading it if needed), which holds pebble's test certificates.
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", Module).Output()
	if err != nil {
		return "", fmt.Errorf("pebbletest: locate %s: %w", Module, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("pebbletest: locate %s: no directory in %q (%v)", Module, out, err)
	}
	return m.Dir, nil
}

// Start is [New] in t's temporary directory, failing t on error and
// stopping pebble when t ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// New runs pebble with cfg on loopback ports (PEBBLE_VA_NOSLEEP=1, no nonce
// rejections, no authorization reuse), its configuration and log
// (pebble.log) in dir, and waits until its directory answers. The caller
// stops it with [Server.Stop] (TestMain may share one across a package).
func New(cfg Config, dir string) (*Server, error) {
	if cfg.DNSServer == "" {
		return nil, errors.New("pebbletest: Config.DNSServer is required")
	}
	mod, err := ModuleDir()
	if err != nil {
		return nil, err
	}
	bin, err := Binary("pebble")
	if err != nil {
		return nil, err
	}
	if cfg.HTTPPort == 0 {
		if cfg.HTTPPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	tlsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	mgmt, err := freeAddr()
	if err != nil {
		return nil, err
	}
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
		"tlsPort":                 tlsPort,
		"domainBlocklist":         append([]string{}, cfg.Blocklist...),
		"retryAfter":              map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm":            "ecdsa",
		"profiles": map[string]any{"default": map[string]any{
			"description": "berth tests", "validityPeriod": validity}},
	}}
	raw, _ := json.Marshal(conf) // plain maps: cannot fail
	confPath := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(confPath, raw, 0o600); err != nil {
		return nil, fmt.Errorf("pebbletest: %w", err)
	}
	cmd := exec.Command(bin, "-config", confPath, "-dnsserver", cfg.DNSServer, "-strict")
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	p, err := startProc(cmd, filepath.Join(dir, "pebble.log"))
	if err != nil {
		return nil, err
	}
	s := &Server{
		Directory:  "https://" + listen + "/dir",
		CARootFile: filepath.Join(mod, "test/certs/pebble.minica.pem"),
		HTTPPort:   cfg.HTTPPort,
		mgmt:       mgmt,
		proc:       p,
	}
	if err := p.await(func(ctx context.Context) error { _, err := s.get(ctx, s.Directory); return err }); err != nil {
		s.Stop()
		return nil, fmt.Errorf("pebbletest: pebble did not answer at %s: %w", s.Directory, err)
	}
	return s, nil
}

// Stop ends pebble (SIGKILL: it keeps nothing) and waits for it.
func (s *Server) Stop() { s.proc.stop() }

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
	proc    *proc
}

// StartChallSrv is [NewChallSrv] in t's temporary directory, failing t on
// error and stopping the server when t ends.
func StartChallSrv(t testing.TB) *ChallSrv {
	t.Helper()
	c, err := NewChallSrv(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// NewChallSrv runs pebble-challtestsrv on loopback ports with only its DNS
// server and management API on (its log, challtestsrv.log, in dir) and waits
// until the management API answers. The caller stops it with [ChallSrv.Stop].
func NewChallSrv(dir string) (*ChallSrv, error) {
	bin, err := Binary("pebble-challtestsrv")
	if err != nil {
		return nil, err
	}
	dnsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	mgmt, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc(exec.Command(bin,
		"-dnsserver", dnsAddr, "-management", mgmt, "-http01", "", "-https01", "", "-doh", "",
		"-tlsalpn01", "", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""), filepath.Join(dir, "challtestsrv.log"))
	if err != nil {
		return nil, err
	}
	c := &ChallSrv{DNSAddr: dnsAddr, mgmt: mgmt, proc: p}
	if err := p.await(func(ctx context.Context) error {
		return c.post(ctx, "/set-default-ipv4", map[string]string{"ip": "127.0.0.1"})
	}); err != nil {
		c.Stop()
		return nil, fmt.Errorf("pebbletest: pebble-challtestsrv did not answer at %s: %w", mgmt, err)
	}
	return c, nil
}

// Stop ends the server and waits for it.
func (c *ChallSrv) Stop() { c.proc.stop() }

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

// freeAddr is a loopback address reserved for this process (proctest.ReserveAddr).
func freeAddr() (string, error) { return proctest.ReserveAddr() }

func freePort() (int, error) {
	a, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(a)
	return strconv.Atoi(port)
}

// proc is a started server process with its log file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pebbletest: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("pebbletest: start %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// await calls ready every 50 ms until it succeeds, the process ends, or
// startTimeout passes.
func (p *proc) await(ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (log %s)", err, p.log)
		case <-p.done:
			return fmt.Errorf("process ended: %w (log %s)", err, p.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}
