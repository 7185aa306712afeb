package identity

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

func TestServerTLSGeneratedOnceAndPinned(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := LoadOrCreateServerTLS(dir, "", "", []string{"127.0.0.1", "berth.example"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Created {
		t.Error("first start did not report a created certificate")
	}
	fi, err := os.Stat(filepath.Join(dir, TLSKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
	}
	leaf, err := x509.ParseCertificate(first.Certificate.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.VerifyHostname("berth.example"); err != nil {
		t.Errorf("certificate names: %v", err)
	}
	if got := client.Fingerprint(leaf.Raw); got != first.Fingerprint {
		t.Errorf("fingerprint %s, sdk computes %s", first.Fingerprint, got)
	}
	b, err := os.ReadFile(filepath.Join(dir, FingerprintFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) != first.Fingerprint {
		t.Errorf("server-fingerprint holds %q, want %q", b, first.Fingerprint)
	}

	again, err := LoadOrCreateServerTLS(dir, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || again.Fingerprint != first.Fingerprint {
		t.Errorf("second start: created %v, fingerprint %s; want the same certificate", again.Created, again.Fingerprint)
	}

	// An operator-supplied pair is loaded as is, and the fingerprint file follows it.
	other := t.TempDir()
	supplied, err := LoadOrCreateServerTLS(other, filepath.Join(dir, TLSCertFile), filepath.Join(dir, TLSKeyFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if supplied.Created || supplied.Fingerprint != first.Fingerprint {
		t.Errorf("supplied certificate: created %v, fingerprint %s", supplied.Created, supplied.Fingerprint)
	}
	if _, err := os.Stat(filepath.Join(other, TLSKeyFile)); !os.IsNotExist(err) {
		t.Errorf("a key was generated beside an operator-supplied one: %v", err)
	}
	if _, err := LoadOrCreateServerTLS(other, filepath.Join(dir, TLSCertFile), "", nil); err == nil {
		t.Error("a certificate without its key was accepted")
	}

	// A key others can read is refused.
	if err := os.Chmod(filepath.Join(dir, TLSKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateServerTLS(dir, "", "", nil); err == nil {
		t.Error("a group/world-readable TLS key was accepted")
	}
}
