package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

// Event types of job runs (docs/jobs.md section 8).
const (
	EventRunStarted   = "job.run.started"
	EventRunSucceeded = "job.run.succeeded"
	EventRunFailed    = "job.run.failed"
	EventRunMissed    = "job.run.missed"
	EventRunTimedOut  = "job.run.timed_out"
)

// ErrRunNotFound is returned by [Controller.Run] lookups and [Controller.Cancel] for a run id
// that names no run.
var ErrRunNotFound = errors.New("jobs: no such run")

// NodeLister lists the enrolled nodes (core/nodes.Registry).
type NodeLister interface {
	List(ctx context.Context) ([]nodes.Node, error)
}

// ControllerConfig configures [NewController]. Store, Catalog and Nodes are required.
type ControllerConfig struct {
	// Store holds the runs and cursors.
	Store *store.Store
	// Catalog holds the jobs (services of kind job) and the workloads runs are placed as.
	Catalog *services.Catalog
	// Nodes lists the nodes a run may be placed on.
	Nodes NodeLister
	// Wake asks that node's desired state be written again (a run placed on it or removed from
	// it); nil: the reconciler's next full pass does it.
	Wake func(nodeID string)
	// Events receives the job.run.* events; nil records none.
	Events *events.Log
	// Metrics registers berth_job_runs_total{result} and berth_job_run_duration_seconds; nil
	// registers nothing (they are still counted).
	Metrics prometheus.Registerer
	// Logger receives the controller's logs; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Interval is how often a pass runs; 0 means one second (the finest "@every" period).
	Interval time.Duration
	// ID names this controller's dispatcher in the runs it records; empty: "berthd".
	ID string
}

// Controller is the core's side of jobs (docs/jobs.md sections 7 and 8): it records fire times
// through its [Dispatcher], places each run as a workload through the one placement decider,
// applies the job's concurrency policy, and writes what the node reports of a run onto its run
// document. One runs in berthd; its passes are idempotent, so a pass cut short by a crash is
// finished by the next.
type Controller struct {
	cfg      ControllerConfig
	disp     *Dispatcher
	log      *slog.Logger
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewController returns a controller over cfg.
func NewController(cfg ControllerConfig) (*Controller, error) {
	if cfg.Store == nil || cfg.Catalog == nil || cfg.Nodes == nil {
		return nil, errors.New("jobs: a controller needs a store, a catalog and nodes")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.ID == "" {
		cfg.ID = "berthd"
	}
	log := cfg.Logger.With("component", "jobs")
	disp, err := NewDispatcher(DispatcherConfig{Store: cfg.Store, ID: cfg.ID, Logger: log})
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, disp: disp, log: log}
	c.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_job_runs_total",
		Help: "Job runs that ended, by result (succeeded, failed, timed_out, missed, cancelled).",
	}, []string{"result"})
	for _, r := range []RunState{RunSucceeded, RunFailed, RunTimedOut, RunMissed, RunCancelled} {
		c.runs.WithLabelValues(string(r))
	}
	c.duration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "berth_job_run_duration_seconds",
		Help:    "How long job runs ran, from their first start to their end, on the node's clock.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 16),
	})
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(c.runs, c.duration)
	}
	return c, nil
}

// JobKey is the id of job name of project in run ids and cursors: "<project>/<name>".
func JobKey(project, name string) string { return project + "/" + name }

// Run passes every Interval until ctx ends; a failed pass is logged and the next one tries
// again.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("job pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass is what one pass reads once.
type pass struct {
	now  time.Time
	svcs []services.Service
	jobs map[string]*services.Service // by JobKey
	all  map[string]*services.Service // every service and job not being deleted, by JobKey
	wls  []services.Workload
	byWl map[string]*services.Workload // workloads of runs, by run id
	ns   []nodes.Node
}

