package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/host/plugin"
)

// networkFlags configure the node network of container workloads
// (docs/plugins.md section 7).
type networkFlags struct {
	subnet, gateway, bridge string
}

func (n *networkFlags) register(f *pflag.FlagSet) {
	f.StringVar(&n.subnet, "workload-subnet", "", "IPv4 subnet of container workloads, e.g. 10.88.0.0/16: each gets a network namespace, an address and project isolation (the berth-plugin-nftables network plugin); empty runs containers in the node's network namespace")
	f.StringVar(&n.gateway, "workload-gateway", "", "the bridge's address in --workload-subnet (default: its first address)")
	f.StringVar(&n.bridge, "workload-bridge", "berth0", "bridge of the workload network")
}

// open launches the network plugin, whose Setup restores the guard and the
// node network before any workload starts, and returns it for the reconcile
// loop with its Close; nil without --workload-subnet.
func (n *networkFlags) open(ctx context.Context, log *slog.Logger, dataDir, pluginDir string) (reconcile.Network, func(), error) {
	if n.subnet == "" {
		return nil, func() {}, nil
	}
	if _, err := netip.ParsePrefix(n.subnet); err != nil {
		return nil, nil, configError{fmt.Errorf("--workload-subnet: %w", err)}
	}
	if n.gateway != "" {
		if _, err := netip.ParseAddr(n.gateway); err != nil {
			return nil, nil, configError{fmt.Errorf("--workload-gateway: %w", err)}
		}
	}
	entry, err := plugin.ResolveNetwork(pluginDir, "nftables")
	if err != nil {
		return nil, nil, configError{fmt.Errorf("network plugin: %w", err)}
	}
	nw, err := plugin.LaunchNetwork(ctx, entry.Apply(plugin.Config{
		Args:   []string{"--state-dir", filepath.Join(dataDir, "network"), "--bridge", n.bridge},
		PidDir: filepath.Join(dataDir, "plugins"),
		Logger: log,
	}), network.SetupRequest{Subnet: n.subnet, Gateway: n.gateway})
	if err != nil {
		return nil, nil, fmt.Errorf("launch the network plugin: %w", err)
	}
	return loopNetwork{nw}, func() { _ = nw.Close() }, nil
}

// loopNetwork adapts the network plugin to the reconcile loop: one
// published TCP port per workload, the same on the node and in the workload.
type loopNetwork struct{ n network.Network }

// Attach implements reconcile.Network; m is derived from the workload's
// start attempt by the loop.
func (l loopNetwork) Attach(ctx context.Context, id, group string, port int, m pluginapi.Mutation) (string, error) {
	a, err := l.n.Attach(ctx, &network.AttachRequest{WorkloadID: id, Group: group,
		Ports:    []network.Port{{HostPort: uint16(port), ContainerPort: uint16(port)}},
		Mutation: m})
	if err != nil {
		return "", err
	}
	return a.NetNSPath, nil
}

// Detach implements reconcile.Network.
func (l loopNetwork) Detach(ctx context.Context, id string, m pluginapi.Mutation) error {
	return l.n.Detach(ctx, &network.DetachRequest{WorkloadID: id, Mutation: m})
}
