package api

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/sdk/client"
)

// TestDNSRecords plants three records in dns_records (one the server holds, one whose write
// failed for good, one waiting for its write) and reads them through the Go client: sorted by
// name and type, each with its values, holdings and write state; ?fqdn= keeps one name whatever
// its case or trailing dot, and a name longer than DNS allows is refused.
func TestDNSRecords(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	for _, rec := range []dnsrecords.Record{
		{ID: "example.test/shop/AAAA", FQDN: "shop.example.test.", Type: "AAAA", TTL: 300, Generation: 2, Written: 1,
			Holdings: []dnsrecords.Holding{{Holder: "svc/svc_shop", Values: []string{"2001:db8::1"}, Since: at}}, UpdatedAt: at},
		{ID: "example.test/shop/A", FQDN: "shop.example.test.", Type: "A", TTL: 300, Generation: 3, Written: 3, Failed: 2,
			LastError: "earlier refusal", LastCode: "dns_auth_refused", UpdatedAt: at, Holdings: []dnsrecords.Holding{
				{Holder: "svc/svc_shop", Values: []string{"192.0.2.2", "192.0.2.1"}, Since: at},
				{Holder: "svc/svc_other", Values: []string{"192.0.2.1"}, Since: at}}},
		{ID: "example.test/_acme-challenge.api/TXT", FQDN: "_acme-challenge.api.example.test.", Type: "TXT", TTL: 60, Generation: 1, Failed: 1,
			LastError: "the server refused the TSIG key", LastCode: "dns_auth_refused", UpdatedAt: at,
			Holdings: []dnsrecords.Holding{{Holder: "acme/0011", Values: []string{"token-digest"}, Since: at}}},
	} {
		if err := f.st.Insert(ctx, dnsrecords.Collection, rec); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(f.srv.URL, client.WithToken(f.admin))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.DNSRecords(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		FQDN, Type, State, LastCode string
		Values                      []string
		Holders                     int
	}
	var rows []row
	for _, r := range got {
		rows = append(rows, row{r.FQDN, r.Type, r.State, r.LastCode, r.Values, len(r.Holdings)})
	}
	want := []row{
		{"_acme-challenge.api.example.test.", "TXT", "failed", "dns_auth_refused", []string{"token-digest"}, 1},
		{"shop.example.test.", "A", "written", "dns_auth_refused", []string{"192.0.2.1", "192.0.2.2"}, 2},
		{"shop.example.test.", "AAAA", "pending", "", []string{"2001:db8::1"}, 1},
	}
	if d := cmp.Diff(want, rows); d != "" {
		t.Fatalf("GET /dns-records (-want +got):\n%s", d)
	}
	if got[0].LastError != "the server refused the TSIG key" || got[0].TTL != 60 || !got[0].UpdatedAt.Equal(at) {
		t.Errorf("the failed record reads %+v", got[0])
	}

	one, err := c.DNSRecords(ctx, "SHOP.example.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 2 || one[0].FQDN != "shop.example.test." || one[1].FQDN != "shop.example.test." {
		t.Fatalf("?fqdn=SHOP.example.test answered %+v; want the two records of shop.example.test.", one)
	}
	if none, err := c.DNSRecords(ctx, "nothing.example.test."); err != nil || len(none) != 0 {
		t.Fatalf("?fqdn= of a name without records: %v, %+v; want an empty list", err, none)
	}
	code, out := f.json("GET", "/api/v1/dns-records?fqdn="+strings.Repeat("a", 300), nil)
	wantCode(t, "an fqdn of 300 characters", code, out, 400, "bad_request")
}
