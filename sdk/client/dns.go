package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// DNSRecord is one record Berth keeps on the DNS server (GET /api/v1/dns-records, docs/dns.md
// section 6.3): its desired values as the union of its holdings, and how far the server has
// caught up. It never carries a credential: the DNS server's TSIG secret stays with the plugin.
type DNSRecord struct {
	// ID is the DNS plugin's resource id, "<zone>/<name>/<type>" ("@" names the apex).
	ID   string `json:"id"`
	FQDN string `json:"fqdn"` // absolute, lower case, with the trailing dot
	Type string `json:"type"` // A, AAAA, TXT or CNAME
	TTL  uint32 `json:"ttl"`  // seconds
	// Values is the desired RRset: every holding's values, sorted, without duplicates. Empty
	// while the record is being removed.
	Values   []string     `json:"values"`
	Holdings []DNSHolding `json:"holdings"`
	// State is written, pending or failed (docs/dns.md section 6.3).
	State string `json:"state"`
	// Generation counts the changes of the desired RRset; Written is the generation the server
	// was last seen to hold; Failed the last one whose write failed for good.
	Generation int64 `json:"generation"`
	Written    int64 `json:"written"`
	Failed     int64 `json:"failed"`
	// LastError and LastCode are those of the write that failed for good at Failed; they stay
	// after a later write succeeds, so read them with State.
	LastError string    `json:"last_error,omitempty"`
	LastCode  string    `json:"last_code,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DNSHolding is one holder's values of a record: `svc/<service id>` (a managed service's edge
// addresses), `acme/<digest>` (one ACME DNS-01 value) or `node/<node id>/<digest>` (one node's
// challenge value).
type DNSHolding struct {
	Holder string    `json:"holder"`
	Values []string  `json:"values"`
	Since  time.Time `json:"since"` // when the holder set these values
}

// DNSRecords lists the records Berth keeps on the DNS server, sorted by name and type (GET
// /api/v1/dns-records, scope services:read, unbounded tokens only). fqdn, when not empty, keeps
// the records of that name (a trailing dot optional). A server without a DNS configuration
// answers the records it still holds, usually none.
func (c *Client) DNSRecords(ctx context.Context, fqdn string) ([]DNSRecord, error) {
	var q url.Values
	if fqdn != "" {
		q = url.Values{"fqdn": {fqdn}}
	}
	var out List[DNSRecord]
	if err := c.do(ctx, http.MethodGet, "/dns-records", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}
