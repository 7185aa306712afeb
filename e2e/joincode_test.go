package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// runSetup runs a join command (curl ... | sh) the way a fresh host would, with the script's
// directories moved under dir and without systemd, and returns its exit code and stderr.
func runSetup(t *testing.T, command, dir string) (int, string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", command)
	cmd.Env = append(os.Environ(), "BERTH_INSTALL_DIR="+filepath.Join(dir, "bin"), "BERTH_DATA_DIR="+filepath.Join(dir, "data"),
		"BERTH_UNIT_DIR="+filepath.Join(dir, "units"), "BERTH_NO_START=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run %q: %v", command, err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// A join code's one-line command sets up a fresh directory as a host: the setup script
// downloads the agent from berthd, checks it, enrolls with the code (the node gets the
// code's id and labels) and writes the unit; the installed agent then connects. Run again, the
// command fails with the one message for a used code, and no second node is recorded.
func TestJoinCodeSetsUpAHost(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	var code client.JoinCode
	if err := json.Unmarshal([]byte(cl.cli(t, "join-code", "create", "--labels", "role=web", "-o", "json")), &code); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(code.JoinCommand, "curl ") || !strings.Contains(code.JoinCommand, "--pinnedpubkey") {
		t.Fatalf("join command %q: want a pinned curl | sh", code.JoinCommand)
	}
	host := filepath.Join(cl.dir, "host1")
	if rc, stderr := runSetup(t, code.JoinCommand, host); rc != 0 {
		t.Fatalf("setup exited %d:\n%s", rc, stderr)
	}
	if _, err := os.Stat(filepath.Join(host, "units", "berth-agent.service")); err != nil {
		t.Fatalf("the setup wrote no unit: %v", err)
	}
	// The agent the script installed, with the process driver it installed beside it.
	proctest.Start(t, filepath.Join(cl.dir, "agent.log"), filepath.Join(host, "bin", "berth-agent"), "run", "--data-dir", filepath.Join(host, "data"))
	waitFor(t, converge, "the node of the join code connected", func() (bool, string) {
		n, err := cl.c.GetNode(context.Background(), code.NodeID)
		if err != nil {
			return false, err.Error()
		}
		return n.Status == "connected" && n.Labels["role"] == "web", fmt.Sprintf("%+v", n)
	})

	rc, stderr := runSetup(t, code.JoinCommand, filepath.Join(cl.dir, "host2"))
	if rc == 0 || !strings.Contains(stderr, "join code is invalid, expired, or already used") {
		t.Fatalf("a used code: exit %d, stderr %q; want non-zero with the one message", rc, stderr)
	}
	if ns, err := cl.c.ListNodes(context.Background()); err != nil || len(ns) != 1 {
		t.Fatalf("nodes after a used code ran again: %v %v, want 1", ns, err)
	}
}
