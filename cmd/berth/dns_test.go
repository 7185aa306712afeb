package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// TestDNSRecordsCommand serves the real API over the embedded store with two records planted in
// dns_records and runs `berth dns records`: one aligned row per record through the one table
// writer, the failed write's error below the table, a name argument that keeps one name, and
// -o json that decodes as the client's records.
func TestDNSRecordsCommand(t *testing.T) {
	t.Parallel()
	st, _, url, admin := apiOnStore(t, func(_ string, st *store.Store, cfg *api.Config) { cfg.DNSRecords = dnsrecords.NewReader(st) })
	ctx := context.Background()

	at := testNow().Add(-3 * time.Minute)
	for _, rec := range []dnsrecords.Record{
		{ID: "example.test/shop/A", FQDN: "shop.example.test.", Type: "A", TTL: 300, Generation: 2, Written: 2, UpdatedAt: at,
			Holdings: []dnsrecords.Holding{{Holder: "svc/svc_shop", Values: []string{"192.0.2.1", "192.0.2.2"}, Since: at}}},
		{ID: "example.test/_acme-challenge.a-much-longer-name/TXT", FQDN: "_acme-challenge.a-much-longer-name.example.test.", Type: "TXT", TTL: 60,
			Generation: 1, Failed: 1, LastError: "the server refused the TSIG key", LastCode: "dns_auth_refused", UpdatedAt: at,
			Holdings: []dnsrecords.Holding{{Holder: "acme/00ff", Values: []string{"challenge-value"}, Since: at}}},
	} {
		if err := st.Insert(ctx, dnsrecords.Collection, rec); err != nil {
			t.Fatal(err)
		}
	}
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = url, admin

	out := c.ok("", "dns", "records")
	assertAligned(t, "dns records", out, []string{"NAME", "TYPE", "TTL", "VALUES", "HOLDERS", "STATE", "UPDATED"}, 2)
	lines := strings.Split(out, "\n")
	for i, want := range []string{"_acme-challenge.a-much-longer-name.example.test.", "shop.example.test."} {
		if !strings.HasPrefix(lines[i+1], want) {
			t.Errorf("row %d is %q; want it to start with %q (rows sorted by name)", i+1, lines[i+1], want)
		}
	}
	for _, want := range []string{"192.0.2.1,192.0.2.2", "svc/svc_shop", "written", "failed", "3m\n",
		"\n_acme-challenge.a-much-longer-name.example.test. TXT failed: the server refused the TSIG key (dns_auth_refused)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("dns records lacks %q:\n%s", want, out)
		}
	}

	if one := c.ok("", "dns", "records", "SHOP.example.test"); strings.Contains(one, "_acme-challenge") || !strings.Contains(one, "shop.example.test.") {
		t.Errorf("dns records SHOP.example.test does not keep that one name:\n%s", one)
	}
	if none := c.ok("", "dns", "records", "nothing.example.test"); none != "no DNS records\n" {
		t.Errorf("dns records of a name without records printed %q", none)
	}
	var recs []client.DNSRecord
	if err := json.Unmarshal([]byte(c.ok("", "dns", "records", "-o", "json")), &recs); err != nil || len(recs) != 2 || recs[1].State != "written" {
		t.Errorf("dns records -o json: %v, %+v", err, recs)
	}
}
