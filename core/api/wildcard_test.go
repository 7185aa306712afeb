package api

import (
	"archive/tar"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/certs"
)

// nopTXT is a DNS-01 publisher the apply check only looks at (nothing is ordered here).
type nopTXT struct{}

func (nopTXT) PresentTXT(context.Context, string, string) error { return nil }
func (nopTXT) CleanupTXT(context.Context, string, string) error { return nil }

// TestApplyWildcardDomains: "*." as the whole first label of a domain is accepted and kept as
// its own name: with tls mode acme only under a DNS-01 zone with a DNS provider (else
// tls_domain_unverifiable), with manual only when the certificate names the wildcard itself;
// its claim is its own (a second service cannot take it, a name under it is another name); a
// wildcard anywhere else, or over a single label, is refused with validation_failed.
func TestApplyWildcardDomains(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *Config) {
		c.ACME = certs.Config{DNS: nopTXT{}, DNS01Zones: []string{"example.test"}}
	})
	bundle := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: bundle}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	cert, key := pemPair(t, "*.w.example.test")
	narrow, narrowKey := pemPair(t, "x.api.example.test")
	for name, v := range map[string]string{"wild-cert": cert + key, "narrow-cert": narrow + narrowKey} {
		if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/"+name, map[string]any{"value": v}); code/100 != 2 {
			t.Fatalf("put %s: %d %v", name, code, out)
		}
	}
	apply := func(service string, domains []string, tls map[string]any) (int, map[string]any) {
		t.Helper()
		return f.json("PUT", "/api/v1/projects/shop/services/"+service, map[string]any{"bundle": "app", "command": []string{"./app"},
			"domains": domains, "tls": tls, "dns": "managed"})
	}
	acme := map[string]any{"mode": "acme"}

	for name, tc := range map[string]struct {
		domains []string
		tls     map[string]any
		code    string
		want    string
	}{
		"wildcard inside":     {[]string{"a.*.example.test"}, acme, "validation_failed", "a.*.example.test"},
		"two wildcards":       {[]string{"*.*.example.test"}, acme, "validation_failed", "not a valid wildcard"},
		"partial label":       {[]string{"*shop.example.test"}, acme, "validation_failed", "*shop.example.test"},
		"over a single label": {[]string{"*.test"}, acme, "validation_failed", "at least two labels"},
		"bare star":           {[]string{"*"}, acme, "validation_failed", "not a valid hostname"},
		"acme outside zones":  {[]string{"*.shop.elsewhere.test"}, acme, "tls_domain_unverifiable", "wildcard"},
		"manual not covering": {[]string{"*.api.example.test"}, map[string]any{"mode": "manual", "secret": "narrow-cert"}, "tls_certificate_invalid", "*.api.example.test"},
		"listed twice (case)": {[]string{"*.api.example.test", "*.API.example.test."}, acme, "validation_failed", "twice"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := apply("bad", tc.domains, tc.tls)
			if code != 422 || out["code"] != tc.code || !strings.Contains(fmt.Sprint(out["detail"]), tc.want) {
				t.Fatalf("%d %v; want 422 %s saying %q", code, out, tc.code, tc.want)
			}
		})
	}

	code, out := apply("web", []string{"shop.example.test", "*.API.example.test."}, acme)
	if code != 201 || fmt.Sprint(out["domains"]) != "[shop.example.test *.api.example.test]" {
		t.Fatalf("acme wildcard under the DNS-01 zone: %d %v", code, out)
	}
	// The wildcard is claimed as a name of its own: another service cannot take it, but a name
	// one label below it is another hostname (served by its own route, which wins over the
	// wildcard at the gateway).
	code, out = apply("other", []string{"*.api.example.test"}, acme)
	if code != 409 || out["code"] != "already_exists" || !strings.Contains(fmt.Sprint(out["detail"]), "shop/web") {
		t.Fatalf("second claim of the wildcard: %d %v; want 409 already_exists naming shop/web", code, out)
	}
	if code, out := apply("other", []string{"x.api.example.test"}, acme); code != 201 {
		t.Fatalf("a name under another service's wildcard: %d %v", code, out)
	}
	if code, out := apply("manual", []string{"*.m.api.example.test"}, map[string]any{"mode": "manual", "secret": "narrow-cert"}); code != 422 || out["code"] != "tls_certificate_invalid" {
		t.Fatalf("manual certificate for another name: %d %v", code, out)
	}
	// A manual certificate naming the wildcard serves it; plain HTTP needs no certificate.
	if code, out := apply("manual", []string{"*.w.example.test"}, map[string]any{"mode": "manual", "secret": "wild-cert"}); code != 201 {
		t.Fatalf("manual wildcard certificate: %d %v", code, out)
	}
	if code, out := apply("plain", []string{"*.plain.example.test"}, nil); code != 201 {
		t.Fatalf("wildcard without tls: %d %v", code, out)
	}

	// Without a DNS provider a wildcard under the zone cannot be proven.
	g := newFixtureWith(t, func(c *Config) { c.ACME = certs.Config{DNS01Zones: []string{"example.test"}, HTTP01Reachable: true} })
	if code, out := g.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: g.admin, body: bundle}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	code, out = g.json("PUT", "/api/v1/projects/shop/services/web", map[string]any{"bundle": "app", "command": []string{"./app"},
		"domains": []string{"*.api.example.test"}, "tls": acme})
	if code != 422 || out["code"] != "tls_domain_unverifiable" || !strings.Contains(fmt.Sprint(out["detail"]), "no DNS provider") {
		t.Fatalf("acme wildcard without a DNS provider: %d %v", code, out)
	}
}
