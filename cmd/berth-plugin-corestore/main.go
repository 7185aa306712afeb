// Command berth-plugin-corestore is the Corestore provider plugin: databases
// and buckets for service bindings on the servers its configuration names
// (docs/bindings.md). It is launched by berthd, not by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/corestore"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory keeping binding records, fencing and idempotency records and the credential key (empty: memory only)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-corestore")
		return
	}
	p, err := corestore.Open(*stateDir)
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-corestore: %v\n", err)
		os.Exit(1)
	}
	defer p.Close()
	provider.Serve(p)
}
