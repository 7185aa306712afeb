// Package reconciler converges the cluster on the declared services: it places
// slots with core/scheduler, writes each node's desired state, and pushes the
// route table to the gateway. It is level-triggered: every pass recomputes
// everything from the store, so a missed hint only delays convergence.
package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/scheduler"
	"github.com/berthhq/berth/core/services"
)

// Pusher delivers a node's stored desired state on its live session.
type Pusher interface {
	Push(ctx context.Context, nodeID string)
}

// RouteSink receives the complete route table whenever it changes.
type RouteSink interface {
	SetRoutes(ctx context.Context, t abiroutes.Table) error
}

// Config wires a Reconciler. Catalog, Nodes and Compiler are required.
type Config struct {
	Catalog  *services.Catalog
	Nodes    *nodes.Registry
	Pusher   Pusher    // nil: desired state is stored, not pushed
	Routes   RouteSink // nil: routes are computed, not pushed
	Compiler routes.Compiler
	// Admit, when not nil, is asked before each slot is placed (the deploy
	// hook); a refusal leaves the slot unplaced until a later pass.
	Admit  DeployAdmitter
	Logger *slog.Logger
	// Interval is the period of the timer pass; zero means 5 s.
	Interval time.Duration
}

// DeployAdmitter decides whether slot of service s may start on node n.
// reasons explain a refusal; an error refuses too (fail closed).
type DeployAdmitter interface {
	AdmitDeploy(ctx context.Context, s *services.Service, slot int, n *nodes.Node) (allowed bool, reasons []string, err error)
}

// Reconciler runs passes one at a time: on a hint (coalesced) and on a timer.
type Reconciler struct {
	cfg   Config
	log   *slog.Logger
	hints chan struct{}

	mu          sync.Mutex
	routeDigest string // digest of the last table the sink accepted; mu must be held
	routeRev    int64
	table       abiroutes.Table
	compiledAt  time.Time // when table was computed; mu must be held
	routeErr    error     // the last compile failure, nil after a success; mu must be held
	routeErrAt  time.Time // mu must be held
	compiler    string    // the compiler that made table; mu must be held
	failing     string    // the compiler that made routeErr; mu must be held
}

// New returns a Reconciler.
func New(cfg Config) *Reconciler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	return &Reconciler{cfg: cfg, log: cfg.Logger.With("component", "reconciler"), hints: make(chan struct{}, 1)}
}

// Hint asks for a pass soon. It never blocks; hints during a pass earn one follow-up pass.
func (r *Reconciler) Hint(reason string) {
	select {
	case r.hints <- struct{}{}:
		r.log.Debug("reconcile hinted", "reason", reason)
	default:
	}
}

// Run passes until ctx ends. A failed pass is logged and retried on the next
// hint or tick.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.hints:
		case <-t.C:
		}
	}
}

// Table returns the last route table computed.
func (r *Reconciler) Table() abiroutes.Table {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table
}

// RouteStatus returns the route table in force, its SHA-256, the compiler and
// the last compile failure (routes.Status).
func (r *Reconciler) RouteStatus() routes.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := routes.Status{Table: r.table, SHA256: r.table.Digest(), CompiledAt: r.compiledAt, Compiler: r.compiler}
	if st.Table.Routes == nil {
		st.Table.Routes = []abiroutes.Route{}
	}
	if st.Compiler == "" { // nothing compiled yet
		st.Compiler = "none yet; next: " + describe(r.cfg.Compiler)
	}
	if r.routeErr != nil {
		at := r.routeErrAt
		st.LastError, st.LastErrorAt, st.FailingCompiler = r.routeErr.Error(), &at, r.failing
	}
	return st
}

// describe names a compiler: its Describe method (routes.Wasm,
// routes.Bindable: the compiler its latest Compile ran), else "unknown".
func describe(c routes.Compiler) string {
	if d, ok := c.(interface{ Describe() string }); ok {
		return d.Describe()
	}
	return "unknown"
}

