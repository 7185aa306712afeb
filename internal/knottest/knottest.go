// Package knottest starts a real authoritative DNS server for tests: knot
// (knotd, Debian's knot 3.2.6) on a loopback port, serving the zones a test
// names and accepting RFC 2136 updates signed with one TSIG key.
package knottest

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/berthhq/berth/internal/proctest"
)

// KeyName and Algorithm name the TSIG key of every server Start runs; the
// secret is fresh per server ([Server.Key]).
const (
	KeyName   = "berth-test."
	Algorithm = "hmac-sha256"
)

// readyWithin bounds how long Run waits for knotd to answer.
const readyWithin = 30 * time.Second

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Key is a TSIG key in the form keymgr -t prints: a name, an algorithm
// ("hmac-sha256") and a base64 secret.
type Key struct {
	Name      string // fully qualified, e.g. "berth-test."
	Algorithm string // e.g. "hmac-sha256"
	Secret    string // base64 of 32 random bytes
}

// NewKey returns a key named name with a fresh 32-byte secret, the shape of
// `keymgr -t NAME hmac-sha256`.
func NewKey(name string) (Key, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return Key{}, fmt.Errorf("tsig secret: %w", err)
	}
	return Key{Name: dns.Fqdn(name), Algorithm: Algorithm, Secret: base64.StdEncoding.EncodeToString(b)}, nil
}

