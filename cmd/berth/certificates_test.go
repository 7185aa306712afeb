package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/client"
)

// TestCertificateColumn: berth routes shows each TLS route's certificate
// state and expiry, and the failure of a failed one under the table.
func TestCertificateColumn(t *testing.T) {
	cs := map[string]client.CertificateStatus{
		"a.example.com": {State: "issued", NotAfter: time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)},
		"b.example.com": {State: "failed", LastError: "urn:ietf:params:acme:error:rejectedIdentifier: forbidden"},
	}
	for _, c := range []struct{ host, mode, want string }{
		{"a.example.com", "acme", "issued until 2027-03-01"},
		{"b.example.com", "acme", "failed"},
		{"c.example.com", "manual", "pending"},
		{"d.example.com", "none", "-"},
	} {
		if got := certificateCell(cs, c.host, c.mode); got != c.want {
			t.Errorf("%s: %q, want %q", c.host, got, c.want)
		}
	}
	var out bytes.Buffer
	printCertificateErrors(&out, []routes.Route{{Hostname: "a.example.com"}, {Hostname: "b.example.com"}}, cs)
	if want := "\ncertificate of b.example.com failed: urn:ietf:params:acme:error:rejectedIdentifier: forbidden\n"; out.String() != want {
		t.Fatalf("%q, want %q", out.String(), want)
	}
}
