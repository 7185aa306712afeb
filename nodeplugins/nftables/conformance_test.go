package nftables_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	abinetwork "github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/nodeplugins/nftables"
)

// conformanceConfig is the suite's configuration for a binary (or, with
// bin empty, the plugin in process) on a bridge, tables and pool of its own,
// so it runs beside the other tests of this package.
func conformanceConfig(t *testing.T, bin string) conformance.NetworkConfig {
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := "bc" + hex.EncodeToString(b[:])
	subnet := fmt.Sprintf("10.217.%d.0/24", b[0])
	cfg := conformance.NetworkConfig{
		Subnet: subnet,
		Teardown: func(stateDir string) error {
			n, err := nftables.New(nftables.Config{Subnet: netip.MustParsePrefix(subnet), Bridge: name, TablePrefix: name, StateDir: stateDir})
			if err != nil {
				return err
			}
			return n.Teardown(context.Background())
		},
	}
	if bin == "" {
		cfg.Factory = func(stateDir string) (abinetwork.Network, error) {
			return nftables.NewPlugin(nftables.PluginConfig{StateDir: stateDir, Bridge: name, TablePrefix: name})
		}
		return cfg
	}
	cfg.Binary = bin
	cfg.Args = func(stateDir string) []string {
		return []string{"--state-dir", stateDir, "--bridge", name, "--table-prefix", name}
	}
	return cfg
}

// TestNetworkConformance runs the node-network conformance suite on the
// nftables plugin, in process and as the built binary (docs/plugins.md
// sections 6 and 7).
func TestNetworkConformance(t *testing.T) {
	requireRoot(t)
	t.Run("in-process", func(t *testing.T) {
		conformance.RunNetwork(t, conformanceConfig(t, ""))
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv(ctrtest.EnvBinDir), "berth-plugin-nftables")
		if os.Getenv(ctrtest.EnvBinDir) == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-nftables")
		}
		conformance.RunNetwork(t, conformanceConfig(t, bin))
	})
}

// TestNetworkBrokenTwinFails proves the suite catches a network plugin that
// ignores fencing (nodeplugins/nftables/broken), and nothing else.
func TestNetworkBrokenTwinFails(t *testing.T) {
	requireRoot(t)
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/nodeplugins/nftables/broken")
	r, err := conformance.CheckNetwork(t.Context(), conformanceConfig(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"durable_allocations", "stale_fencing_token"}
	if got := r.Failed(); !slices.Equal(got, want) {
		var b []byte
		for _, c := range r.Results {
			b = append(b, fmt.Sprintf("%s %s %q\n", c.Status, c.Name, c.Messages)...)
		}
		t.Fatalf("failed cases = %v, want exactly %v\n%s", got, want, b)
	}
	if got := r.Skipped(); len(got) != 0 {
		t.Errorf("skipped cases = %v, want none", got)
	}
}