// Server is one running knotd.
type Server struct {
	Addr  string   // "127.0.0.1:port", UDP and TCP
	Zones []string // the zones it serves, fully qualified
	Key   Key      // the key whose signed updates it accepts for every zone
	Dir   string   // its configuration, zone files, journal and log (knotd.log)

	bin  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary finds knotd on PATH or in /usr/sbin and fails t when it is missing
// (make test installs it with scripts/install-knot.sh).
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Find returns knotd's path, or an error saying how to install it.
func Find() (string, error) {
	if p, err := exec.LookPath("knotd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/knotd"); err == nil {
		return "/usr/sbin/knotd", nil
	}
	return "", errors.New("knotd is not installed: apt-get install -y knot knot-dnsutils (make test runs scripts/install-knot.sh)")
}

// Start runs knotd serving zones (each with a SOA and an NS record and
// nothing else) on a free loopback port and a fresh temporary directory,
// waits until it answers, and stops it when the test ends. A package that
// shares one server among its tests calls [Run] from TestMain instead.
func Start(t testing.TB, zones ...string) *Server {
	t.Helper()
	s, err := Run(Binary(t), t.TempDir(), zones...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Run starts the knotd binary bin under dir serving zones, and waits (at most
// 30 s) until it answers a SOA query for the first zone. The caller stops it
// with [Server.Stop].
func Run(bin, dir string, zones ...string) (*Server, error) {
	if len(zones) == 0 {
		return nil, errors.New("knottest: at least one zone")
	}
	key, err := NewKey(KeyName)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, Key: key, Dir: dir}
	for _, z := range zones {
		s.Zones = append(s.Zones, dns.Fqdn(strings.ToLower(z)))
	}
	for _, sub := range []string{"zones", "db", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("knottest: %w", err)
		}
	}
	for _, z := range s.Zones {
		if err := os.WriteFile(filepath.Join(dir, "zones", strings.TrimSuffix(z, ".")+".zone"), []byte(zoneFile(z)), 0o600); err != nil {
			return nil, fmt.Errorf("knottest: %w", err)
		}
	}
	conf := filepath.Join(dir, "knot.conf")
	if err := os.WriteFile(conf, []byte(s.config()), 0o600); err != nil {
		return nil, fmt.Errorf("knottest: %w", err)
	}
	s.bin = bin
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs knotd on s's configuration and waits until it answers.
func (s *Server) start() error {
	logf, err := os.OpenFile(filepath.Join(s.Dir, "knotd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("knottest: %w", err)
	}
	s.done = make(chan struct{})
	s.cmd = exec.Command(s.bin, "-c", filepath.Join(s.Dir, "knot.conf"))
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("knottest: start %s: %w", s.bin, err)
	}
	done := s.done
	go func() { _ = s.cmd.Wait(); logf.Close(); close(done) }()
	if err := s.waitReady(); err != nil {
		s.Stop()
		return fmt.Errorf("knottest: %w\n%s", err, s.Log())
	}
	return nil
}

// Reset stops the server, forgets every change made since it first started (the journal and
// timers go, the zone files are written afresh), and starts it again on the same address and
// key. It suits suites whose cases each expect a fresh server.
func (s *Server) Reset() error {
	s.Stop()
	if err := os.RemoveAll(filepath.Join(s.Dir, "db")); err != nil {
		return fmt.Errorf("knottest: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "db"), 0o700); err != nil {
		return fmt.Errorf("knottest: %w", err)
	}
	for _, z := range s.Zones {
		if err := os.WriteFile(filepath.Join(s.Dir, "zones", strings.TrimSuffix(z, ".")+".zone"), []byte(zoneFile(z)), 0o600); err != nil {
			return fmt.Errorf("knottest: %w", err)
		}
	}
	return s.start()
}

// Restart starts a stopped server again on the same address, key and data (the records written
// before it stopped are in its journal), and waits until it answers.
func (s *Server) Restart() error {
	s.Stop()
	return s.start()
}

// zoneFile is zone with its SOA and one NS (ns1.<zone> at 127.0.0.1).
func zoneFile(zone string) string {
	return fmt.Sprintf("$ORIGIN %s\n$TTL 300\n@ SOA ns1.%s hostmaster.%s 1 3600 900 604800 60\n@ NS ns1.%s\nns1 A 127.0.0.1\n",
		zone, zone, zone, zone)
}

// config is knotd's one configuration file: loopback listener, the key, an
// ACL allowing updates signed with it, every zone under it, zone files never
// rewritten (changes live in the journal).
func (s *Server) config() string {
	var b strings.Builder
	host, port, _ := net.SplitHostPort(s.Addr)
	fmt.Fprintf(&b, "server:\n    listen: %s@%s\n    rundir: %q\n    background-workers: 1\n    udp-workers: 1\n    tcp-workers: 1\n", host, port, filepath.Join(s.Dir, "run"))
	fmt.Fprintf(&b, "log:\n  - target: stderr\n    any: info\n")
	fmt.Fprintf(&b, "database:\n    storage: %q\n", filepath.Join(s.Dir, "db"))
	fmt.Fprintf(&b, "key:\n  - id: %s\n    algorithm: %s\n    secret: %s\n", s.Key.Name, s.Key.Algorithm, s.Key.Secret)
	fmt.Fprintf(&b, "acl:\n  - id: berth_update\n    key: %s\n    action: update\n", s.Key.Name)
	fmt.Fprintf(&b, "template:\n  - id: default\n    storage: %q\n    file: \"%%s.zone\"\n    zonefile-sync: -1\n    zonefile-load: difference-no-serial\n    journal-content: all\n    acl: berth_update\n", filepath.Join(s.Dir, "zones"))
	b.WriteString("zone:\n")
	for _, z := range s.Zones {
		fmt.Fprintf(&b, "  - domain: %s\n", z)
	}
	return b.String()
}

// waitReady queries the first zone's SOA every 50 ms until knotd answers
// authoritatively, it exits, or readyWithin passes.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyWithin)
	c := &dns.Client{Timeout: time.Second}
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("knotd exited before it answered")
		default:
		}
		m := new(dns.Msg)
		m.SetQuestion(s.Zones[0], dns.TypeSOA)
		in, _, err := c.Exchange(m, s.Addr)
		switch {
		case err != nil:
			last = err
		case in.Rcode == dns.RcodeSuccess && len(in.Answer) > 0:
			return nil
		default:
			last = fmt.Errorf("answer %s", dns.RcodeToString[in.Rcode])
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("knotd did not answer within %s: %w", readyWithin, last)
}

// Log returns knotd's log so far.
func (s *Server) Log() string {
	raw, _ := os.ReadFile(filepath.Join(s.Dir, "knotd.log"))
	return string(raw)
}

// Stop ends knotd by its pid with SIGTERM, then SIGKILL after 10 s, and
// returns once it ended. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(stopGrace):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Lookup returns the RRset of name and type as knotd answers it now (an
// unsigned query), sorted as the server returns it; an absent name or type
// is an empty slice.
func (s *Server) Lookup(name string, rrtype uint16) ([]dns.RR, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), rrtype)
	c := &dns.Client{Timeout: 5 * time.Second}
	in, _, err := c.Exchange(m, s.Addr)
	if err != nil {
		return nil, fmt.Errorf("query %s %s: %w", name, dns.TypeToString[rrtype], err)
	}
	if in.Rcode != dns.RcodeSuccess && in.Rcode != dns.RcodeNameError {
		return nil, fmt.Errorf("query %s %s: %s", name, dns.TypeToString[rrtype], dns.RcodeToString[in.Rcode])
	}
	var out []dns.RR
	for _, rr := range in.Answer {
		if rr.Header().Rrtype == rrtype {
			out = append(out, rr)
		}
	}
	return out, nil
}

// freeAddr returns a loopback address whose port is free for both TCP and
// UDP and reserved for this process (proctest.ReserveAddrTCPUDP).
func freeAddr() (string, error) { return proctest.ReserveAddrTCPUDP() }

// Addresses is the sorted A or AAAA values (rrtype dns.TypeA or
// dns.TypeAAAA) the server answers for name now; a failed query fails t.
func (s *Server) Addresses(t testing.TB, name string, rrtype uint16) []string {
	t.Helper()
	rrs, err := s.Lookup(name, rrtype)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rr := range rrs {
		switch x := rr.(type) {
		case *dns.A:
			out = append(out, x.A.String())
		case *dns.AAAA:
			out = append(out, x.AAAA.String())
		}
	}
	slices.Sort(out)
	return out
}
