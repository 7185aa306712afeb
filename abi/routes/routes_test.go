package routes

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	up := Upstream{WorkloadID: "wl_1", Address: "10.0.0.1:8080", Healthy: true}
	ok := Route{Hostname: "a.example.com", Upstreams: []Upstream{up}, TLSMode: TLSNone, AllowSources: []string{"10.0.0.0/8", "fd00::/8", "192.0.2.7/32"}}
	if err := (Table{Routes: []Route{ok, {Hostname: "b.example.com", TLSMode: TLSACME}, {Hostname: "c", TLSMode: TLSPassthrough}}}).Validate(); err != nil {
		t.Fatalf("a routable table: %v", err)
	}
	for _, tc := range []struct {
		name string
		r    Route
		want string
	}{
		{"empty hostname", Route{}, "empty or repeated"},
		{"upper case", Route{Hostname: "A.example.com"}, "lower case"},
		{"trailing dot", Route{Hostname: "a.example.com."}, "trailing dot"},
		{"port", Route{Hostname: "a.example.com:80"}, "without port"},
		{"inner wildcard", Route{Hostname: "a.*.example.com"}, "wildcard other than"},
		{"tls mode", Route{Hostname: "a.test", TLSMode: "https"}, `unknown tls_mode "https"`},
		{"not a prefix", Route{Hostname: "a.test", AllowSources: []string{"10.0.0.1"}}, "not a CIDR prefix"},
		{"host bits", Route{Hostname: "a.test", AllowSources: []string{"10.0.0.1/8"}}, "write 10.0.0.0/8"},
		{"no workload", Route{Hostname: "a.test", Upstreams: []Upstream{{Address: "10.0.0.1:1"}}}, "no workload_id"},
		{"bad address", Route{Hostname: "a.test", Upstreams: []Upstream{{WorkloadID: "wl_1", Address: "10.0.0.1"}}}, "not host:port"},
	} {
		err := (Table{Routes: []Route{tc.r}}).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		// Each word and the name once: not "route X: hostname name "X" ...".
		if err != nil && (strings.Contains(err.Error(), "hostname name") || strings.Count(err.Error(), tc.r.Hostname) > 1 && tc.r.Hostname != "") {
			t.Errorf("%s: %q says a word or the name twice", tc.name, err)
		}
	}
	if err := (Table{Routes: []Route{ok, ok}}).Validate(); err == nil || !strings.Contains(err.Error(), "repeated") {
		t.Errorf("a repeated hostname: %v", err)
	}
}

// testPEM is a syntactically valid PEM pair for Validate (never parsed as a
// key: Validate checks only that the blocks are there).
const (
	testCertPEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	testKeyPEM  = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n"
)

