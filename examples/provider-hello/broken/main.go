// Command broken is the deliberately broken twin of provider-hello: its
// Apply and Delete skip the guards, so it ignores fencing tokens and applies
// a replayed call again. The conformance suite must fail it in exactly the
// cases idempotent_apply, stale_fencing_token and durable_state
// (hello_test.go checks that), which proves the suite catches both faults.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/sdk/provider"
)

// broken is hello without its guards.
type broken struct{ *hello.Provider }

func (b broken) Apply(_ context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	st, err := b.Put(req.Planned)
	if err != nil {
		return nil, err
	}
	return &provider.ApplyResponse{State: st}, nil
}

func (b broken) Delete(_ context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	return &provider.DeleteResponse{}, b.Remove(req.Type, req.ID)
}

func main() {
	stateDir := flag.String("state-dir", "", "directory of the plugin's state (required)")
	flag.Parse()
	p, err := hello.New(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "broken: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(broken{p})
}
