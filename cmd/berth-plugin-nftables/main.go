// Command berth-plugin-nftables is the node-network plugin of the agent:
// bridge, namespaces, project isolation, published ports and the address-pool
// guard in nftables. Launched by the agent, not by hand, except
//
//	berth-plugin-nftables teardown --state-dir DIR --subnet CIDR [--bridge B]
//
// which removes every workload's network, the tables, the guard and the
// bridge, for a node leaving Berth (docs/plugins.md section 7).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/nodeplugins/nftables"
	"github.com/berthhq/berth/sdk/network"
)

func main() {
	teardown := len(os.Args) > 1 && os.Args[1] == "teardown"
	args := os.Args[1:]
	if teardown {
		args = args[1:]
	}
	fs := flag.NewFlagSet("berth-plugin-nftables", flag.ExitOnError)
	stateDir := fs.String("state-dir", "", "directory of the allocations and guard records (required)")
	bridge := fs.String("bridge", nftables.DefaultBridge, "bridge of the workload network")
	tables := fs.String("table-prefix", nftables.DefaultTablePrefix, "name prefix of the nftables tables")
	subnet := fs.String("subnet", "", "teardown: the workload subnet the network was set up with")
	showVersion := fs.Bool("version", false, "print the version and exit")
	_ = fs.Parse(args)
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-nftables")
		return
	}

	if teardown {
		if err := runTeardown(*stateDir, *bridge, *tables, *subnet); err != nil {
			fmt.Fprintf(os.Stderr, "berth-plugin-nftables teardown: %v\n", err)
			os.Exit(1)
		}
		return
	}
	p, err := nftables.NewPlugin(nftables.PluginConfig{StateDir: *stateDir, Bridge: *bridge, TablePrefix: *tables,
		Logger: network.NewLogger(os.Stderr)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-plugin-nftables: %v\n", err)
		os.Exit(1)
	}
	network.Serve(p)
}

func runTeardown(stateDir, bridge, tables, subnet string) error {
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil {
		return fmt.Errorf("--subnet: %w", err)
	}
	n, err := nftables.New(nftables.Config{Subnet: prefix, Bridge: bridge, TablePrefix: tables, StateDir: stateDir})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.Teardown(ctx)
}
