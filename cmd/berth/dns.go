package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// newDNSCmd is `berth dns`: what Berth keeps on the DNS server (docs/dns.md).
func newDNSCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Show the DNS records Berth keeps on the DNS server",
	}
	cmd.AddCommand(newDNSRecordsCmd(a))
	return cmd
}

// newDNSRecordsCmd is `berth dns records [FQDN]` (GET /api/v1/dns-records).
func newDNSRecordsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "records [FQDN]",
		Short: "List the DNS records Berth keeps, with their write state",
		Long: `records lists the records Berth keeps on the DNS server through its DNS plugin
(docs/dns.md section 6.3): the A and AAAA records of the domains of services with
"dns: managed", and the TXT records of ACME DNS-01 challenges in flight. Each row
shows the record's name, type, TTL, its values (the union of what its holders
hold), the holders, and its write state: written (the server holds it), pending
(a write is queued or being retried) or failed (the write failed for good; the
error is listed below the table, and the next change writes again). FQDN keeps
the records of one name. It needs services:read on every project (a token
bound to one project is refused). No credential is ever shown.`,
		Example: `  berth dns records
  berth dns records shop.example.com -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			fqdn := ""
			if len(args) == 1 {
				fqdn = args[0]
			}
			recs, err := c.DNSRecords(cmd.Context(), fqdn)
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, recs)
			}
			if len(recs) == 0 {
				fmt.Fprintln(a.stdout, "no DNS records")
				return nil
			}
			w := newTable(a.stdout)
			row(w, "NAME", "TYPE", "TTL", "VALUES", "HOLDERS", "STATE", "UPDATED")
			for _, r := range recs {
				holders := make([]string, 0, len(r.Holdings))
				for _, h := range r.Holdings {
					holders = append(holders, h.Holder)
				}
				row(w, r.FQDN, r.Type, r.TTL, orDash(strings.Join(r.Values, ",")), orDash(strings.Join(holders, ",")), r.State, a.since(r.UpdatedAt))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			first := true
			for _, r := range recs {
				if r.State != "failed" || r.LastError == "" {
					continue
				}
				if first {
					fmt.Fprintln(a.stdout)
					first = false
				}
				fmt.Fprintf(a.stdout, "%s %s failed: %s (%s)\n", r.FQDN, r.Type, r.LastError, orDash(r.LastCode))
			}
			return nil
		},
	}
}
