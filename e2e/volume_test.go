package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// keeperBundle writes a release that notes each start and each stop in its data volume, and
// serves go-httpbin in between.
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
	// The shell stays as the workload's leader so that its stop is noted too, after go-httpbin
	// exited: a stop-before-start replacement writes the old attempt's "stopped" line before
	// the new attempt's start.
	script := "#!/bin/sh\necho \"$BERTH_WORKLOAD_ID $HOME $PATH\" >> \"$BERTH_VOLUME_DATA/starts\"\n" +
		"echo \"$BERTH_APP_DIR $(cd \"$BERTH_APP_DIR\" && pwd -P) $(pwd -P)\" >> \"$BERTH_VOLUME_DATA/appdirs\"\n" +
		"./go-httpbin & pid=$!\n" +
		"trap 'kill $pid 2>/dev/null; wait $pid; echo \"$BERTH_WORKLOAD_ID stopped\" >> \"$BERTH_VOLUME_DATA/starts\"; exit 0' TERM\n" +
		"wait $pid\n"
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestVolumeKeptAcrossRolloutAndAgentRestart runs a stateful service with a data volume: the
// agent creates it under its data directory and names it in BERTH_VOLUME_DATA and HOME; a file in
// it survives a rollout to a new attempt, replaced stop-before-start under the service's lease,
// and an agent killed and started again; the verdict reaches converged each time; a delete with
// --purge-volumes removes it (docs/node-protocol.md section 6.7, docs/reconciliation.md
// section 5.1).
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
	spec := client.ServiceSpec{Bundle: "keeper", Command: []string{"./run"}, Replicas: &one, PlacementMode: "stateful",
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
	// The agent runs as root here, so the workload ran as the berth-workload user it created:
	// the file the workload wrote is that user's.
	wu, err := user.Lookup("berth-workload")
	if err != nil {
		t.Fatalf("the agent created no berth-workload user: %v", err)
	}
	fi, err := os.Stat(filepath.Join(vol, "starts"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := strconv.FormatUint(uint64(fi.Sys().(*syscall.Stat_t).Uid), 10); uid != wu.Uid {
		t.Fatalf("starts written by uid %s, want berth-workload's %s", uid, wu.Uid)
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
	// The old attempt stopped before the new one started, both under the same lease.
	if s := starts(); len(s) != 3 || s[1] != first+" stopped" || !strings.HasPrefix(s[2], second+" "+vol+" ") {
		t.Fatalf("starts and stops after the rollout %q, want %s's start, its stop, then %s's start", s, first, second)
	}
	if out := cl.cli(t, "get", "services"); !strings.Contains(out, "converged") {
		t.Errorf("get services shows no converged verdict for the stateful service:\n%s", out)
	}
	// BERTH_APP_DIR is the same path in both attempts, and at each start it led to that
	// attempt's own app directory (its working directory), which changed with the rollout.
	b, err := os.ReadFile(filepath.Join(vol, "appdirs"))
	if err != nil {
		t.Fatalf("the workload wrote no app directory line: %v", err)
	}
	link := filepath.Join(agentDir, "apps", "default", "db")
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("app directory lines %q, want one per start", lines)
	}
	var wds []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != link || f[1] != f[2] {
			t.Fatalf("app directory line %q: want %s, then the directory it led to equal to the working directory", l, link)
		}
		wds = append(wds, f[2])
	}
	if wds[0] == wds[1] {
		t.Fatalf("both attempts ran in %s: the rollout was to change the app directory", wds[0])
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
	if s := starts(); len(s) != 3 {
		t.Fatalf("starts and stops after the agent restart %q, want the adopted attempt not started again", s)
	}
	if desc := cl.cli(t, "describe", "service", "db"); !strings.Contains(desc, "Volumes:") || !strings.Contains(desc, "data (on the lease holder's node") ||
		!strings.Contains(desc, "converged") {
		t.Errorf("describe names no volume on the lease holder, or no converged verdict:\n%s", desc)
	}

	// Deleted with --purge-volumes: the node removes the volume before it acknowledges the
	// removal, so the directory is gone by the time the service is.
	if out := cl.cli(t, "delete", "service", "db", "--purge-volumes"); !strings.Contains(out, "volumes (data) are removed") {
		t.Errorf("delete --purge-volumes says:\n%s", out)
	}
	waitFor(t, 2*converge, "db deleted", func() (bool, string) {
		_, err := cl.c.GetService(ctx, "default", "db")
		return client.IsCode(err, "service_not_found"), fmt.Sprint(err)
	})
	if _, err := os.Stat(filepath.Dir(vol)); !os.IsNotExist(err) {
		t.Fatalf("after delete --purge-volumes the volumes of db are still there: %v", err)
	}
}
