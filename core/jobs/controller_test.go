package jobs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// oneNode lists one connected node with room for every run.
type oneNode struct{}

func (oneNode) List(context.Context) ([]nodes.Node, error) {
	return []nodes.Node{{ID: "nod_a", Hostname: "a", Status: nodes.StatusConnected, CPUs: 64, MemoryMB: 1 << 20}}, nil
}

// clock is a settable clock for a controller.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

// controllerFixture is a controller on the embedded store with one "@every 2s" job of
// concurrency conc, declared at t0.
type controllerFixture struct {
	st  *store.Store
	cat *services.Catalog
	c   *jobs.Controller
	clk *clock
	svc *services.Service
	key string
}

func newControllerFixture(t testing.TB, conc string, t0 time.Time) *controllerFixture {
	t.Helper()
	ctx := testCtx(t)
	f := &controllerFixture{st: storetest.Open(t), clk: &clock{now: t0}}
	f.cat = services.NewCatalog(f.st, f.clk.Now)
	p, _, err := f.cat.EnsureProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	f.svc = f.addJob(t, p, "tick", "@every 2s", conc)
	f.key = jobs.JobKey("default", "tick")
	if f.c, err = jobs.NewController(jobs.ControllerConfig{Store: f.st, Catalog: f.cat, Nodes: oneNode{}, Now: f.clk.Now}); err != nil {
		t.Fatal(err)
	}
	return f
}

