package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	nodeconf "github.com/berthhq/berth/conformance/node"
)

// TestNodeConformance runs the node-protocol conformance suite in both
// directions against the built binaries: the real berth-agent against a
// scripted core (through the CLI, as an agent author runs it), and a live
// berthd against scripted nodes (through the library, one subtest a case).
func TestNodeConformance(t *testing.T) {
	t.Parallel()
	t.Run("agent", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(env.bin, "berth"), "conformance", "node", "--agent", filepath.Join(env.bin, "berth-agent"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("berth conformance node --agent: %v\n%s", err, out)
		}
		t.Logf("%s", out)
	})
	t.Run("server", func(t *testing.T) {
		cl := newCluster(t)
		nodeconf.RunServer(t, nodeconf.ServerConfig{URL: cl.url, Token: cl.token, Fingerprint: cl.fingerprint})
	})
}
