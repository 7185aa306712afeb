package api

import (
	"archive/tar"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/certs"
)

// pemPair returns a self-signed PEM certificate for names and its PEM key.
func pemPair(t *testing.T, names ...string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
}

// TestApplyChecksServiceTLS: a tls block that cannot be served is refused
// at apply with its stable code, and one that can is stored and answered.
func TestApplyChecksServiceTLS(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *Config) {
		c.ACME = certs.Config{DNS01Zones: []string{"managed.example"}, HTTP01Reachable: false}
	})
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	cert, key := pemPair(t, "shop.example.com")
	_, otherKey := pemPair(t, "shop.example.com")
	for name, v := range map[string]string{"shop-cert": cert + key, "wrong-key": cert + otherKey, "no-key": cert} {
		if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/"+name, map[string]any{"value": v}); code/100 != 2 {
			t.Fatalf("put %s: %d %v", name, code, out)
		}
	}
	apply := func(domains []string, tls map[string]any) (int, map[string]any) {
		return f.json("PUT", "/api/v1/projects/shop/services/web", map[string]any{"bundle": "app", "command": []string{"./app"},
			"domains": domains, "tls": tls})
	}
	for name, tc := range map[string]struct {
		domains []string
		tls     map[string]any
		code    string
		want    string
	}{
		"unknown mode":      {[]string{"shop.example.com"}, map[string]any{"mode": "https"}, "tls_mode_invalid", "https"},
		"manual no secret":  {[]string{"shop.example.com"}, map[string]any{"mode": "manual"}, "tls_mode_invalid", "tls.secret"},
		"secret for acme":   {[]string{"a.managed.example"}, map[string]any{"mode": "acme", "secret": "shop-cert"}, "tls_mode_invalid", "only for"},
		"unknown secret":    {[]string{"shop.example.com"}, map[string]any{"mode": "manual", "secret": "ghost"}, "secret_unknown", "ghost"},
		"key does not fit":  {[]string{"shop.example.com"}, map[string]any{"mode": "manual", "secret": "wrong-key"}, "tls_certificate_invalid", "does not match"},
		"no key":            {[]string{"shop.example.com"}, map[string]any{"mode": "manual", "secret": "no-key"}, "tls_certificate_invalid", "PRIVATE KEY"},
		"not covered":       {[]string{"blog.example.com"}, map[string]any{"mode": "manual", "secret": "shop-cert"}, "tls_certificate_invalid", "blog.example.com"},
		"acme unverifiable": {[]string{"shop.example.com"}, map[string]any{"mode": "acme"}, "tls_domain_unverifiable", "port 80"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := apply(tc.domains, tc.tls)
			if code != 422 || out["code"] != tc.code || !strings.Contains(fmt.Sprint(out["detail"]), tc.want) {
				t.Fatalf("%d %v; want 422 %s saying %q", code, out, tc.code, tc.want)
			}
			if strings.Contains(fmt.Sprint(out), "PRIVATE KEY-----") {
				t.Fatal("an answer holds key material")
			}
		})
	}
	code, out := apply([]string{"shop.example.com"}, map[string]any{"mode": "manual", "secret": "shop-cert"})
	if code != 201 || fmt.Sprint(out["tls"]) != "map[mode:manual secret:shop-cert]" {
		t.Fatalf("manual apply: %d %v", code, out)
	}
	// The secret a tls block names is in use like any other reference.
	if code, out := f.json("DELETE", "/api/v1/projects/shop/secrets/shop-cert", nil); code != 409 || out["code"] != "secret_in_use" ||
		!strings.Contains(fmt.Sprint(out["detail"]), "web") {
		t.Fatalf("delete of the tls secret: %d %v", code, out)
	}
	// describe service shows each domain's certificate status.
	if code, out := f.json("GET", "/api/v1/projects/shop/services/web", nil); code != 200 ||
		fmt.Sprint(out["certificates"]) != "[map[challenge: hostname:shop.example.com state:pending updated_at:0001-01-01T00:00:00Z]]" {
		t.Fatalf("service before any status: %d %v", code, out["certificates"])
	}
	notAfter := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	if _, err := f.st.Collection(certs.StatusCollection).InsertOne(context.Background(), certs.Status{Hostname: "shop.example.com",
		State: certs.StateFailed, Challenge: "manual", NotAfter: notAfter, LastError: "the key does not match", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if code, out := f.json("GET", "/api/v1/projects/shop/services/web", nil); code != 200 ||
		!strings.Contains(fmt.Sprint(out["certificates"]), "state:failed") || !strings.Contains(fmt.Sprint(out["certificates"]), "not_after:2027-03-01T00:00:00Z") ||
		!strings.Contains(fmt.Sprint(out["certificates"]), "last_error:the key does not match") {
		t.Fatalf("service with a status: %d %v", code, out["certificates"])
	}
	code, out = f.json("PUT", "/api/v1/projects/shop/services/api", map[string]any{"bundle": "app", "command": []string{"./app"},
		"domains": []string{"api.managed.example"}, "tls": map[string]any{"mode": "acme"}})
	if code != 422 || out["code"] != "tls_domain_unverifiable" || !strings.Contains(fmt.Sprint(out["detail"]), "no DNS provider") {
		t.Fatalf("acme under a zone without a DNS provider: %d %v", code, out)
	}
}
