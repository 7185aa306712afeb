package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"time"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/upgrade"
	"github.com/berthhq/berth/nodeplugins/fake"
)

// TestLogsQueryWithTimeWindowRefused: output kept without line times cannot
// be cut by since/until, so such a query is answered unimplemented instead of
// with lines outside the window (docs/node-protocol.md section 5.17).
func TestLogsQueryWithTimeWindowRefused(t *testing.T) {
	c := &commands{}
	for _, params := range []string{
		`{"workload_id":"wl_1","since":"2026-11-29T10:00:00Z"}`,
		`{"workload_id":"wl_1","until":"2026-11-29T10:00:00Z"}`,
	} {
		res := c.Command(context.Background(), node.Command{Kind: node.CommandLogsQuery, Params: json.RawMessage(params)})
		if res.Status != "error" || res.Error == nil || res.Error.Code != string(berrors.Unimplemented) {
			t.Errorf("logs_query %s answered %+v, want error unimplemented", params, res)
		}
	}
}

// TestNetworkPluginUpgradeCommand: agent_upgrade of the node's network plugin
// goes to the network plugin's upgrade manager, which swaps its binary,
// keeps .prev and asks for the restart; probe reports the network plugin; a
// catalog-pinned network plugin is refused unimplemented, and a network
// plugin the node does not run release_not_found (docs/upgrades.md
// section 3.5).
func TestNetworkPluginUpgradeCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth-plugin-nftables")
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	line := func(v string) []byte {
		return []byte(fmt.Sprintf("#!/bin/sh\necho 'berth-plugin-nftables %s go1.26.8 %s/%s'\n", v, goruntime.GOOS, goruntime.GOARCH))
	}
	old, newBin := line("0.4.0"), line("0.4.1")
	if err := os.WriteFile(path, old, 0o755); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(newBin)
	sum := hex.EncodeToString(h[:])
	m, err := upgrade.New(upgrade.Config{Path: path, DataDir: data, Program: "berth-plugin-nftables", Version: "0.4.0", RestartGrace: time.Millisecond,
		Fetch: func(_ context.Context, s string) (io.ReadCloser, error) {
			if s != sum {
				return nil, errors.New("no such release")
			}
			return io.NopCloser(bytes.NewReader(newBin)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	drv, err := fake.New(fake.Config{StateDir: filepath.Join(dir, "driver")})
	if err != nil {
		t.Fatal(err)
	}
	nft := &network.DescribeResponse{Name: "nftables", Version: "0.4.0", APIVersions: []int{network.APIVersion}}
	c := &commands{driver: drv, pluginName: "berth-plugin-fake", network: nft, netPlugin: m}

	res := c.Command(ctx, node.Command{Kind: node.CommandProbe})
	if res.Status != "ok" || res.Probe == nil || len(res.Probe.Networks) != 1 ||
		res.Probe.Networks[0].Name != "nftables" || res.Probe.Networks[0].Version != "0.4.0" {
		t.Fatalf("probe: %+v", res.Probe)
	}

	params := func(program string) json.RawMessage {
		b, _ := json.Marshal(node.AgentUpgrade{Program: program, Version: "0.4.1", Releases: []node.ReleaseFile{
			{Name: program, Version: "0.4.1", OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: sum, Size: int64(len(newBin))}}})
		return b
	}
	wantCode := func(c *commands, program string, code berrors.Code) {
		t.Helper()
		res := c.Command(ctx, node.Command{Kind: node.CommandAgentUpgrade, Params: params(program)})
		if res.Status != "error" || res.Error == nil || res.Error.Code != string(code) {
			t.Fatalf("agent_upgrade of %s answered %+v, want error %s", program, res, code)
		}
	}
	wantCode(&commands{driver: drv, pluginName: "berth-plugin-fake", network: nft}, "berth-plugin-nftables", berrors.Unimplemented)
	wantCode(&commands{driver: drv, pluginName: "berth-plugin-fake"}, "berth-plugin-nftables", berrors.ReleaseNotFound)
	wantCode(c, "berth-plugin-bridge", berrors.ReleaseNotFound)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, old) {
		t.Fatalf("a refused upgrade replaced the network plugin: %q", got)
	}

	res = c.Command(ctx, node.Command{Kind: node.CommandAgentUpgrade, Params: params("berth-plugin-nftables")})
	if res.Status != "ok" {
		t.Fatalf("network plugin upgrade: %+v %+v", res, res.Error)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, newBin) {
		t.Fatalf("network plugin after the swap: %q", got)
	}
	if got, _ := os.ReadFile(path + ".prev"); !bytes.Equal(got, old) {
		t.Fatalf("network plugin .prev: %q", got)
	}
	if _, err := os.Stat(filepath.Join(data, "upgrade-berth-plugin-nftables.json")); err != nil {
		t.Fatalf("network plugin upgrade record: %v", err)
	}
	select {
	case <-m.RestartRequested():
	case <-time.After(10 * time.Second):
		t.Fatal("no restart requested after the network plugin's swap")
	}
}
