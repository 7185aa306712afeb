package dnsrecords

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Domain is one domain of a service whose DNS Berth manages (`dns: managed`, docs/dns.md
// section 7): Holder names the service ([ServiceHolder]), Host the domain.
type Domain struct {
	Holder string
	Host   string
}

// ServiceHolder is the holder name of the records of service serviceID.
func ServiceHolder(serviceID string) string { return HolderService + serviceID }

// SyncManaged makes the managed records exactly domains: each domain in the zones gets an A
// record of the IPv4 and an AAAA record of the IPv6 addresses among edge, held by its service;
// every record a service holds that domains no longer name (a domain dropped, `dns: managed`
// turned off, the service deleted, an address family no longer among edge) is withdrawn, and
// goes from the server once nobody else holds it. Domains outside the zones are skipped and
// returned. Idempotent; each change is one compare-and-set and one enqueued write, an
// unchanged record costs one read.
func (r *Records) SyncManaged(ctx context.Context, domains []Domain, edge []string) (skipped []string, err error) {
	v4, v6 := SplitAddresses(edge)
	type key struct{ holder, id string }
	want := map[key]bool{}
	var errs []error
	for _, d := range domains {
		if !r.Served(d.Host) {
			skipped = append(skipped, d.Host)
			continue
		}
		for _, fam := range []struct {
			typ    string
			values []string
		}{{"A", v4}, {"AAAA", v6}} {
			id, _ := r.recordID(d.Host, fam.typ) // served: cannot fail
			if len(fam.values) == 0 {
				continue // withdrawn below when held
			}
			want[key{d.Holder, id}] = true
			if _, err := r.Set(ctx, d.Host, fam.typ, d.Holder, fam.values); err != nil {
				errs = append(errs, err)
			}
		}
	}
	var recs []Record
	if err := r.cfg.Store.All(ctx, Collection, &recs); err != nil {
		return skipped, fmt.Errorf("dnsrecords: %w", err)
	}
	for _, rec := range recs {
		for _, h := range rec.Holdings {
			if !strings.HasPrefix(h.Holder, HolderService) || want[key{h.Holder, rec.ID}] {
				continue
			}
			if _, err := r.Set(ctx, rec.FQDN, rec.Type, h.Holder, nil); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return skipped, errors.Join(errs...)
}
