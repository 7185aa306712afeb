package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/agent/upgrade"
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

// openedNetwork is the launched network plugin: Network for the reconcile
// loop, Path its binary when it may be upgraded in place ("" when a plugin
// catalog pins it), Close to stop it (the network stays in the kernel).
type openedNetwork struct {
	Network reconcile.Network
	Path    string
	Close   func()
}

// open launches the network plugin, whose Setup restores the guard and the
// node network before any workload starts; without --workload-subnet it
// returns no Network. A newly upgraded plugin that does not launch is put
// back (docs/upgrades.md section 3.5) and open returns a restartError.
func (n *networkFlags) open(ctx context.Context, log *slog.Logger, dataDir, pluginDir, exe string) (openedNetwork, error) {
	none := openedNetwork{Close: func() {}}
	if n.subnet == "" {
		return none, nil
	}
	if _, err := netip.ParsePrefix(n.subnet); err != nil {
		return none, configError{fmt.Errorf("--workload-subnet: %w", err)}
	}
	if n.gateway != "" {
		if _, err := netip.ParseAddr(n.gateway); err != nil {
			return none, configError{fmt.Errorf("--workload-gateway: %w", err)}
		}
	}
	entry, err := plugin.ResolveNetwork(pluginDir, "nftables")
	if err != nil {
		return none, configError{fmt.Errorf("network plugin: %w", err)}
	}
	// Like the driver plugin, one pinned by a plugin catalog is upgraded by
	// updating the catalog; one resolved by its file alone in place.
	path := ""
	if _, err := plugin.LoadCatalog(pluginDir); errors.Is(err, plugin.ErrNoCatalog) {
		if path, err = filepath.Abs(entry.Path); err != nil {
			return none, fmt.Errorf("network plugin path: %w", err)
		}
	}
	nw, err := plugin.LaunchNetwork(ctx, entry.Apply(plugin.Config{
		Args:   []string{"--state-dir", filepath.Join(dataDir, "network"), "--bridge", n.bridge},
		PidDir: filepath.Join(dataDir, "plugins"),
		Logger: log,
	}), network.SetupRequest{Subnet: n.subnet, Gateway: n.gateway})
	if err != nil {
		if path != "" {
			if back, rerr := upgrade.RollBackUnconfirmed(dataDir, "berth-plugin-nftables", path, log); rerr != nil {
				log.Error("roll back the network plugin", "error", rerr)
			} else if back {
				return none, restartError{path: exe}
			}
		}
		return none, fmt.Errorf("launch the network plugin: %w", err)
	}
	return openedNetwork{Network: loopNetwork{nw}, Path: path, Close: func() { _ = nw.Close() }}, nil
}

// loopNetwork adapts the network plugin to the reconcile loop: one
// published TCP port per workload, the same on the node and in the workload.
type loopNetwork struct{ n network.Network }

// Describe implements agent.NetworkDescriber.
func (l loopNetwork) Describe(ctx context.Context) (*network.DescribeResponse, error) {
	return l.n.Describe(ctx)
}

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
