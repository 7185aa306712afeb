package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store/storetest"
)

// refusingWriter is a DNS plugin that is never reached: the wiring under test only hands the
// records over, it writes nothing.
type refusingWriter struct{}

var errNotReached = errors.New("not reached")

func (refusingWriter) Plan(context.Context, *abiprovider.PlanRequest) (*abiprovider.PlanResponse, error) {
	return nil, errNotReached
}
func (refusingWriter) Apply(context.Context, *abiprovider.ApplyRequest) (*abiprovider.ApplyResponse, error) {
	return nil, errNotReached
}
func (refusingWriter) Delete(context.Context, *abiprovider.DeleteRequest) (*abiprovider.DeleteResponse, error) {
	return nil, errNotReached
}

// TestDNSPluginPublishesDNS01: with ACME and a DNS plugin, the plugin's records become the
// certificates' TXT publisher and, without --acme-dns01-zone, its zones the DNS-01 zones, so a
// wildcard and a name under the zone pass the apply check; explicit zones are kept; without
// ACME or without a DNS plugin nothing changes and a wildcard stays unverifiable.
func TestDNSPluginPublishesDNS01(t *testing.T) {
	st := storetest.Open(t)
	recs, err := dnsrecords.New(dnsrecords.Config{Store: st, Queue: operations.NewQueue(st, operations.Config{}),
		Writer: refusingWriter{}, Zones: []string{"example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	d := &dns{records: recs, zones: []string{"example.test"}}
	log := slog.New(slog.DiscardHandler)
	acme := ACMEConfig{Directory: "https://127.0.0.1:14000/dir"}

	got := withDNS01(acme, d, log)
	if got.DNS != certs.TXTPublisher(recs) {
		t.Fatalf("DNS-01 publisher = %v, want the DNS plugin's records", got.DNS)
	}
	if !slices.Equal(got.DNS01Zones, []string{"example.test"}) {
		t.Errorf("DNS-01 zones = %v, want the DNS plugin's [example.test]", got.DNS01Zones)
	}
	check := acmeChecker(got)
	for _, host := range []string{"*.api.example.test", "shop.example.test"} {
		if err := check.CheckDomain(host); err != nil {
			t.Errorf("CheckDomain(%s) with the DNS plugin wired: %v", host, err)
		}
	}
	if err := check.CheckDomain("*.elsewhere.test"); !errors.Is(err, certs.ErrDomainUnverifiable) {
		t.Errorf("CheckDomain(*.elsewhere.test) = %v, want ErrDomainUnverifiable", err)
	}

	explicit := acme
	explicit.DNS01Zones = []string{"api.example.test"}
	if got := withDNS01(explicit, d, log); !slices.Equal(got.DNS01Zones, []string{"api.example.test"}) || got.DNS == nil {
		t.Errorf("explicit zones: got zones %v, publisher %v", got.DNS01Zones, got.DNS)
	}

	for name, c := range map[string]ACMEConfig{
		"no dns plugin": withDNS01(acme, nil, log),
		"no acme":       withDNS01(ACMEConfig{}, d, log),
	} {
		if c.DNS != nil || len(c.DNS01Zones) != 0 {
			t.Errorf("%s: publisher %v, zones %v; want none", name, c.DNS, c.DNS01Zones)
		}
	}
	if err := acmeChecker(withDNS01(acme, nil, log)).CheckDomain("*.api.example.test"); !errors.Is(err, certs.ErrDomainUnverifiable) {
		t.Errorf("wildcard without a DNS plugin: %v, want ErrDomainUnverifiable", err)
	}
}
