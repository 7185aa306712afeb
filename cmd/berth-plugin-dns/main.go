// Command berth-plugin-dns is the DNS provider plugin (docs/dns.md): it
// writes dns.record resources to an authoritative server with TSIG-signed
// RFC 2136 updates. It is launched by berthd, not by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/dns"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory keeping the fencing and idempotency records across restarts (empty: memory only)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-dns")
		return
	}
	p, err := dns.Open(*stateDir, provider.NewLogger(os.Stderr))
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-dns: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(p)
}
