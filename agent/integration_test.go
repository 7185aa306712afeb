package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/nodeplugins/process"
)

func statusOf(rep node.StatusReport, id string) (node.WorkloadStatus, bool) {
	for _, w := range rep.Workloads {
		if w.WorkloadID == id {
			return w, true
		}
	}
	return node.WorkloadStatus{}, false
}

// runAgent runs an Agent over a fresh process driver on dataDir until the
// returned stop func is called; stop closes the driver and leaves workloads running.
func runAgent(t *testing.T, dataDir string, logs *syncbuf.Buffer) (stop func()) {
	t.Helper()
	drv, err := process.New(process.Config{StateDir: filepath.Join(dataDir, "driver", "process")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{DataDir: dataDir, Driver: drv, Logger: testLogger(logs), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		_ = a.Close()
		_ = drv.Close()
	}
}

// TestRealWorkloadThroughProcessDriver runs the test binary as an HTTP
// workload through nodeplugins/process: start, health passing, adoption by a
// restarted agent without a restart, then removal.
func TestRealWorkloadThroughProcessDriver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fc := newFakeCore(t)
	dataDir := filepath.Join(t.TempDir(), "agent")
	var logs syncbuf.Buffer
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dataDir, Logger: testLogger(&logs)}); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wl := node.WorkloadSpec{WorkloadID: "wl_http", Project: "shop", Service: "web", Driver: "process",
		Command: []string{exe}, Env: map[string]string{workloadEnv: "http"}, DesiredStatus: node.DesiredRunning,
		RestartGeneration: 1, HealthCheck: node.HealthCheck{Path: "/", IntervalS: 1}}

	stop := runAgent(t, dataDir, &logs)
	var hello node.Hello
	if env := fc.awaitType(ctx, node.TypeHello); true {
		_ = jsonUnmarshal(env.Body, &hello)
	}
	if hello.NodeID != "nod_test1" || len(hello.Drivers) != 1 || hello.Drivers[0] != "process" || hello.Capacity.CPUs < 1 {
		t.Fatalf("hello = %+v", hello)
	}
	fc.desire(ctx, 1, wl)
	rep := fc.awaitStatus(ctx, "wl_http running and passing", func(r node.StatusReport) bool {
		w, ok := statusOf(r, "wl_http")
		return ok && w.ObservedStatus == node.StatusRunning && w.Health == node.HealthPassing && r.AppliedRev == 1
	})
	w, _ := statusOf(rep, "wl_http")
	pid := workloadPID(t, w.Address)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	// Agent restart: the workload keeps running and is adopted, not restarted.
	stop()
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("workload died with the agent")
	}
	stop = runAgent(t, dataDir, &logs)
	defer func() { stop() }()
	if env := fc.awaitType(ctx, node.TypeHello); true {
		_ = jsonUnmarshal(env.Body, &hello)
	}
	if hello.StoredRev != 1 || hello.AppliedRev != 1 {
		t.Fatalf("hello after restart = %+v", hello)
	}
	rep = fc.awaitStatus(ctx, "adopted wl_http passing", func(r node.StatusReport) bool {
		w, ok := statusOf(r, "wl_http")
		return ok && w.ObservedStatus == node.StatusRunning && w.Health == node.HealthPassing
	})
	w2, _ := statusOf(rep, "wl_http")
	if w2.Address != w.Address || w2.RestartCount != 0 {
		t.Fatalf("adopted status = %+v, was %+v", w2, w)
	}
	if got := workloadPID(t, w2.Address); got != pid {
		t.Fatalf("workload restarted on agent restart: pid %d, was %d", got, pid)
	}

	// Removal.
	fc.desire(ctx, 2)
	fc.awaitStatus(ctx, "wl_http deleted", func(r node.StatusReport) bool {
		w, ok := statusOf(r, "wl_http")
		return ok && w.ObservedStatus == node.StatusDeleted && r.AppliedRev == 2
	})
	if _, err := os.Stat(filepath.Join(dataDir, "workloads", "wl_http")); !os.IsNotExist(err) {
		t.Fatalf("workload directory kept: %v", err)
	}
}

// workloadPID asks the workload at addr for its id and pid.
func workloadPID(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var id string
	var pid int
	if _, err := fmt.Sscanf(string(body), "%s %d", &id, &pid); err != nil || id != "wl_http" {
		t.Fatalf("workload answered %q", body)
	}
	return pid
}