// addJob declares job name of project p with schedule spec and concurrency conc.
func (f *controllerFixture) addJob(t testing.TB, p *services.Project, name, spec, conc string) *services.Service {
	t.Helper()
	svc := &services.Service{Name: name, Kind: services.KindJob, Bundle: "tick", BundleDigest: "sha256:" + strings.Repeat("ab", 32),
		Command: []string{"./tick"}, Job: &services.JobSettings{Schedule: spec, Concurrency: conc, StartingDeadlineS: 300, KeepHistory: 100}}
	out, _, err := f.cat.PutService(testCtx(t), p, svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pass runs one controller pass at now.
func (f *controllerFixture) pass(t testing.TB, now time.Time) {
	t.Helper()
	f.clk.Set(now)
	if err := f.c.Pass(testCtx(t)); err != nil {
		t.Fatalf("pass at %s: %v", now.Format(time.RFC3339), err)
	}
}

// runs returns the job's runs by fire time, and its workloads by run id.
func (f *controllerFixture) runs(t testing.TB) (map[time.Time]jobs.Run, map[string]services.Workload) {
	t.Helper()
	ctx := testCtx(t)
	rs, err := f.c.Runs(ctx, f.key)
	if err != nil {
		t.Fatal(err)
	}
	byFire := map[time.Time]jobs.Run{}
	for _, r := range rs {
		byFire[r.FireTime] = r
	}
	ws, err := f.cat.ListWorkloads(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byRun := map[string]services.Workload{}
	for _, w := range ws {
		if w.JobRun != "" {
			byRun[w.JobRun] = w
		}
	}
	return byFire, byRun
}

// report records what node nod_a says of run r's workload.
func (f *controllerFixture) report(t testing.TB, r jobs.Run, o services.JobOutcome) {
	t.Helper()
	if _, err := f.cat.Observe(testCtx(t), "nod_a", []services.Observation{{WorkloadID: r.WorkloadID, ObservedStatus: "running", Health: "unknown", Job: &o}}); err != nil {
		t.Fatal(err)
	}
}

// TestForbidNeverOverlaps steps an "@every 2s" job of concurrency forbid through 30 fire times
// whose runs each take 5 s (they end at the first pass at least 5 s after they started): after
// every pass at most one run is live and at most one workload of the job exists, each fire time
// that came while a run was live is recorded missed with the live run named, and every other
// fire time ran (docs/jobs.md section 7).
func TestForbidNeverOverlaps(t *testing.T) {
	t0 := utc("2026-12-02T10:00:01Z")
	f := newControllerFixture(t, services.ConcurrencyForbid, t0)
	const fires, runFor = 30, 5 * time.Second
	live := map[string]time.Time{} // run id -> when its process started
	for i := 1; i <= fires; i++ {
		now := t0.Add(time.Duration(2*i-1) * time.Second) // the fire time t0-1+2i, one pass each
		// The node reports: a run placed at the previous pass started; one that ran runFor ended.
		byFire, _ := f.runs(t)
		for _, r := range byFire {
			if r.State != jobs.RunRunning {
				continue
			}
			started, ok := live[r.ID]
			if !ok {
				live[r.ID] = now
				f.report(t, r, services.JobOutcome{Result: node.JobRunning, Attempts: 1, StartedAt: now})
			} else if now.Sub(started) >= runFor {
				zero := 0
				f.report(t, r, services.JobOutcome{Result: node.JobSucceeded, Attempts: 1, ExitCode: &zero, StartedAt: started, EndedAt: now})
				delete(live, r.ID)
			}
		}
		f.pass(t, now)
		byFire, wls := f.runs(t)
		running, jobWls := 0, len(wls)
		for _, r := range byFire {
			if !r.State.Final() {
				running++
			}
		}
		if running > 1 || jobWls > 1 {
			t.Fatalf("after the pass at %s: %d live runs, %d workloads; forbid allows one", now.Format(time.RFC3339), running, jobWls)
		}
	}
	byFire, _ := f.runs(t)
	missed, ran := 0, 0
	for i := 1; i <= fires; i++ {
		fire := t0.Add(time.Duration(2*i-1) * time.Second)
		r, ok := byFire[fire]
		if !ok {
			t.Fatalf("fire time %s not recorded", fire.Format(time.RFC3339))
		}
		switch r.State {
		case jobs.RunMissed:
			if !strings.Contains(r.Message, "concurrency forbid") {
				t.Errorf("run %s missed: %q, want the forbid reason", r.ID, r.Message)
			}
			missed++
		case jobs.RunSucceeded, jobs.RunRunning:
			ran++
		default:
			t.Errorf("run %s is %s (%s)", r.ID, r.State, r.Message)
		}
	}
	// A run placed at pass k is reported started at pass k+1 and ended at pass k+4 (6 s later),
	// which places that pass's fire time: three of every four fire times are missed.
	if want := fires / 4; ran < want || ran > want+1 || missed+ran != fires {
		t.Errorf("%d missed, %d ran of %d fire times", missed, ran, fires)
	}
	t.Logf("%d fire times: %d ran, %d missed under forbid", fires, ran, missed)
}

// TestPassRemovesTheWorkloadOfAnEndedRun: a crash after a run was recorded final and before its
// workload was removed leaves the workload; the next pass removes it.
func TestPassRemovesTheWorkloadOfAnEndedRun(t *testing.T) {
	t0 := utc("2026-12-02T10:00:01Z")
	f := newControllerFixture(t, services.ConcurrencyAllow, t0)
	f.pass(t, t0.Add(time.Second))
	byFire, wls := f.runs(t)
	r, ok := byFire[t0.Add(time.Second)]
	if !ok || r.State != jobs.RunRunning || len(wls) != 1 {
		t.Fatalf("after the first pass: run %+v, %d workloads; want it running with its workload", r, len(wls))
	}
	// What end does, cut short by a crash: the run is final, its workload still there.
	if _, err := f.st.SetIfRevision(testCtx(t), jobs.RunsCollection, r.ID, r.Revision, store.Fields{"state": jobs.RunSucceeded}); err != nil {
		t.Fatal(err)
	}
	f.pass(t, t0.Add(1500*time.Millisecond))
	if _, wls := f.runs(t); len(wls) != 0 {
		t.Fatalf("the ended run's workload is still there: %+v", wls)
	}
}

// TestCancelRecordsDurationAndAttempt: a run cancelled while its process runs is recorded with
// how long it ran and the attempt that was running (a trial found both zero).
func TestCancelRecordsDurationAndAttempt(t *testing.T) {
	t0 := utc("2026-12-02T10:00:01Z")
	f := newControllerFixture(t, services.ConcurrencyAllow, t0)
	f.pass(t, t0.Add(time.Second))
	byFire, _ := f.runs(t)
	r := byFire[t0.Add(time.Second)]
	if r.State != jobs.RunRunning {
		t.Fatalf("run %+v, want running", r)
	}
	if _, err := f.st.SetIfRevision(testCtx(t), jobs.RunsCollection, r.ID, r.Revision, store.Fields{"started_at": t0.Add(1500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	f.clk.Set(t0.Add(4500 * time.Millisecond))
	if err := f.c.Cancel(testCtx(t), r.ID, "asked"); err != nil {
		t.Fatal(err)
	}
	got, err := f.c.Get(testCtx(t), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != jobs.RunCancelled || got.DurationS != 3 || got.Attempts != 1 {
		t.Errorf("cancelled run: state %s, duration %v s, attempts %d; want cancelled, 3 s, 1", got.State, got.DurationS, got.Attempts)
	}
}

// TestRunEventsAndMetrics: a run that starts and succeeds is recorded as the events
// job.run.started and job.run.succeeded (once each, whatever the passes that see it), counted in
// berth_job_runs_total{result="succeeded"}, and its duration observed in
// berth_job_run_duration_seconds (docs/jobs.md section 8).
func TestRunEventsAndMetrics(t *testing.T) {
	t0 := utc("2026-12-02T10:00:01Z")
	f := newControllerFixture(t, services.ConcurrencyForbid, t0)
	reg := prometheus.NewRegistry()
	ev := events.New(f.st, f.clk.Now)
	c, err := jobs.NewController(jobs.ControllerConfig{Store: f.st, Catalog: f.cat, Nodes: oneNode{}, Now: f.clk.Now, Events: ev, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	f.pass(t, t0.Add(time.Second))
	byFire, _ := f.runs(t)
	r, ok := byFire[t0.Add(time.Second)]
	if !ok || r.State != jobs.RunRunning {
		t.Fatalf("after the first pass: %+v", byFire)
	}
	started := t0.Add(1500 * time.Millisecond)
	f.report(t, r, services.JobOutcome{Result: node.JobRunning, Attempts: 1, StartedAt: started})
	f.pass(t, t0.Add(1600*time.Millisecond))
	zero := 0
	f.report(t, r, services.JobOutcome{Result: node.JobSucceeded, Attempts: 1, ExitCode: &zero, StartedAt: started, EndedAt: started.Add(4 * time.Second)})
	f.pass(t, t0.Add(2*time.Second))
	f.pass(t, t0.Add(2500*time.Millisecond)) // a second pass over the ended run records nothing more
	if got, _ := f.c.Get(testCtx(t), r.ID); got == nil || got.State != jobs.RunSucceeded {
		t.Fatalf("run after its end: %+v", got)
	}
	for typ, want := range map[string]int{jobs.EventRunStarted: 1, jobs.EventRunSucceeded: 1, jobs.EventRunFailed: 0} {
		recs, err := ev.List(testCtx(t), 0, typ, 1000)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, rec := range recs {
			if rec.Event.Subject.ID == r.ID {
				n++
			}
		}
		if n != want {
			t.Errorf("%d %s events of run %s, want %d", n, typ, r.ID, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var succeeded, samples, sum float64 = -1, -1, -1
	for _, mf := range mfs {
		switch mf.GetName() {
		case "berth_job_runs_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == string(jobs.RunSucceeded) {
						succeeded = m.GetCounter().GetValue()
					}
				}
			}
		case "berth_job_run_duration_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			samples, sum = float64(h.GetSampleCount()), h.GetSampleSum()
		}
	}
	if succeeded != 1 || samples != 1 || sum != 4 {
		t.Errorf("berth_job_runs_total{result=succeeded} = %v; berth_job_run_duration_seconds %v samples summing %v s; want 1, 1 of 4 s", succeeded, samples, sum)
	}
}