func (c *Controller) read(ctx context.Context) (*pass, error) {
	p := &pass{now: c.cfg.Now().UTC(), jobs: map[string]*services.Service{}, all: map[string]*services.Service{}, byWl: map[string]*services.Workload{}}
	var err error
	if p.svcs, err = c.cfg.Catalog.ListServices(ctx, nil); err != nil {
		return nil, err
	}
	for i := range p.svcs {
		if s := &p.svcs[i]; !s.Deleting {
			p.all[JobKey(s.Project, s.Name)] = s
			if s.IsJob() {
				p.jobs[JobKey(s.Project, s.Name)] = s
			}
		}
	}
	if p.wls, err = c.cfg.Catalog.ListWorkloads(ctx, nil); err != nil {
		return nil, err
	}
	for i := range p.wls {
		if w := &p.wls[i]; w.JobRun != "" {
			p.byWl[w.JobRun] = w
		}
	}
	if p.ns, err = c.cfg.Nodes.List(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// owner is the job of run r, or for a one-off command the service (or job) it runs in; nil
// when that is gone or being deleted.
func (p *pass) owner(r *Run) *services.Service {
	if r.Trigger == TriggerCommand {
		return p.all[r.Job]
	}
	return p.jobs[r.Job]
}

// Pass runs one pass:
//
//  1. every live run (pending or running) is brought forward: a run whose workload reported
//     its end is finished (state, exit, duration, output tail; its workload removed), a
//     pending one is placed (or recorded missed past its starting deadline), and a running
//     one whose workload is gone is placed again on its node or failed;
//  2. every scheduled, unsuspended job is stepped ([Dispatcher.Step]) and the run it owns is
//     placed under the job's concurrency policy;
//  3. the workloads of ended runs still standing are removed ([Controller.collect]).
//
// Idempotent: every write is a compare-and-set on one run or an insert under a known id.
func (c *Controller) Pass(ctx context.Context) error {
	p, err := c.read(ctx)
	if err != nil {
		return err
	}
	var errs []error
	live, err := c.liveRuns(ctx)
	if err != nil {
		return err
	}
	isLive := make(map[string]bool, len(live))
	for i := range live {
		isLive[live[i].ID] = true
		if err := c.advance(ctx, p, &live[i]); err != nil {
			errs = append(errs, err)
		}
	}
	keys := make([]string, 0, len(p.jobs))
	for k := range p.jobs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		svc := p.jobs[key]
		if svc.Job == nil || svc.Job.Schedule == "" || svc.Job.Suspended {
			continue
		}
		job := Job{ID: key, Schedule: Schedule{Cron: svc.Job.Schedule, TimeZone: svc.Job.TimeZone},
			StartingDeadline: time.Duration(svc.Job.StartingDeadlineS) * time.Second, Created: svc.CreatedAt}
		res, err := c.disp.Step(ctx, job, p.now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if res.Missed > 0 {
			c.runs.WithLabelValues(string(RunMissed)).Add(float64(res.Missed))
			c.event(ctx, svc, Run{ID: key + "@missed", Job: key}, EventRunMissed, map[string]any{"missed": res.Missed})
		}
		for i := range res.Owned {
			if err := c.start(ctx, p, svc, &res.Owned[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := c.collect(ctx, p, isLive); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// liveRuns returns the pending and running runs (a scan of the runs collection, which
// keep_history keeps small).
func (c *Controller) liveRuns(ctx context.Context) ([]Run, error) {
	var out []Run
	for _, st := range []RunState{RunPending, RunRunning} {
		var rs []Run
		if err := c.cfg.Store.FindAfter(ctx, RunsCollection, "_id", "", store.Fields{"state": st}, 0, &rs); err != nil {
			return nil, fmt.Errorf("jobs: list %s runs: %w", st, err)
		}
		out = append(out, rs...)
	}
	return out, nil
}

// advance brings one live run forward (step 1 of [Controller.Pass]).
func (c *Controller) advance(ctx context.Context, p *pass, r *Run) error {
	svc := p.owner(r)
	switch r.State {
	case RunPending:
		if svc == nil {
			return c.end(ctx, p, svc, r, RunCancelled, "the job was deleted before the run was placed", nil)
		}
		if r.Trigger == TriggerSchedule && p.now.Sub(r.FireTime) > time.Duration(svc.Job.StartingDeadlineS)*time.Second {
			return c.end(ctx, p, svc, r, RunMissed, fmt.Sprintf("not placed within the starting deadline of %ds", svc.Job.StartingDeadlineS), nil)
		}
		return c.start(ctx, p, svc, r)
	case RunRunning:
		w := p.byWl[r.ID]
		if w == nil {
			return c.replace(ctx, p, r)
		}
		o := w.JobOutcome
		if o == nil {
			return nil
		}
		if r.StartedAt.IsZero() && !o.StartedAt.IsZero() {
			c.event(ctx, svc, *r, EventRunStarted, map[string]any{"node_id": r.NodeID, "workload_id": r.WorkloadID})
			if _, err := c.set(ctx, r, store.Fields{"started_at": o.StartedAt}); err != nil {
				return err
			}
		}
		var state RunState
		switch o.Result {
		case node.JobSucceeded:
			state = RunSucceeded
		case node.JobFailed:
			state = RunFailed
		case node.JobTimedOut:
			state = RunTimedOut
		default:
			return nil
		}
		return c.end(ctx, p, svc, r, state, w.Message, o)
	}
	return nil
}

// replace handles a running run whose workload document is gone: before its node reported an
// end it is inserted again (idempotent under its id) while its node is enrolled, and failed
// otherwise.
func (c *Controller) replace(ctx context.Context, p *pass, r *Run) error {
	svc := p.owner(r)
	for i := range p.ns {
		if n := &p.ns[i]; svc != nil && n.ID == r.NodeID && n.Status != nodes.StatusRemoved {
			w := runWorkload(svc, r, r.NodeID, r.PlacedAt)
			if err := c.cfg.Catalog.InsertWorkload(ctx, w); err != nil {
				return err
			}
			c.wake(r.NodeID)
			return nil
		}
	}
	return c.end(ctx, p, svc, r, RunFailed, "its workload and node are gone", nil)
}

// runWorkload is the workload document of run r of job svc on nodeID.
func runWorkload(svc *services.Service, r *Run, nodeID string, at time.Time) *services.Workload {
	w := &services.Workload{ID: r.WorkloadID, ProjectID: svc.ProjectID, Project: svc.Project, ServiceID: svc.ID, Service: svc.Name,
		NodeID: nodeID, SpecHash: svc.SpecHash(), DesiredStatus: services.DesiredRunning, ObservedStatus: "creating", Health: "unknown",
		CreatedAt: at, Run: services.InvocationOf(svc), JobRun: r.ID}
	if svc.Job != nil {
		w.JobTimeoutS, w.JobRetries = svc.Job.TimeoutS, svc.Job.Retries
	}
	if r.Trigger == TriggerCommand {
		commandInvocation(w, r)
	}
	return w
}

// start places pending run r of job svc (docs/jobs.md section 7): the concurrency policy
// first (forbid records it missed while another run is live; replace cancels the live ones
// first; allow and manual runs skip it), then the one placement decider over the nodes, then
// the run is marked running with its workload id and node (one compare-and-set) and the
// workload inserted under that id. A run no node fits stays pending, saying why.
func (c *Controller) start(ctx context.Context, p *pass, svc *services.Service, r *Run) error {
	if r.Trigger == TriggerSchedule {
		var others []*services.Workload
		for id, w := range p.byWl {
			if id != r.ID && w.ServiceID == svc.ID && (w.JobOutcome == nil || w.JobOutcome.Result == node.JobRunning) {
				others = append(others, w)
			}
		}
		switch svc.Job.Concurrency {
		case services.ConcurrencyForbid:
			if len(others) > 0 {
				return c.end(ctx, p, svc, r, RunMissed, "skipped: concurrency forbid, run "+others[0].JobRun+" is still running", nil)
			}
		case services.ConcurrencyReplace:
			for _, w := range others {
				if err := c.Cancel(ctx, w.JobRun, "replaced by run "+r.ID); err != nil && !errors.Is(err, ErrRunNotFound) {
					return err
				}
				delete(p.byWl, w.JobRun)
			}
		}
	}
	use := placement.UsageOf(p.svcs, p.wls)
	req := placement.ServiceRequest(svc)
	req.Place = []string{r.ID}
	if r.Trigger == TriggerCommand {
		// A one-off command is not a replica of its service: the service's max_per_node and
		// spread do not hold it back; its resources and node constraints still apply.
		req.Service, req.MaxPerNode = r.ID, 0
	}
	res := placement.Choose(req, placement.Candidates(p.ns, use, svc.Runtime))
	nodeID := res.Placed()[r.ID]
	if nodeID == "" {
		why := "no node fits: " + res.Unplaceable()
		if r.Message != why {
			_, err := c.set(ctx, r, store.Fields{"message": why})
			return err
		}
		return nil
	}
	r.WorkloadID = identity.NewID("wl_")
	rev, err := c.cfg.Store.SetIfRevision(ctx, RunsCollection, r.ID, r.Revision, store.Fields{"state": RunRunning,
		"workload_id": r.WorkloadID, "node_id": nodeID, "placed_at": p.now, "message": ""})
	if errors.Is(err, store.ErrConflict) {
		return nil // another pass moved it; the next pass reads it again
	} else if err != nil {
		return fmt.Errorf("jobs: place run %s: %w", r.ID, err)
	}
	r.Revision, r.State, r.NodeID, r.PlacedAt = rev, RunRunning, nodeID, p.now
	w := runWorkload(svc, r, nodeID, p.now)
	if err := c.cfg.Catalog.InsertWorkload(ctx, w); err != nil {
		return err
	}
	p.wls = append(p.wls, *w)
	p.byWl[r.ID] = w
	c.log.Info("job run placed", "run", r.ID, "node_id", nodeID, "workload_id", w.ID)
	c.wake(nodeID)
	return nil
}

// set writes fields on run r under its revision and moves r's revision on.
func (c *Controller) set(ctx context.Context, r *Run, f store.Fields) (bool, error) {
	rev, err := c.cfg.Store.SetIfRevision(ctx, RunsCollection, r.ID, r.Revision, f)
	if errors.Is(err, store.ErrConflict) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("jobs: update run %s: %w", r.ID, err)
	}
	r.Revision = rev
	return true, nil
}

// end records run r final in state with msg and, when the node reported it, its outcome o
// (one compare-and-set), then counts it, appends its event, removes its workload and prunes
// the job's history. A run that is final already only has its workload removed.
func (c *Controller) end(ctx context.Context, p *pass, svc *services.Service, r *Run, state RunState, msg string, o *services.JobOutcome) error {
	f := store.Fields{"state": state, "message": msg}
	if o != nil {
		f["attempts"], f["signal"], f["output_tail"] = o.Attempts, o.Signal, o.OutputTail
		if o.ExitCode != nil {
			f["exit_code"] = *o.ExitCode
		}
		if !o.StartedAt.IsZero() {
			f["started_at"] = o.StartedAt
		}
		if !o.EndedAt.IsZero() {
			f["ended_at"] = o.EndedAt
			if !o.StartedAt.IsZero() {
				f["duration_s"] = o.EndedAt.Sub(o.StartedAt).Seconds()
			}
		}
	} else {
		f["ended_at"] = p.now
	}
	ok, err := c.set(ctx, r, f)
	if err != nil || !ok {
		return err
	}
	c.runs.WithLabelValues(string(state)).Inc()
	data := map[string]any{"state": string(state)}
	if o != nil {
		if d, ok := f["duration_s"].(float64); ok {
			c.duration.Observe(d)
			data["duration_s"] = d
		}
		if o.ExitCode != nil {
			data["exit_code"] = *o.ExitCode
		}
		if o.Signal != 0 {
			data["signal"] = o.Signal
		}
	}
	if msg != "" {
		data["message"] = msg
	}
	switch state {
	case RunSucceeded:
		c.event(ctx, svc, *r, EventRunSucceeded, data)
	case RunFailed:
		c.event(ctx, svc, *r, EventRunFailed, data)
	case RunTimedOut:
		c.event(ctx, svc, *r, EventRunTimedOut, data)
	case RunMissed:
		c.event(ctx, svc, *r, EventRunMissed, data)
	}
	c.log.Info("job run ended", "run", r.ID, "state", state, "message", msg)
	// A one-off command's workload stays (ended, never started again) for CommandOutputLinger,
	// so the caller reads all of its output from the node; collect removes it then.
	if r.WorkloadID != "" && r.Trigger != TriggerCommand {
		if err := c.cfg.Catalog.RemoveWorkload(ctx, r.WorkloadID); err != nil {
			return err
		}
		if p != nil {
			delete(p.byWl, r.ID)
		}
		c.wake(r.NodeID)
	}
	switch {
	case svc != nil && svc.Job != nil:
		return c.prune(ctx, r.Job, svc.Job.KeepHistory)
	case r.Trigger == TriggerCommand:
		return c.prune(ctx, r.Job, CommandKeepHistory)
	}
	return nil
}

// prune deletes the oldest ended runs of job beyond keep.
func (c *Controller) prune(ctx context.Context, job string, keep int) error {
	runs, err := c.Runs(ctx, job)
	if err != nil {
		return err
	}
	ended := 0
	for i := len(runs) - 1; i >= 0; i-- { // newest first
		if !runs[i].State.Final() {
			continue
		}
		if ended++; ended > keep {
			if _, err := c.cfg.Store.DeleteWhen(ctx, RunsCollection, runs[i].ID, store.Fields{"state": runs[i].State}); err != nil {
				return fmt.Errorf("jobs: prune run %s: %w", runs[i].ID, err)
			}
		}
	}
	return nil
}

// Runs returns the runs of job (a [JobKey]) oldest first.
func (c *Controller) Runs(ctx context.Context, job string) ([]Run, error) {
	var runs []Run
	if err := c.cfg.Store.FindAfter(ctx, RunsCollection, "_id", job+"@", store.Fields{"job": job}, 0, &runs); err != nil {
		return nil, fmt.Errorf("jobs: list runs of %s: %w", job, err)
	}
	return runs, nil
}

// Get returns the run id; errors wrap [ErrRunNotFound] when there is none.
func (c *Controller) Get(ctx context.Context, id string) (*Run, error) {
	var r Run
	if err := c.cfg.Store.Get(ctx, RunsCollection, id, &r); errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrRunNotFound, id)
	} else if err != nil {
		return nil, err
	}
	return &r, nil
}

// Trigger records a manual run of job svc now (berth job run) and places it at once; a run no
// node fits stays pending and is placed by a later pass. It returns the run as recorded.
func (c *Controller) Trigger(ctx context.Context, svc *services.Service) (*Run, error) {
	r := c.newRun(ctx, svc, TriggerManual)
	return c.record(ctx, svc, r)
}

// newRun is a pending run of svc started now by the caller ctx carries, with trigger
// TriggerManual or TriggerCommand.
func (c *Controller) newRun(ctx context.Context, svc *services.Service, trigger string) Run {
	now := c.cfg.Now().UTC()
	var b [4]byte
	_, _ = rand.Read(b[:])
	key := JobKey(svc.Project, svc.Name)
	kind := "manual"
	if trigger == TriggerCommand {
		kind = "run"
	}
	// The suffix keeps two runs in one second apart; the id still sorts by time.
	r := Run{ID: key + "@" + now.Format(time.RFC3339) + "-" + kind + "-" + hex.EncodeToString(b[:]), Job: key, FireTime: now.Truncate(time.Second),
		State: RunPending, RecordedAt: now, RecordedBy: c.cfg.ID, Trigger: trigger}
	if a, ok := changelog.ActorFrom(ctx); ok {
		r.RequestedBy = a.Type + ":" + a.ID
	}
	return r
}

// record inserts pending run r of svc and places it at once; a run no node fits stays pending
// and is placed by a later pass. It returns the run as recorded.
func (c *Controller) record(ctx context.Context, svc *services.Service, r Run) (*Run, error) {
	key := r.Job
	if err := c.cfg.Store.Insert(ctx, RunsCollection, r); err != nil {
		return nil, fmt.Errorf("jobs: record run of %s: %w", key, err)
	}
	p, err := c.read(ctx)
	if err != nil {
		return &r, err
	}
	if err := c.start(ctx, p, svc, &r); err != nil {
		return &r, err
	}
	return c.Get(ctx, r.ID)
}

// Cancel stops live run id (its workload is removed from its node, which stops it gracefully,
// then forcibly) and records it cancelled with why; a run that ended already is left as it is.
// Errors wrap [ErrRunNotFound].
func (c *Controller) Cancel(ctx context.Context, id, why string) error {
	return store.RetryOnConflict(ctx, func() error {
		r, err := c.Get(ctx, id)
		if err != nil {
			return err
		}
		if r.State.Final() {
			return nil
		}
		now := c.cfg.Now().UTC()
		f := store.Fields{"state": RunCancelled, "message": why, "ended_at": now}
		if !r.StartedAt.IsZero() {
			// It ran until now: its duration, and at least the attempt that was running.
			f["duration_s"] = max(0, now.Sub(r.StartedAt).Seconds())
			f["attempts"] = max(r.Attempts, 1)
		}
		if _, err := c.cfg.Store.SetIfRevision(ctx, RunsCollection, r.ID, r.Revision, f); err != nil {
			return err
		}
		c.runs.WithLabelValues(string(RunCancelled)).Inc()
		if r.WorkloadID != "" {
			if err := c.cfg.Catalog.RemoveWorkload(ctx, r.WorkloadID); err != nil {
				return err
			}
			c.wake(r.NodeID)
		}
		c.log.Info("job run cancelled", "run", r.ID, "why", why)
		return nil
	}, store.ErrConflict)
}

func (c *Controller) wake(nodeID string) {
	if c.cfg.Wake != nil && nodeID != "" {
		c.cfg.Wake(nodeID)
	}
}

// event appends a job.run.* event about run r of svc (svc may be nil for a deleted job), under
// an id made of the run and the type, so a pass repeated after a crash appends it once.
func (c *Controller) event(ctx context.Context, svc *services.Service, r Run, typ string, data map[string]any) {
	if c.cfg.Events == nil {
		return
	}
	data["run"] = r.ID
	ev := node.Event{ID: "evt_" + typ + ":" + r.ID, Type: typ, Time: c.cfg.Now().UTC(), Source: node.EventSource{Kind: "core"},
		Subject: node.EventRef{Type: "job_run", ID: r.ID}, Actor: node.EventRef{Type: "system", ID: "berthd"}, Data: data}
	if svc != nil {
		ev.ProjectID = svc.ProjectID
	}
	if typ == EventRunMissed && r.FireTime.IsZero() {
		ev.ID = identity.NewID("evt_") // a count of missed fire times of one step
	}
	if _, _, err := c.cfg.Events.Append(ctx, ev); err != nil {
		c.log.Warn("record a job run event", "run", r.ID, "type", typ, "err", err)
	}
}
