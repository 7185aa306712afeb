package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/agent/hostsetup"
)

// TestAgentStopsWhenTheCoreWasRecreated enrolls a node, then replaces
// berthd by a fresh one (new data directory, so a new certificate) on the
// same address, as a user who starts over does: the agent must stop with
// status 77 and say how to start over instead of redialling forever, and
// enroll on its data directory must refuse and say the same
// (docs/node-protocol.md sections 2.2 and 13).
func TestAgentStopsWhenTheCoreWasRecreated(t *testing.T) {
	cl := newCluster(t)
	agentDir, agentLog := cl.enrollNode(t)
	agent := start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(context.Background())
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", ns[0].Status
	})

	old := cl.fingerprint
	cl.berthd.Stop()
	cl.killGateway(t)
	if err := os.RemoveAll(filepath.Join(cl.dir, "berthd")); err != nil {
		t.Fatal(err)
	}
	startBerthd(t, cl)
	if cl.fingerprint == old {
		t.Fatal("the re-created core kept its certificate")
	}

	select {
	case <-agent.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the agent kept redialling a core whose certificate does not match its pin")
	}
	if code := agent.Cmd().ProcessState.ExitCode(); code != hostsetup.ExitPinMismatch {
		t.Fatalf("agent exited %d, want %d", code, hostsetup.ExitPinMismatch)
	}
	b, err := os.ReadFile(agentLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "new join command") {
		t.Fatalf("the agent's last words do not say how to start over:\n%s", logTail(string(b), 2000))
	}

	enroll := start(t, agentLog, "berth-agent", "enroll", "--server", cl.url, "--join-token", "brj_unused",
		"--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code == 0 {
		t.Fatal("enroll on an enrolled data directory succeeded")
	}
	if b, _ = os.ReadFile(agentLog); !strings.Contains(string(b), "fresh --data-dir") {
		t.Fatalf("enroll does not say how to start over:\n%s", logTail(string(b), 2000))
	}
}

// logTail is the last n bytes of s.
func logTail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
