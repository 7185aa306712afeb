package nftables_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	abinetwork "github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/nodeplugins/nftables"
)

// TestPluginOverTheWire runs berth-plugin-nftables as the agent does: the
// launch runs Setup, Attach is fenced and deduplicated, and a relaunch after
// a crash sets the network up again with every allocation kept.
func TestPluginOverTheWire(t *testing.T) {
	requireRoot(t)
	bin := filepath.Join(os.Getenv(ctrtest.EnvBinDir), "berth-plugin-nftables")
	if os.Getenv(ctrtest.EnvBinDir) == "" {
		bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-nftables")
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := "bp" + hex.EncodeToString(b[:])
	subnet := fmt.Sprintf("10.216.%d.0/24", b[0])
	state := t.TempDir()
	t.Cleanup(func() { // what the plugin made, removed through the library on the same state
		n, err := nftables.New(nftables.Config{Subnet: netip.MustParsePrefix(subnet), Bridge: name, TablePrefix: name, StateDir: state})
		if err == nil {
			err = n.Teardown(context.Background())
		}
		if err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	entry, err := plugin.ResolveNetwork(filepath.Dir(bin), "nftables")
	if err != nil {
		t.Fatal(err)
	}
	n, err := plugin.LaunchNetwork(t.Context(), entry.Apply(plugin.Config{
		Args: []string{"--state-dir", state, "--bridge", name, "--table-prefix", name}, PidDir: t.TempDir(),
	}), abinetwork.SetupRequest{Subnet: subnet})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if got := tablesNamed(t, name+"_guard"); len(got) != 1 {
		t.Fatalf("guard after the launch: %v", got)
	}

	req := &abinetwork.AttachRequest{WorkloadID: "wl_p1", Group: "prj_p", Ports: []abinetwork.Port{{HostPort: 19999, ContainerPort: 8080}},
		Mutation: pluginapi.Mutation{IdempotencyKey: "attach-1", FencingToken: 5}}
	a, err := n.Attach(t.Context(), req)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if _, err := os.Stat(a.NetNSPath); err != nil || a.Group != "prj_p" || a.Address == "" {
		t.Fatalf("attachment %+v (%v)", a, err)
	}
	again, err := n.Attach(t.Context(), req)
	if err != nil || again.Address != a.Address {
		t.Errorf("replayed Attach = %+v, %v; want the recorded one", again, err)
	}
	stale := *req
	stale.IdempotencyKey, stale.FencingToken = "attach-2", 4
	if _, err := n.Attach(t.Context(), &stale); !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Errorf("Attach with a stale token: %v; want stale_fencing_token", err)
	}

	// The plugin dies; the host relaunches it and runs Setup again.
	pid := n.Status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for n.Status().Launches < 2 || n.Status().PID == pid || n.Status().PID == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the plugin was not relaunched: %+v", n.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	list, err := n.List(t.Context())
	if err != nil || len(list) != 1 || list[0].Address != a.Address {
		t.Fatalf("List after the relaunch = %+v, %v", list, err)
	}
	if err := n.Detach(t.Context(), &abinetwork.DetachRequest{WorkloadID: "wl_p1", Mutation: pluginapi.Mutation{IdempotencyKey: "detach-1", FencingToken: 5}}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := os.Stat(a.NetNSPath); !os.IsNotExist(err) {
		t.Errorf("namespace left after Detach (%v)", err)
	}
}
