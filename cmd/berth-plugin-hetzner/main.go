// Command berth-plugin-hetzner is the Hetzner Cloud provider plugin
// (docs/plugins-hetzner.md): it creates, reads and deletes the servers of
// Berth machines. It is launched by berthd, not by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/hetzner"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory keeping the fencing, idempotency and machine records across restarts (empty: memory only)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: berth-plugin-hetzner [--state-dir DIR]\n\n"+
			"The Hetzner Cloud provider plugin. berthd launches it and passes the API token\n"+
			"in the plugin's configuration; see docs/plugins-hetzner.md.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-hetzner")
		return
	}
	p, err := hetzner.Open(*stateDir, provider.NewLogger(os.Stderr))
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-hetzner: %v\n", err)
		os.Exit(1)
	}
	defer p.Close()
	provider.Serve(p)
}
