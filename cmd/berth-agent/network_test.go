package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/upgrade"
)

// TestNetworkPluginThatDoesNotLaunchIsPutBack: a network plugin swapped in by
// an upgrade that does not launch is put back before anything else starts,
// and the agent is asked to restart on the previous one; once the record is
// settled, a plugin that does not launch is an ordinary launch error
// (docs/upgrades.md section 3.5).
func TestNetworkPluginThatDoesNotLaunchIsPutBack(t *testing.T) {
	dir := t.TempDir()
	plugins, data := filepath.Join(dir, "plugins"), filepath.Join(dir, "data")
	for _, d := range []string{plugins, data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Neither binary speaks the plugin handshake: both fail to launch.
	bin := func(v string) []byte {
		return []byte(fmt.Sprintf("#!/bin/sh\necho 'berth-plugin-nftables %s go1.26.8 %s/%s'\n", v, goruntime.GOOS, goruntime.GOARCH))
	}
	path := filepath.Join(plugins, "berth-plugin-nftables")
	old, newBin := bin("0.4.0"), bin("0.4.1")
	if err := os.WriteFile(path, old, 0o755); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(newBin)
	m, err := upgrade.New(upgrade.Config{Path: path, DataDir: data, Program: "berth-plugin-nftables", Version: "0.4.0",
		Fetch: func(context.Context, string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(newBin)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	res := m.Upgrade(context.Background(), node.AgentUpgrade{Program: "berth-plugin-nftables", Version: "0.4.1", Releases: []node.ReleaseFile{
		{Name: "berth-plugin-nftables", Version: "0.4.1", OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: hex.EncodeToString(h[:]), Size: int64(len(newBin))}}})
	if res.Status != "ok" {
		t.Fatalf("network plugin upgrade: %+v %+v", res, res.Error)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := networkFlags{subnet: "10.88.0.0/16", bridge: "berth-t0"}
	_, err = n.open(ctx, log, data, plugins, "/opt/berth/berth-agent")
	var re restartError
	if !errors.As(err, &re) || re.path != "/opt/berth/berth-agent" {
		t.Fatalf("open with a new plugin that does not launch: %v, want a restart", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, old) {
		t.Fatalf("network plugin after the failed launch: %q, want the previous one", got)
	}
	_, err = n.open(ctx, log, data, plugins, "/opt/berth/berth-agent")
	if err == nil || errors.As(err, &re) {
		t.Fatalf("open of the previous plugin that does not launch either: %v, want a launch error", err)
	}
}