// Pass runs one reconcile pass: placement, then node desired states, then routes.
func (r *Reconciler) Pass(ctx context.Context) error {
	svcs, err := r.cfg.Catalog.ListServices(ctx, nil)
	if err != nil {
		return err
	}
	ns, err := r.cfg.Nodes.List(ctx)
	if err != nil {
		return err
	}
	wls, err := r.cfg.Catalog.ListWorkloads(ctx, nil)
	if err != nil {
		return err
	}
	if err := r.place(ctx, svcs, ns, wls); err != nil {
		return err
	}
	if wls, err = r.cfg.Catalog.ListWorkloads(ctx, nil); err != nil {
		return err
	}
	var errs []error
	if err := r.desire(ctx, svcs, ns, wls); err != nil {
		errs = append(errs, err)
	}
	if err := r.route(ctx, svcs, ns, wls); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) place(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload) error {
	load := map[string]int{}
	bySvc := map[string][]scheduler.Workload{}
	for _, w := range wls {
		load[w.NodeID]++
		bySvc[w.ServiceID] = append(bySvc[w.ServiceID], scheduler.Workload{ID: w.ID, Slot: w.Slot, NodeID: w.NodeID, SpecHash: w.SpecHash})
	}
	var cands []scheduler.Node
	for _, n := range ns {
		if n.Status == nodes.StatusRemoved {
			continue
		}
		cands = append(cands, scheduler.Node{ID: n.ID, Schedulable: n.Status == nodes.StatusConnected, Load: load[n.ID]})
	}
	live := map[string]bool{}
	for i := range svcs {
		s := &svcs[i]
		live[s.ID] = true
		acts := scheduler.Place(scheduler.Service{Replicas: s.Replicas, SpecHash: s.SpecHash()}, cands, bySvc[s.ID])
		for _, a := range acts {
			switch a.Kind {
			case scheduler.Remove:
				if err := r.cfg.Catalog.RemoveWorkload(ctx, a.WorkloadID); err != nil {
					return err
				}
				r.log.Info("workload removed", "service", s.Project+"/"+s.Name, "slot", a.Slot, "workload_id", a.WorkloadID)
			case scheduler.Create:
				if r.cfg.Admit != nil {
					ok, err := r.admit(ctx, s, a.Slot, a.NodeID, ns)
					if err != nil {
						return err
					}
					if !ok {
						continue
					}
				}
				w, err := r.cfg.Catalog.CreateWorkload(ctx, s, a.Slot, a.NodeID)
				if err != nil {
					return err
				}
				for j := range cands {
					if cands[j].ID == a.NodeID {
						cands[j].Load++
					}
				}
				r.log.Info("workload placed", "service", s.Project+"/"+s.Name, "slot", a.Slot, "workload_id", w.ID, "node_id", a.NodeID)
			}
		}
	}
	// Workloads of deleted services.
	for _, w := range wls {
		if !live[w.ServiceID] {
			if err := r.cfg.Catalog.RemoveWorkload(ctx, w.ID); err != nil {
				return err
			}
			r.log.Info("workload removed", "service", w.Project+"/"+w.Service, "reason", "service deleted", "workload_id", w.ID)
		}
	}
	return nil
}

// admit asks the deploy hook about one placement and logs a refusal.
func (r *Reconciler) admit(ctx context.Context, s *services.Service, slot int, nodeID string, ns []nodes.Node) (bool, error) {
	var n *nodes.Node
	for i := range ns {
		if ns[i].ID == nodeID {
			n = &ns[i]
		}
	}
	if n == nil {
		return false, nil
	}
	ok, reasons, err := r.cfg.Admit.AdmitDeploy(ctx, s, slot, n)
	if err != nil {
		r.log.Warn("deploy not admitted: policy unavailable", "service", s.Project+"/"+s.Name, "slot", slot, "err", err)
		return false, nil
	}
	if !ok {
		r.log.Warn("deploy denied by policy", "service", s.Project+"/"+s.Name, "slot", slot, "node_id", nodeID, "reasons", strings.Join(reasons, "; "))
	}
	return ok, nil
}

func (r *Reconciler) desire(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload) error {
	byID := map[string]*services.Service{}
	for i := range svcs {
		byID[svcs[i].ID] = &svcs[i]
	}
	perNode := map[string][]services.Workload{}
	for _, w := range wls {
		perNode[w.NodeID] = append(perNode[w.NodeID], w)
	}
	var errs []error
	for i := range ns {
		n := &ns[i]
		if n.Status == nodes.StatusRemoved {
			continue
		}
		spec := BuildSpec(n, perNode[n.ID], byID)
		raw, err := json.Marshal(spec)
		if err != nil {
			return fmt.Errorf("marshal desired state: %w", err)
		}
		sum := sha256.Sum256(raw)
		rev, changed, err := r.cfg.Nodes.SetDesired(ctx, n, hex.EncodeToString(sum[:]), string(raw))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if changed {
			r.log.Info("desired state updated", "node_id", n.ID, "rev", rev, "workloads", len(spec.Workloads))
		}
		if r.cfg.Pusher != nil {
			r.cfg.Pusher.Push(ctx, n.ID)
		}
	}
	return errors.Join(errs...)
}

