package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/nodeplugins/fake"
	"github.com/berthhq/berth/sdk/client"
)

// TestAgentKilledMidStartReplays: the agent is killed with SIGKILL after
// its runtime driver started a workload and before the agent recorded the
// result (the fake driver holds its answer). The restarted agent retries
// that start as the same attempt, with the same idempotency key, and the
// relaunched driver replays its first answer: the workload was started
// exactly once, runs, and is reported running (docs/plugins.md section 3.4).
func TestAgentKilledMidStartReplays(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	cl.pushBundle(t, env.helloDir, "hello")
	n := startFakeNode(t, cl, "a")
	waitNodes(t, cl, n)

	hold := filepath.Join(n.dir, "driver", "fake", fake.HoldAfterStartFile)
	if err := os.WriteFile(hold, []byte("*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	one := 1
	if _, err := cl.c.ApplyService(ctx, "default", "once", client.ServiceSpec{
		Bundle: "hello", Command: []string{"./hello"}, Replicas: &one,
	}); err != nil {
		t.Fatal(err)
	}
	var wl string
	waitFor(t, converge, "the driver holding its answer to a start", func() (bool, string) {
		for _, tr := range readDriverLog(t, n.driverLog()) {
			if tr.what == "held" {
				wl = tr.wl
				return true, ""
			}
		}
		return false, "no held start yet"
	})

	// The agent dies between the driver's start and its own record of it.
	n.proc.Kill9()
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	logPath := n.proc.LogPath()
	cmd := exec.Command(filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", n.dir, "--driver", "fake", "--plugin-dir", env.bin)
	cmd.Env = append(os.Environ(), allowTestDrivers)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.proc = proctest.StartCmd(t, logPath, cmd)

	waitFor(t, converge, "the workload reported running after the agent's restart", func() (bool, string) {
		ws, err := cl.c.ListWorkloads(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		for _, w := range ws {
			if w.ID == wl {
				return w.ObservedStatus == "running", fmt.Sprintf("%+v", w)
			}
		}
		return false, fmt.Sprintf("no workload %s in %+v", wl, ws)
	})
	agentLog, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	retried := false
	for _, line := range strings.Split(string(agentLog), "\n") {
		retried = retried || (strings.Contains(line, wl) && strings.Contains(line, "retry interrupted start"))
	}
	if !retried {
		t.Errorf("the restarted agent did not retry the interrupted start of %s", wl)
	}
	var starts []string
	for _, line := range strings.Split(readFile(t, n.driverLog()), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "start" && f[2] == wl {
			starts = append(starts, f[3])
		}
	}
	if len(starts) != 1 || !strings.HasPrefix(starts[0], "key=start/"+wl+"/") || !strings.HasSuffix(starts[0], ".1") {
		t.Fatalf("driver starts of %s = %v; want exactly one, of attempt 1 (the retry replays)", wl, starts)
	}
}
