package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// runBerthd runs `berthd args...` to completion and returns its exit status and output.
func runBerthd(t *testing.T, cl *cluster, name string, args ...string) (int, string) {
	t.Helper()
	logPath := filepath.Join(cl.dir, name+".log")
	p := start(t, logPath, "berthd", args...)
	<-p.Done()
	out, _ := os.ReadFile(logPath)
	return p.Cmd().ProcessState.ExitCode(), string(out)
}

// starts counts the start transitions of each node's fake driver.
func starts(t *testing.T, ns ...*fakeNode) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range ns {
		for _, tr := range readDriverLog(t, n.driverLog()) {
			if tr.what == "start" || tr.what == "stop" {
				out[n.name+" "+tr.what]++
			}
		}
	}
	return out
}

// drillState is what must be the same before the backup and after the restore.
type drillState struct {
	nodes     string // id status per node
	workloads string // id node service per workload
}

func (cl *cluster) drillState(t *testing.T) drillState {
	t.Helper()
	ctx := context.Background()
	ns, err := cl.c.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range ns {
		nodes = append(nodes, n.ID+" "+n.Status)
	}
	ws, err := cl.c.ListWorkloads(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	var wls []string
	for _, w := range ws {
		wls = append(wls, fmt.Sprintf("%s %s %s restarts=%d", w.ID, w.NodeID, w.Service, w.RestartCount))
	}
	sort.Strings(nodes)
	sort.Strings(wls)
	return drillState{nodes: strings.Join(nodes, "; "), workloads: strings.Join(wls, "; ")}
}

// allRunning reports whether the cluster's services have want workloads, all observed running,
// and every node is connected with its desired state applied.
func (cl *cluster) allRunning(want int) func() (bool, string) {
	return func() (bool, string) {
		ctx := context.Background()
		ns, err := cl.c.ListNodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range ns {
			if n.Status != "connected" || n.AppliedRev != n.DesiredRev {
				return false, fmt.Sprintf("node %+v", n)
			}
		}
		ws, err := cl.c.ListWorkloads(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		if len(ws) != want {
			return false, fmt.Sprintf("%d workloads: %+v", len(ws), ws)
		}
		for _, w := range ws {
			if w.ObservedStatus != "running" {
				return false, fmt.Sprintf("%+v", w)
			}
		}
		return true, ""
	}
}

// TestBackupRestoreDrill backs up a running core with services and nodes, destroys its data
// directory, restores it, and checks that the agents reconnect with their existing credentials
// (no enrollment) and that their workloads are adopted, not restarted (docs/operating.md
// section 5.4).
func TestBackupRestoreDrill(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	dataDir := filepath.Join(cl.dir, "berthd")
	cl.pushBundle(t, env.helloDir, "hello")
	a, b := startFakeNode(t, cl, "a"), startFakeNode(t, cl, "b")
	waitNodes(t, cl, a, b)
	two, one := 2, 1
	for name, n := range map[string]*int{"web": &two, "worker": &one} {
		if _, err := cl.c.ApplyService(ctx, "default", name, client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"}, Replicas: n}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*converge, "3 workloads running on connected nodes", cl.allRunning(3))
	before := cl.drillState(t)
	startsBefore := starts(t, a, b)
	clusterID, _ := os.ReadFile(filepath.Join(dataDir, "cluster-id"))
	signingKey, _ := os.ReadFile(filepath.Join(dataDir, "keys", "signing.key"))
	fingerprint, token := cl.fingerprint, cl.token

	// Back up the running core (it keeps serving meanwhile).
	archive := filepath.Join(cl.dir, "berthd.backup")
	if code, out := runBerthd(t, cl, "backup", "backup", "--data-dir", dataDir, "--to", archive); code != 0 {
		t.Fatalf("berthd backup exited %d:\n%s", code, out)
	}
	if _, err := cl.c.ListNodes(ctx); err != nil {
		t.Fatalf("the core stopped answering during the backup: %v", err)
	}

	// Lose the core and its data directory.
	cl.berthd.Kill9()
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}

	// A damaged copy of the archive is refused and writes nothing.
	whole, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	damaged := filepath.Join(cl.dir, "damaged.backup")
	if err := os.WriteFile(damaged, whole[:len(whole)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runBerthd(t, cl, "restore-damaged", "restore", damaged, "--data-dir", dataDir); code == 0 || !strings.Contains(out, "backup_invalid") {
		t.Fatalf("restore of a truncated archive exited %d:\n%s", code, out)
	}
	if _, err := os.Lstat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("the refused restore created %s", dataDir)
	}

	if code, out := runBerthd(t, cl, "restore", "restore", archive, "--data-dir", dataDir); code != 0 {
		t.Fatalf("berthd restore exited %d:\n%s", code, out)
	}
	// Restoring again over the restored directory is refused.
	if code, out := runBerthd(t, cl, "restore-again", "restore", archive, "--data-dir", dataDir); code == 0 || !strings.Contains(out, "restore_not_empty") {
		t.Fatalf("restore into a non-empty directory exited %d:\n%s", code, out)
	}

	startBerthd(t, cl)
	if cl.fingerprint != fingerprint || cl.token != token {
		t.Fatal("the restored core has another TLS fingerprint or admin token")
	}
	if id, _ := os.ReadFile(filepath.Join(dataDir, "cluster-id")); string(id) != string(clusterID) {
		t.Fatalf("cluster id %q after restore, was %q", id, clusterID)
	}
	if k, _ := os.ReadFile(filepath.Join(dataDir, "keys", "signing.key")); string(k) != string(signingKey) {
		t.Fatal("the restored core has another signing key")
	}
	waitFor(t, 2*converge, "agents reconnected to the restored core, workloads running", cl.allRunning(3))
	if after := cl.drillState(t); after != before {
		t.Fatalf("cluster state changed across backup and restore:\nbefore %+v\nafter  %+v", before, after)
	}
	if after := starts(t, a, b); fmt.Sprint(after) != fmt.Sprint(startsBefore) {
		t.Fatalf("drivers started or stopped workloads across the restore: before %v, after %v", startsBefore, after)
	}
}

// gatewayAlive reports whether pid is a live (not zombie) gateway process.
func gatewayAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && bytes.Contains(cmdline, []byte("berth-plugin-gateway"))
}

// TestRestoreBesideTakesOverGateway restores a backup into a new data directory beside the one
// it was taken from, on the same host and gateway address, while the old gateway (which outlives
// its berthd on purpose) still holds that address. While the old berthd runs, the restored one
// refuses to start, naming the old data directory and its gateway's pid; once the old berthd is
// stopped, the restored one stops the old gateway, starts its own and serves the restored routes
// (docs/operating.md section 5.2).
func TestRestoreBesideTakesOverGateway(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.enrollAgent(t)
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)
	cl.waitAnswering(t, "hello.localhost", ids)
	oldDir := cl.dataDir()
	oldGateway := cl.gatewayPID(t)
	if oldGateway <= 0 {
		t.Fatal("berthd wrote no reattach record for the gateway")
	}
	// The cluster's cleanup kills the gateway of the data directory in use at the end; this one
	// must not outlive the test either, whatever happens to it.
	t.Cleanup(func() {
		if gatewayAlive(oldGateway) {
			_ = syscall.Kill(oldGateway, syscall.SIGKILL)
		}
	})

	archive := filepath.Join(cl.dir, "berthd.backup")
	if code, out := runBerthd(t, cl, "backup", "backup", "--data-dir", oldDir, "--to", archive); code != 0 {
		t.Fatalf("berthd backup exited %d:\n%s", code, out)
	}
	newDir := filepath.Join(cl.dir, "berthd-restored")
	if code, out := runBerthd(t, cl, "restore", "restore", archive, "--data-dir", newDir); code != 0 {
		t.Fatalf("berthd restore exited %d:\n%s", code, out)
	}

	// The berthd it was restored from still runs: two cores of one cluster must not, so the
	// restored one refuses, says why and how, and leaves the running gateway alone.
	code, out := runBerthd(t, cl, "restored-refused", "--data-dir", newDir, "--listen", proctest.FreeAddr(t), "--gateway-listen", cl.gateway)
	if code == 0 || !strings.Contains(out, "still runs on data directory "+oldDir) || !strings.Contains(out, "pid "+strconv.Itoa(oldGateway)) {
		t.Fatalf("restored berthd beside the running one exited %d, want a refusal naming %s and gateway pid %d:\n%s", code, oldDir, oldGateway, out)
	}
	if !gatewayAlive(oldGateway) {
		t.Fatal("the refused berthd stopped the running core's gateway")
	}
	cl.waitAnswering(t, "hello.localhost", ids)

	// Stopped the way the unit stops it: berthd alone, its gateway keeps serving.
	cl.berthd.Stop()
	cl.waitAnswering(t, "hello.localhost", ids)
	cl.data = newDir
	startBerthd(t, cl)
	if gatewayAlive(oldGateway) {
		t.Fatalf("the old gateway (pid %d) still runs beside the restored core", oldGateway)
	}
	if pid := cl.gatewayPID(t); pid <= 0 || pid == oldGateway || !gatewayAlive(pid) {
		t.Fatalf("the restored core's gateway record names pid %d (the old gateway was %d)", pid, oldGateway)
	}
	waitFor(t, converge, "the agent reconnected to the restored core", cl.allRunning(1))
	cl.waitAnswering(t, "hello.localhost", ids)
	if _, err := os.Stat(oldDir); err != nil {
		t.Fatalf("the old data directory: %v", err)
	}
}
