package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/nodeplugins/fake"
)

// renamed is a runtime driver under another Describe name, as a third
// party's driver would be.
type renamed struct {
	runtime.Driver
	name string
}

func (r renamed) Describe(ctx context.Context) (*runtime.DescribeResponse, error) {
	d, err := r.Driver.Describe(ctx)
	if err != nil {
		return nil, err
	}
	c := *d
	c.Name = r.name
	return &c, nil
}

// runDriverAgent runs an Agent over a fresh fake driver on stateDir (logging
// its starts and stops to logPath), under Describe name name, until the
// returned stop func is called; stop closes the driver, whose workloads stay
// running (outlives_driver).
func runDriverAgent(t *testing.T, dataDir, stateDir, logPath, name string, logs *syncbuf.Buffer) (stop func()) {
	t.Helper()
	fd, err := fake.New(fake.Config{StateDir: stateDir, LogPath: logPath})
	if err != nil {
		t.Fatal(err)
	}
	var drv runtime.Driver = fd
	if name != "fake" {
		drv = renamed{Driver: fd, name: name}
	}
	a, err := New(Config{DataDir: dataDir, Driver: drv, Logger: testLogger(logs), PollInterval: 50 * time.Millisecond,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
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
		_ = fd.Close()
	}
}

// startLines counts the fake driver's start lines of id in its log.
func startLines(t *testing.T, logPath, id string) int {
	t.Helper()
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(raw, []byte(" start "+id+" "))
}

// TestThirdPartyDriverRecoveredAcrossRestart: a driver whose Describe name
// is not the "process" the core names in every bundle workload's spec
// keeps its workloads across agent restarts. Each restart launches the
// driver afresh on an empty state directory, so only the handles the agent
// stored bring the workloads back: every workload is recovered, none is
// started a second time.
func TestThirdPartyDriverRecoveredAcrossRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fc := newFakeCore(t)
	root := t.TempDir()
	dataDir := filepath.Join(root, "agent")
	logPath := filepath.Join(root, "driver.log")
	var logs syncbuf.Buffer
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dataDir, Logger: testLogger(&logs)}); err != nil {
		t.Fatal(err)
	}
	ids := []string{"wl_tp1", "wl_tp2"}
	var specs []node.WorkloadSpec
	for _, id := range ids {
		// Driver "process": what the core named in every bundle workload's spec.
		specs = append(specs, node.WorkloadSpec{WorkloadID: id, Project: "shop", Service: "web", Driver: "process",
			Command: []string{"serve"}, DesiredStatus: node.DesiredRunning, RestartGeneration: 1})
	}
	allRunning := func(r node.StatusReport) bool {
		for _, id := range ids {
			if w, ok := statusOf(r, id); !ok || w.ObservedStatus != node.StatusRunning {
				return false
			}
		}
		return true
	}

	stop := runDriverAgent(t, dataDir, filepath.Join(root, "state0"), logPath, "acme", &logs)
	fc.awaitType(ctx, node.TypeHello)
	fc.desire(ctx, 1, specs...)
	fc.awaitStatus(ctx, "both workloads running", allRunning)
	stop()
	for restart := 1; restart <= 2; restart++ {
		stop = runDriverAgent(t, dataDir, filepath.Join(root, "state"+string(rune('0'+restart))), logPath, "acme", &logs)
		fc.awaitType(ctx, node.TypeHello)
		rep := fc.awaitStatus(ctx, "both workloads running after the restart", allRunning)
		stop()
		for _, id := range ids {
			if n := startLines(t, logPath, id); n != 1 {
				t.Fatalf("after restart %d, %s was started %d times; want once (recovered from its handle)\nagent log:\n%s", restart, id, n, logs.String())
			}
			if w, _ := statusOf(rep, id); w.RestartCount != 0 {
				t.Errorf("after restart %d, %s restart count = %d; want 0", restart, id, w.RestartCount)
			}
		}
	}
}

// TestHandleOfUnloadedDriverReported: a workload whose record names a
// driver the restarted agent does not run is not handed to the loaded
// driver; it is reported (log, status message, workload.unrecovered event)
// and then started under the loaded driver, as its spec asks.
func TestHandleOfUnloadedDriverReported(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fc := newFakeCore(t)
	rec := record(ctx, t, fc)
	root := t.TempDir()
	dataDir := filepath.Join(root, "agent")
	logPath := filepath.Join(root, "driver.log")
	var logs syncbuf.Buffer
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dataDir, Logger: testLogger(&logs)}); err != nil {
		t.Fatal(err)
	}
	spec := node.WorkloadSpec{WorkloadID: "wl_sw", Project: "shop", Service: "web", Driver: "process",
		Command: []string{"serve"}, DesiredStatus: node.DesiredRunning, RestartGeneration: 1}

	stop := runDriverAgent(t, dataDir, filepath.Join(root, "state0"), logPath, "fake", &logs)
	rec.find(ctx, "hello", 0, func(env node.Envelope) bool { return env.Type == node.TypeHello })
	fc.desire(ctx, 1, spec)
	rec.status(ctx, "wl_sw running", statusIs("wl_sw", node.StatusRunning))
	stop()

	mark := rec.mark()
	stop = runDriverAgent(t, dataDir, filepath.Join(root, "state1"), logPath, "acme", &logs)
	defer stop()
	ev := rec.event(ctx, mark, EventWorkloadUnrecovered)
	if ev.Subject.ID != "wl_sw" || ev.Data["driver"] != "fake" || ev.Data["loaded_driver"] != "acme" {
		t.Errorf("event = %+v; want wl_sw started by fake, acme loaded", ev)
	}
	if !bytes.Contains([]byte(logs.String()), []byte(`driver=fake loaded_driver=acme`)) {
		t.Errorf("no log line names the unloaded driver:\n%s", logs.String())
	}
	rec.find(ctx, "a status report saying wl_sw was not recovered", mark, func(env node.Envelope) bool {
		var r node.StatusReport
		if env.Type != node.TypeStatusReport || json.Unmarshal(env.Body, &r) != nil {
			return false
		}
		w, ok := statusOf(r, "wl_sw")
		return ok && strings.Contains(w.Message, `not recovered: started by runtime driver "fake"`)
	})
	rec.status(ctx, "wl_sw running under acme", func(r node.StatusReport) bool {
		w, ok := statusOf(r, "wl_sw")
		return ok && w.ObservedStatus == node.StatusRunning && startLines(t, logPath, "wl_sw") == 2
	})
}
