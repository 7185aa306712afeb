// Command provider-lying is the deliberately faulty twin of provider-hello:
// the same library with the option hello.WithTrimOnApply, so the first Apply
// of a greeting whose message has surrounding white space stores (and returns)
// a trimmed message other than the one its Plan promised. `berth conformance
// plugin` must fail it in exactly the case plan_equals_apply, and the host must
// mark it degraded (provider_test.go and host/plugin check both); everything
// else about it is correct.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory of the plugin's state (required)")
	flag.Parse()
	p, err := hello.New(*stateDir, hello.WithTrimOnApply())
	if err != nil {
		fmt.Fprintf(os.Stderr, "provider-lying: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(p)
}
