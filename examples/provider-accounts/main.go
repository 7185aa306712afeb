// Command provider-accounts is the second example provider plugin: a thin
// main around package accounts. Build it, list it in plugins.json, and check
// it with
//
//	go build -o provider-accounts ./examples/provider-accounts
//	berth conformance plugin ./provider-accounts --arg=--state-dir --arg={state}
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/examples/provider-accounts/accounts"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory of the plugin's state (required)")
	flag.Parse()
	p, err := accounts.New(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "provider-accounts: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(p)
}
