// Command provider-hello is the example provider plugin: a thin main around
// package hello. Build it, list it in plugins.json, and check it with
//
//	go build -o provider-hello ./examples/provider-hello
//	berth conformance plugin ./provider-hello --arg=--state-dir --arg={state} --config examples/provider-hello/config.json
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
	p, err := hello.New(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "provider-hello: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(p)
}
