// Command broken is the deliberately broken twin of berth-plugin-nftables:
// it passes every Attach and Detach to the real plugin with the fencing
// token replaced by 1, so it accepts stale writers. The node-network
// conformance suite must fail it in exactly the cases stale_fencing_token
// and durable_allocations (nodeplugins/nftables/conformance_test.go checks
// that), which proves the suite catches a plugin that ignores fencing.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	abinetwork "github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/nodeplugins/nftables"
	"github.com/berthhq/berth/sdk/network"
)

// broken is the nftables plugin without fencing.
type broken struct{ *nftables.Plugin }

func (b broken) Attach(ctx context.Context, req *abinetwork.AttachRequest) (*abinetwork.Attachment, error) {
	r := *req
	r.FencingToken = 1
	return b.Plugin.Attach(ctx, &r)
}

func (b broken) Detach(ctx context.Context, req *abinetwork.DetachRequest) error {
	r := *req
	r.FencingToken = 1
	return b.Plugin.Detach(ctx, &r)
}

func main() {
	stateDir := flag.String("state-dir", "", "directory of the allocations and guard records (required)")
	bridge := flag.String("bridge", nftables.DefaultBridge, "bridge of the workload network")
	tables := flag.String("table-prefix", nftables.DefaultTablePrefix, "name prefix of the nftables tables")
	flag.Parse()
	p, err := nftables.NewPlugin(nftables.PluginConfig{StateDir: *stateDir, Bridge: *bridge, TablePrefix: *tables,
		Logger: network.NewLogger(os.Stderr)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "broken: %v\n", err)
		os.Exit(1)
	}
	network.Serve(broken{p})
}
