package main

import (
	"fmt"
	"io"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/client"
)

// certificateCell is a route's CERTIFICATE column: "-" for a route without
// a certificate of its own, else its state and, once one is held, its
// expiry ("issued until 2027-03-01").
func certificateCell(cs map[string]client.CertificateStatus, host, mode string) string {
	if mode != "acme" && mode != "manual" {
		return "-"
	}
	st, ok := cs[host]
	if !ok {
		return "pending"
	}
	return certificateState(st)
}

func certificateState(st client.CertificateStatus) string {
	if st.NotAfter.IsZero() {
		return st.State
	}
	return st.State + " until " + st.NotAfter.UTC().Format("2006-01-02")
}

// printCertificateErrors lists the last error of each failed certificate
// under the routes table.
func printCertificateErrors(w io.Writer, rs []routes.Route, cs map[string]client.CertificateStatus) {
	first := true
	for _, r := range rs {
		st, ok := cs[r.Hostname]
		if !ok || st.State != "failed" || st.LastError == "" {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "certificate of %s failed: %s\n", r.Hostname, st.LastError)
	}
}
