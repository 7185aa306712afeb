package jobs_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// commandNodes is a NodeLister of fixed nodes: what the registry answers, without enrolling.
type commandNodes []nodes.Node

func (n commandNodes) List(context.Context) ([]nodes.Node, error) { return slices.Clone(n), nil }

// commandClock is a settable clock for the controller.
type commandClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *commandClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *commandClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRunCommandLifecycle drives a one-off command through the controller over the embedded
// store (docs/jobs.md section 9): it is placed at once as a workload running the service's
// release with the command, without port, health check or retry; its workload outlives the
// run's end by CommandOutputLinger and is removed by the first pass after; a stateful service
// and an empty command are refused.
func TestRunCommandLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := storetest.Open(t)
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	clock := &commandClock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	ns := commandNodes{{ID: "nod_a", Status: nodes.StatusConnected, Allocatable: nodes.Resources{CPUMilli: 4000, MemoryMiB: 8192}}}
	var woken []string
	c, err := jobs.NewController(jobs.ControllerConfig{Store: st, Catalog: cat, Nodes: ns, Now: clock.Now,
		Wake: func(id string) { woken = append(woken, id) }})
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := cat.EnsureProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	svc, _, err := cat.ApplyService(ctx, p, &services.Service{Name: "web", Bundle: "app", BundleDigest: "sha256:ab",
		Command: []string{"./serve"}, Env: map[string]string{"GREETING": "hello"}, Port: 8080, Replicas: 1,
		HealthCheck: services.HealthCheck{Path: "/healthz", IntervalS: 5, TimeoutS: 2, Failures: 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.RunCommand(ctx, svc, jobs.CommandRequest{}); abierrors.CodeOf(err) != abierrors.ValidationFailed {
		t.Errorf("an empty command: %v, want validation_failed", err)
	}
	stateful := *svc
	stateful.PlacementMode = services.PlacementStateful
	if _, err := c.RunCommand(ctx, &stateful, jobs.CommandRequest{Command: []string{"true"}}); abierrors.CodeOf(err) != abierrors.ValidationFailed {
		t.Errorf("a stateful service: %v, want validation_failed", err)
	}

	r, err := c.RunCommand(ctx, svc, jobs.CommandRequest{Command: []string{"sh", "-c", "exit 7"}, TimeoutS: 30})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != jobs.RunRunning || r.NodeID != "nod_a" || r.Trigger != jobs.TriggerCommand || r.Job != "default/web" || r.WorkloadID == "" {
		t.Fatalf("run after RunCommand: %+v; want running on nod_a", r)
	}
	wls, err := cat.FindWorkloads(ctx, services.WorkloadFilter{ID: r.WorkloadID})
	if err != nil || len(wls) != 1 {
		t.Fatalf("the run's workload: %v %v", wls, err)
	}
	w := wls[0]
	if w.JobRun != r.ID || w.Run == nil || !slices.Equal(w.Run.Command, []string{"sh", "-c", "exit 7"}) || w.Run.Port != 0 ||
		w.Run.HealthCheck != (services.HealthCheck{}) || w.Run.Env["GREETING"] != "hello" || w.Run.BundleDigest != svc.BundleDigest ||
		w.JobTimeoutS != 30 || w.JobRetries != 0 || w.Replica != "" {
		t.Fatalf("the run's workload: %+v run %+v; want the service's release and env with the command, no port, no health check, no retry", w, w.Run)
	}
	if !slices.Contains(woken, "nod_a") {
		t.Errorf("nod_a was not woken: %v", woken)
	}

	// The node reports the end: the run is final, its workload stays for the linger.
	code := 7
	ended := clock.Now().Add(2 * time.Second)
	if _, err := cat.Observe(ctx, "nod_a", []services.Observation{{WorkloadID: w.ID, ObservedStatus: "exited",
		Job: &services.JobOutcome{Result: "failed", Attempts: 1, ExitCode: &code, StartedAt: clock.Now(), EndedAt: ended, OutputTail: "x\n"}}}); err != nil {
		t.Fatal(err)
	}
	clock.add(3 * time.Second)
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, r.ID)
	if err != nil || got.State != jobs.RunFailed || got.ExitCode == nil || *got.ExitCode != 7 {
		t.Fatalf("run after its end: %+v %v; want failed with exit 7", got, err)
	}
	present := func() bool {
		t.Helper()
		wls, err := cat.FindWorkloads(ctx, services.WorkloadFilter{ID: w.ID})
		if err != nil {
			t.Fatal(err)
		}
		return len(wls) == 1
	}
	if !present() {
		t.Fatal("the ended run's workload was removed before its output linger")
	}
	clock.add(jobs.CommandOutputLinger - 2*time.Second) // one second short of the linger
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !present() {
		t.Fatal("the ended run's workload was removed before its output linger")
	}
	clock.add(2 * time.Second)
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if present() {
		t.Fatal("the ended run's workload is still there after its output linger")
	}
}
