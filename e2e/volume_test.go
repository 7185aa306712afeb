package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// keeperBundle writes a release that notes each start in its data volume, then serves
// go-httpbin.
func keeperBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(filepath.Join(env.httpbinDir, "go-httpbin"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, "go-httpbin"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"$BERTH_WORKLOAD_ID $HOME $PATH\" >> \"$BERTH_VOLUME_DATA/starts\"\nexec ./go-httpbin\n"
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestVolumeKeptAcrossRolloutAndAgentRestart runs a service with a data volume: the agent
// creates it under its data directory and names it in BERTH_VOLUME_DATA and HOME; a file in it
// survives a rollout to a new attempt and an agent killed and started again
// (docs/node-protocol.md section 6.7).
func TestVolumeKeptAcrossRolloutAndAgentRestart(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(cl.dir, "agent")
	logPath := filepath.Join(cl.dir, "agent.log")
	enroll := start(t, logPath, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	agent := start(t, logPath, "berth-agent", "run", "--data-dir", agentDir)

	cl.pushBundle(t, keeperBundle(t, filepath.Join(t.TempDir(), "keeper")), "keeper")
	one := 1
	spec := client.ServiceSpec{Bundle: "keeper", Command: []string{"./run"}, Replicas: &one,
		HealthCheck: client.HealthCheck{Path: "/status/200", IntervalS: 1}, Volumes: []client.Volume{{Name: "data"}}}
	if _, err := cl.c.ApplyService(ctx, "default", "db", spec); err != nil {
		t.Fatal(err)
	}
	converged := func(what string) string {
		t.Helper()
		var id string
		waitFor(t, 2*converge, what, func() (bool, string) {
			st, err := cl.c.Rollout(ctx, "default", "db")
			if err != nil {
				return false, err.Error()
			}
			wls := cl.workloadIDs(t, "db")
			if len(wls) == 1 {
				id = wls[0]
			}
			return st.Verdict.State == "converged" && st.Verdict.SpecRevision == st.SpecRevision && st.Updated == 1 && len(wls) == 1,
				fmt.Sprintf("%+v %v", st, wls)
		})
		return id
	}
	first := converged("db converged")
	vol := filepath.Join(agentDir, "volumes", "default", "db", "data")
	starts := func() []string {
		b, err := os.ReadFile(filepath.Join(vol, "starts"))
		if err != nil {
			t.Fatalf("the workload wrote no start into its volume: %v", err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if s := starts(); len(s) != 1 || !strings.HasPrefix(s[0], first+" "+vol+" /usr/local/sbin:") {
		t.Fatalf("starts %q, want one by %s with HOME %s and the default PATH", s, first, vol)
	}
	if err := os.WriteFile(filepath.Join(vol, "keep.txt"), []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A rollout replaces the workload; the volume stays.
	spec.Env = map[string]string{"MODE": "two"}
	if _, err := cl.c.ApplyService(ctx, "default", "db", spec); err != nil {
		t.Fatal(err)
	}
	var second string
	waitFor(t, 2*converge, "db rolled to a new attempt", func() (bool, string) {
		second = converged("db converged again")
		return second != first, second
	})
	if b, err := os.ReadFile(filepath.Join(vol, "keep.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("after the rollout keep.txt = %q, %v", b, err)
	}
	if s := starts(); len(s) != 2 || !strings.HasPrefix(s[1], second+" ") {
		t.Fatalf("starts after the rollout %q", s)
	}

	// The agent is killed and started again: the workload is adopted, the volume is still there.
	agent.Kill9()
	start(t, logPath, "berth-agent", "run", "--data-dir", agentDir)
	if got := converged("db converged after the agent restart"); got != second {
		t.Fatalf("after the agent restart the slot runs %s, want %s adopted", got, second)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "keep.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("after the agent restart keep.txt = %q, %v", b, err)
	}
	if desc := cl.cli(t, "describe", "service", "db"); !strings.Contains(desc, "Volumes:") || !strings.Contains(desc, "data (on the node") {
		t.Errorf("describe names no volume:\n%s", desc)
	}
}
