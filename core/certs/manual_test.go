package certs_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/store/storetest"
)

// selfSigned returns a PEM certificate for names valid until notAfter and
// its PEM private key.
func selfSigned(t *testing.T, notAfter time.Time, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// TestCheckPairRefusesWhatCannotServe: a key of another certificate, a
// certificate that does not cover a domain, an expired one, and a secret
// without a key are refused with ErrCertificateInvalid; a good pair passes.
func TestCheckPairRefusesWhatCannotServe(t *testing.T) {
	now := time.Now()
	good, goodKey := selfSigned(t, now.Add(24*time.Hour), "shop.example.com", "*.shop.example.com")
	_, otherKey := selfSigned(t, now.Add(24*time.Hour), "shop.example.com")
	old, oldKey := selfSigned(t, now.Add(-time.Hour), "shop.example.com")
	if _, err := certs.CheckPair(good, goodKey, []string{"shop.example.com", "*.shop.example.com", "a.shop.example.com"}, now); err != nil {
		t.Fatalf("good pair: %v", err)
	}
	for name, c := range map[string]struct {
		cert, key []byte
		hosts     []string
		want      string
	}{
		"key of another": {good, otherKey, []string{"shop.example.com"}, "private key does not match"},
		"not covered":    {good, goodKey, []string{"blog.example.com"}, "does not cover blog.example.com"},
		"wildcard":       {good, goodKey, []string{"*.example.com"}, "does not cover *.example.com"},
		"expired":        {old, oldKey, []string{"shop.example.com"}, "expired"},
	} {
		_, err := certs.CheckPair(c.cert, c.key, c.hosts, now)
		if !errors.Is(err, certs.ErrCertificateInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrCertificateInvalid saying %q", name, err, c.want)
		}
	}
	if _, _, err := certs.SplitPEM(good); !errors.Is(err, certs.ErrCertificateInvalid) {
		t.Errorf("a secret without a key: %v", err)
	}
	c, k, err := certs.SplitPEM(append(append([]byte{}, good...), goodKey...))
	if err != nil || string(c) != string(good) || string(k) != string(goodKey) {
		t.Errorf("split: %v", err)
	}
}

// TestCheckDomainSaysWhyNoChallengeProvesIt: names under a DNS zone pass,
// wildcards outside one and names without a reachable port 80 are refused.
func TestCheckDomainSaysWhyNoChallengeProvesIt(t *testing.T) {
	withDNS := certs.Config{DNS: txtPublisher{dnsSrv}, DNS01Zones: []string{"example.com"}}
	if err := withDNS.CheckDomain("*.apps.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := withDNS.CheckDomain("example.com"); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		cfg  certs.Config
		host string
		want string
	}{
		"wildcard outside": {withDNS, "*.example.org", "only DNS-01"},
		"no port 80":       {withDNS, "shop.example.org", "port 80"},
		"zone without dns": {certs.Config{DNS01Zones: []string{"example.com"}}, "shop.example.com", "no DNS provider"},
	} {
		err := c.cfg.CheckDomain(c.host)
		if !errors.Is(err, certs.ErrDomainUnverifiable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrDomainUnverifiable saying %q", name, err, c.want)
		}
	}
	if err := (certs.Config{HTTP01Reachable: true}).CheckDomain("shop.example.org"); err != nil {
		t.Fatal(err)
	}
}

// manualSource is a ManualSource of fixed answers (standing for the
// service's tls secret read through core/secrets).
type manualSource struct {
	cert, key []byte
	err       error
}

func (s *manualSource) ManualCertificate(context.Context, string, string) ([]byte, []byte, error) {
	return s.cert, s.key, s.err
}

// TestManualRoutesServeTheirSecret: a manual route's pair goes into the
// table with status issued; a pair that stops matching leaves it failed
// while the last good pair keeps serving; a withdrawn route loses its status.
func TestManualRoutesServeTheirSecret(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	cert, key := selfSigned(t, time.Now().Add(24*time.Hour), "manual.example.com")
	src := &manualSource{cert: cert, key: key}
	m, err := certs.New(certs.Config{Store: st, Keyring: keyring(t), Next: s, Owner: "brd_a", DirectoryURL: ca.Directory,
		CARootFile: ca.CARootFile, Manual: src, ManualRefresh: -1, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	tb := table(route("manual.example.com", certs.ModeManual))
	if err := m.SetRoutes(ctx, tb); err != nil {
		t.Fatal(err)
	}
	c, ok := certFor(s.last, "manual.example.com")
	if !ok || c.CertPEM != string(cert) || c.KeyPEM != string(key) {
		t.Fatalf("table certificates %+v", s.last.Certificates)
	}
	if got, err := m.Status(ctx, "manual.example.com"); err != nil || got.State != certs.StateIssued || got.Challenge != "manual" {
		t.Fatalf("status %+v, %v", got, err)
	}
	_, src.key = selfSigned(t, time.Now().Add(24*time.Hour), "manual.example.com")
	tb.Revision++
	if err := m.SetRoutes(ctx, tb); err != nil {
		t.Fatal(err)
	}
	if c, ok := certFor(s.last, "manual.example.com"); !ok || c.KeyPEM != string(key) {
		t.Fatal("the last good pair stopped serving when the secret went bad")
	}
	got, err := m.Status(ctx, "manual.example.com")
	if err != nil || got.State != certs.StateFailed || !strings.Contains(got.LastError, "does not match") {
		t.Fatalf("status %+v, %v", got, err)
	}
	if err := m.SetRoutes(ctx, table()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Status(ctx, "manual.example.com"); err == nil {
		t.Fatal("a withdrawn manual route keeps its status")
	}
}

// TestManualSecretChangeIsServed: a new pair in the tls secret reaches the
// table without any route change.
func TestManualSecretChangeIsServed(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	cert, key := selfSigned(t, time.Now().Add(24*time.Hour), "rotate.example.com")
	src := &lockedSource{}
	src.set(cert, key)
	m, err := certs.New(certs.Config{Store: st, Keyring: keyring(t), Next: s, Owner: "brd_a",
		Manual: src, ManualRefresh: 50 * time.Millisecond, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.SetRoutes(context.Background(), table(route("rotate.example.com", certs.ModeManual))); err != nil {
		t.Fatal(err)
	}
	cert2, key2 := selfSigned(t, time.Now().Add(48*time.Hour), "rotate.example.com")
	src.set(cert2, key2)
	s.await(t, "the new pair", func(tb abiroutes.Table) bool {
		c, ok := certFor(tb, "rotate.example.com")
		return ok && c.CertPEM == string(cert2)
	})
}

// lockedSource is a ManualSource whose pair a test changes while the
// Manager reads it.
type lockedSource struct {
	mu        sync.Mutex
	cert, key []byte
}

func (s *lockedSource) set(cert, key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cert, s.key = cert, key
}

func (s *lockedSource) ManualCertificate(context.Context, string, string) ([]byte, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, s.key, nil
}