func TestValidateTLS(t *testing.T) {
	t.Parallel()
	cert := Certificate{Names: []string{"a.example.com", "*.example.com"}, CertPEM: testCertPEM, KeyPEM: testKeyPEM}
	base := func() Table {
		return Table{
			Routes: []Route{
				{Hostname: "a.example.com", TLSMode: TLSACME, HTTPSRedirect: true, HSTSMaxAgeS: 3600},
				{Hostname: "m.example.com", TLSMode: TLSManual},
				{Hostname: "p.example.com", TLSMode: TLSPassthrough, HTTPSRedirect: true},
			},
			Certificates: []Certificate{cert},
			Challenges:   []Challenge{{Host: "a.example.com", Token: "tok-EN_1", KeyAuth: "tok-EN_1.thumb"}, {Host: "x.example.com", Token: "t", KeyAuth: "t.k"}},
			Excluded:     []Exclusion{{Hostname: "x.example.com", Reason: "claimed by shop/web and blog/www"}},
		}
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("a valid TLS table: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Table)
		want string
	}{
		{"cert without names", func(t *Table) { t.Certificates[0].Names = nil }, "no names"},
		{"upper-case name", func(t *Table) { t.Certificates[0].Names = []string{"A.example.com"} }, "lower case"},
		{"deep wildcard", func(t *Table) { t.Certificates[0].Names = []string{"a.*.example.com"} }, "wildcard other than"},
		{"partial wildcard", func(t *Table) { t.Certificates[0].Names = []string{"a*.example.com"} }, "wildcard other than"},
		{"bare wildcard", func(t *Table) { t.Certificates[0].Names = []string{"*."} }, "empty"},
		{"no cert PEM", func(t *Table) { t.Certificates[0].CertPEM = "junk" }, "no PEM CERTIFICATE"},
		{"no key PEM", func(t *Table) { t.Certificates[0].KeyPEM = testCertPEM }, "no PEM private key"},
		{"challenge for a stranger", func(t *Table) { t.Challenges[0].Host = "other.test" }, "neither routed nor excluded"},
		{"challenge token", func(t *Table) { t.Challenges[0].Token = "../etc" }, "not base64url"},
		{"challenge key auth", func(t *Table) { t.Challenges[0].KeyAuth = "" }, "key_auth is empty"},
		{"excluded and routed", func(t *Table) { t.Excluded[0].Hostname = "a.example.com" }, "also routed"},
		{"exclusion without reason", func(t *Table) { t.Excluded[0].Reason = "" }, "no reason"},
		{"redirect without TLS", func(t *Table) { t.Routes[1] = Route{Hostname: "m.example.com", HTTPSRedirect: true} }, "https_redirect needs"},
		{"HSTS on passthrough", func(t *Table) { t.Routes[2].HSTSMaxAgeS = 60 }, "hsts_max_age_s needs"},
		{"HSTS negative", func(t *Table) { t.Routes[0].HSTSMaxAgeS = -1 }, "hsts_max_age_s is -1"},
	} {
		tb := base()
		tb.Certificates = []Certificate{cert}
		tb.Certificates[0].Names = append([]string(nil), cert.Names...)
		tc.edit(&tb)
		err := tb.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%s: the error shows the key: %v", tc.name, err)
		}
	}
}

func TestCertificateNeverPrintsItsKey(t *testing.T) {
	t.Parallel()
	c := Certificate{Names: []string{"a.example.com"}, CertPEM: testCertPEM, KeyPEM: testKeyPEM}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "cert", c, "table", Table{Certificates: []Certificate{c}})
	for _, out := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c), fmt.Sprintf("%+v", Table{Certificates: []Certificate{c}}), logged.String()} {
		if strings.Contains(out, "c2VjcmV0") || strings.Contains(out, "PRIVATE KEY") {
			t.Errorf("the key is printed: %s", out)
		}
		if !strings.Contains(out, "a.example.com") {
			t.Errorf("the names are not printed: %s", out)
		}
	}
}

func TestCoversAndDigest(t *testing.T) {
	t.Parallel()
	c := Certificate{Names: []string{"*.example.com", "example.com"}}
	for host, want := range map[string]bool{"a.example.com": true, "example.com": true, "a.b.example.com": false, "example.org": false, "com": false} {
		if got := c.Covers(host); got != want {
			t.Errorf("Covers(%q) = %v, want %v", host, got, want)
		}
	}
	rt := Table{Routes: []Route{{Hostname: "a.test"}}}
	withCert := rt
	withCert.Certificates = []Certificate{{Names: []string{"a.test"}, CertPEM: "1"}}
	renewed := rt
	renewed.Certificates = []Certificate{{Names: []string{"a.test"}, CertPEM: "2"}}
	if rt.Digest() == withCert.Digest() || withCert.Digest() == renewed.Digest() {
		t.Errorf("digest ignores certificates: %s %s %s", rt.Digest(), withCert.Digest(), renewed.Digest())
	}
	red := withCert.Redacted()
	if red.Certificates[0].CertPEM != "" || red.Certificates[0].Names[0] != "a.test" || withCert.Certificates[0].CertPEM != "1" {
		t.Errorf("Redacted: %+v, from %+v", red.Certificates, withCert.Certificates)
	}
	raw, _ := json.Marshal(rt.Routes)
	sum := sha256.Sum256(raw)
	if rt.Digest() != hex.EncodeToString(sum[:]) {
		t.Errorf("a table without TLS parts no longer digests its routes alone")
	}
}