// BuildSpec returns the desired spec of node n holding workloads wls, whose
// services are in svcs by id. Workloads and routes are sorted, so the same
// input gives the same bytes.
func BuildSpec(n *nodes.Node, wls []services.Workload, svcs map[string]*services.Service) node.Spec {
	spec := node.Spec{Workloads: []node.WorkloadSpec{}, Routes: []node.RouteSpec{}, Network: node.Network{Address: n.Address}}
	routed := map[string][]string{}
	for _, w := range wls {
		s := svcs[w.ServiceID]
		if s == nil {
			continue
		}
		spec.Workloads = append(spec.Workloads, node.WorkloadSpec{
			WorkloadID: w.ID, ProjectID: s.ProjectID, Project: s.Project, ServiceID: s.ID, Service: s.Name,
			Slot: w.Slot, Driver: "process", BundleDigest: s.BundleDigest, Command: s.Command, Env: s.Env,
			Port: s.Port, DesiredStatus: node.DesiredRunning,
			HealthCheck: node.HealthCheck{Path: s.HealthCheck.Path, IntervalS: s.HealthCheck.IntervalS, TimeoutS: s.HealthCheck.TimeoutS, Failures: s.HealthCheck.Failures},
		})
		for _, d := range s.Domains {
			routed[d+"\x00"+s.ID] = append(routed[d+"\x00"+s.ID], w.ID)
		}
	}
	sort.Slice(spec.Workloads, func(i, j int) bool { return spec.Workloads[i].WorkloadID < spec.Workloads[j].WorkloadID })
	for k, ids := range routed {
		host, svc, _ := strings.Cut(k, "\x00")
		sort.Strings(ids)
		spec.Routes = append(spec.Routes, node.RouteSpec{Hostname: host, ServiceID: svc, WorkloadIDs: ids, TLSMode: "none"})
	}
	sort.Slice(spec.Routes, func(i, j int) bool { return spec.Routes[i].Hostname < spec.Routes[j].Hostname })
	return spec
}

func (r *Reconciler) route(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload) error {
	nodeAddr := map[string]string{}
	for _, n := range ns {
		nodeAddr[n.ID] = n.Address
	}
	in := routes.Input{}
	for _, s := range svcs {
		in.Services = append(in.Services, routes.Service{ID: s.ID, Project: s.Project, Name: s.Name, Domains: s.Domains})
	}
	for _, w := range wls {
		in.Workloads = append(in.Workloads, routes.Workload{ID: w.ID, ServiceID: w.ServiceID, NodeID: w.NodeID, NodeAddress: nodeAddr[w.NodeID],
			Address: w.Address, ObservedStatus: w.ObservedStatus, Health: w.Health})
	}
	t, err := r.cfg.Compiler.Compile(ctx, in)
	by := describe(r.cfg.Compiler)
	r.mu.Lock()
	if err != nil {
		r.routeErr, r.routeErrAt, r.failing = err, time.Now().UTC(), by
	} else {
		r.routeErr, r.failing = nil, ""
	}
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("compile routes (keeping the last good table): %w", err)
	}
	digest := t.Digest()
	r.mu.Lock()
	same := digest == r.routeDigest
	if !same {
		r.routeRev++
	}
	t.Revision = r.routeRev
	r.compiler = by
	if !same {
		r.table = t
		r.compiledAt = time.Now().UTC()
	}
	r.mu.Unlock()
	if same || r.cfg.Routes == nil {
		return nil
	}
	if err := r.cfg.Routes.SetRoutes(ctx, t); err != nil {
		return fmt.Errorf("push route table: %w", err)
	}
	r.mu.Lock()
	r.routeDigest = digest
	r.mu.Unlock()
	r.log.Info("route table pushed", "revision", t.Revision, "routes", len(t.Routes), "digest", digest[:12])
	return nil
}
