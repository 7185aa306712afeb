package ui

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"

	"github.com/berthhq/berth/sdk/client"
)

// The domains page (docs/ui.md section 1): every domain of every service the viewer may read,
// with the certificate the gateway serves it with and its DNS records. The service list gives
// the domains and TLS modes; the certificate statuses come with a GET of one service (the API
// shows them there only), read for the services whose TLS Berth terminates; the records come
// from one GET /api/v1/dns-records.

// certificateReads is how many services the domains page reads one by one for their
// certificate statuses; the domains of the rest are listed with a pointer to their service.
const certificateReads = 100

// domainRow is one domain of one service: its TLS mode and, when Berth terminates TLS for it
// and the page read it, its certificate's status.
type domainRow struct {
	Domain  string
	Service client.Service
	Mode    string
	Cert    *client.CertificateStatus
	// Unread says the certificate status was not read (beyond certificateReads).
	Unread bool
	// Records are the DNS records Berth keeps for the domain: its own name's and its ACME
	// challenge name's (docs/dns.md section 6.3), by name and type.
	Records []client.DNSRecord
}

// domainsData is what the domains page renders.
type domainsData struct {
	Rows []domainRow
}

// loadDomains lists the domains of every service the viewer may read, by domain, each with its
// DNS records.
func loadDomains(ctx context.Context, c *client.Client) (*domainsData, error) {
	rows, err := domainRows(ctx, c)
	if err != nil {
		return nil, err
	}
	out := &domainsData{Rows: rows}
	if len(rows) == 0 {
		return out, nil
	}
	// The records need services:read on every project, as the project list above does: a
	// viewer who got this far may read them.
	recs, err := c.DNSRecords(ctx, "")
	if err != nil {
		return nil, err
	}
	byName := map[string][]client.DNSRecord{}
	for _, r := range recs {
		n := strings.TrimSuffix(r.FQDN, ".")
		byName[n] = append(byName[n], r)
	}
	for i := range out.Rows {
		d := strings.ToLower(out.Rows[i].Domain)
		out.Rows[i].Records = append(slices.Clone(byName[d]), byName["_acme-challenge."+strings.TrimPrefix(d, "*.")]...)
	}
	return out, nil
}

// domainRows lists the domains of every service the viewer may read, by domain, with their
// certificate statuses.
func domainRows(ctx context.Context, c *client.Client) ([]domainRow, error) {
	svcs, err := allServices(ctx, c)
	if err != nil {
		return nil, err
	}
	var rows []domainRow
	reads := 0
	for _, s := range svcs {
		if len(s.Domains) == 0 {
			continue
		}
		mode := cmp.Or(s.TLS.Mode, "none")
		var statuses []client.CertificateStatus
		unread := false
		if mode == "acme" || mode == "manual" {
			if reads < certificateReads {
				reads++
				one, err := c.GetService(ctx, s.Project, s.Name)
				if apiStatus(err) == http.StatusNotFound {
					continue // deleted since the list was read
				}
				if err != nil {
					return nil, err
				}
				statuses = one.Certificates
			} else {
				unread = true
			}
		}
		for _, d := range s.Domains {
			row := domainRow{Domain: d, Service: s, Mode: mode, Unread: unread}
			if i := slices.IndexFunc(statuses, func(st client.CertificateStatus) bool { return st.Hostname == d }); i >= 0 {
				row.Cert = &statuses[i]
			}
			rows = append(rows, row)
		}
	}
	slices.SortStableFunc(rows, func(a, b domainRow) int { return strings.Compare(a.Domain, b.Domain) })
	return rows, nil
}

func (h *Handler) domainsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "domains", "Domains", nil)
}
