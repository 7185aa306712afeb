package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/sdk/client"
)

// DNSRecordLister lists the DNS records Berth keeps ([dnsrecords.Reader]).
type DNSRecordLister interface {
	// List returns the records sorted by name and type; fqdn, when not empty, keeps those of
	// that name.
	List(ctx context.Context, fqdn string) ([]dnsrecords.Record, error)
}

var _ DNSRecordLister = dnsrecords.Reader{}

// maxFQDN is the longest name a DNS record can have (RFC 1035: 255 octets on the wire, so 253
// characters without the trailing dot); a longer filter is a client's mistake.
const maxFQDN = 254

func (s *Server) registerDNS(v1 *echo.Group) {
	v1.GET("/dns-records", s.listDNSRecords, s.auth(identity.ScopeServicesRead))
}

// listDNSRecords serves GET /api/v1/dns-records (docs/dns.md section 6.3): every record of
// dns_records with its holdings and write state, optionally those of one name (?fqdn=). It
// reads through Config.DNSRecords; none configured answers an empty list.
func (s *Server) listDNSRecords(c echo.Context) error {
	fqdn := c.QueryParam("fqdn")
	if len(fqdn) > maxFQDN {
		return problem(abierrors.BadRequest, "fqdn is longer than a DNS name can be (253 characters)")
	}
	out := client.List[client.DNSRecord]{Items: []client.DNSRecord{}}
	if s.cfg.DNSRecords == nil {
		return c.JSON(http.StatusOK, out)
	}
	recs, err := s.cfg.DNSRecords.List(c.Request().Context(), fqdn)
	if err != nil {
		return err
	}
	for i := range recs {
		out.Items = append(out.Items, toAPIDNSRecord(&recs[i]))
	}
	return c.JSON(http.StatusOK, out)
}

// toAPIDNSRecord is r as the API shows it.
func toAPIDNSRecord(r *dnsrecords.Record) client.DNSRecord {
	out := client.DNSRecord{ID: r.ID, FQDN: r.FQDN, Type: r.Type, TTL: r.TTL, Values: r.Values(), Holdings: []client.DNSHolding{},
		State: string(r.State()), Generation: r.Generation, Written: r.Written, Failed: r.Failed,
		LastError: r.LastError, LastCode: r.LastCode, UpdatedAt: r.UpdatedAt}
	if out.Values == nil {
		out.Values = []string{}
	}
	for _, h := range r.Holdings {
		out.Holdings = append(out.Holdings, client.DNSHolding{Holder: h.Holder, Values: h.Values, Since: h.Since})
	}
	return out
}
