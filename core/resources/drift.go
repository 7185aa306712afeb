package resources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/store"
)

// metrics are the resource metrics (docs/resources.md section 5).
type metrics struct {
	drifts   *prometheus.CounterVec
	failures *prometheus.CounterVec
	reads    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		drifts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_resource_drifts_total",
			Help: "Reads of a declared resource that differed from what was applied, by type."}, []string{"type"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_resource_operation_failures_total",
			Help: "Failed attempts of resource operations, by type."}, []string{"type"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_resource_drift_reads_total",
			Help: "Reads of declared resources by the drift pass, by type and result (same, drifted, absent, error)."}, []string{"type", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.drifts, m.failures, m.reads)
	}
	return m
}

// interval is how often resources of typ are read: the type's declared interval, or the
// manager's default.
func (m *Manager) interval(typ string) time.Duration {
	if e, ok := m.cfg.Types.Lookup(typ); ok && e.Type.DriftInterval > 0 {
		return e.Type.DriftInterval
	}
	return m.cfg.DriftInterval
}

// jitter spreads the reads of one type over ±10 % of its interval, by the resource id, so that
// resources declared together are not all read in the same pass.
func jitter(id string, d time.Duration) time.Duration {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	frac := float64(h.Sum32()%2001)/10000 - 0.1 // -0.1 .. +0.1
	return d + time.Duration(float64(d)*frac)
}

// scheduleRead sets when the drift pass reads resource id next, from a read or apply at t.
func (m *Manager) scheduleRead(id, typ string, t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextRead[id] = t.Add(jitter(id, m.interval(typ)))
}

// due reports whether resource r is due for a drift read at now; a resource this process has
// not seen yet is scheduled from its last observation.
func (m *Manager) due(r *Resource, now time.Time) bool {
	m.mu.Lock()
	next, ok := m.nextRead[r.ID]
	m.mu.Unlock()
	if !ok {
		next = r.ObservedAt.Add(jitter(r.ID, m.interval(r.Type)))
		m.mu.Lock()
		m.nextRead[r.ID] = next
		m.mu.Unlock()
	}
	return !now.Before(next)
}

// DriftPass reads, through their providers, the applied resources that are due (at most
// ReadsPerPass), compares each Read with what was applied, and returns how many it read. A Read
// that differs marks the resource drifted with the difference as its reason, raises a
// resource.drifted event and counts berth_resource_drifts_total; a resource that says
// on_drift: reconcile then gets a new generation whose apply puts the spec back. A drifted
// resource read equal again is ready. It also repairs resources whose operation was never
// recorded (a crash between the write and the enqueue).
func (m *Manager) DriftPass(ctx context.Context) (int, error) {
	var all []Resource
	if err := m.cfg.Store.All(ctx, Collection, &all); err != nil {
		return 0, fmt.Errorf("resources: drift pass: %w", err)
	}
	now := m.cfg.Now()
	reads := 0
	for i := range all {
		r := &all[i]
		if ctx.Err() != nil {
			return reads, ctx.Err()
		}
		if (r.Status == StatusProgressing || r.Status == StatusDeleting) && r.OperationID == "" {
			kind := KindApply
			if r.Deleting {
				kind = KindDelete
			}
			if err := m.enqueue(ctx, r, kind); err != nil {
				m.cfg.Logger.Warn("resource operation not repaired", "resource", r.ID, "error", err)
			}
			continue
		}
		if r.AppliedGeneration != r.Generation || (r.Status != StatusReady && r.Status != StatusDrifted) || !m.due(r, now) {
			continue
		}
		if reads >= m.cfg.ReadsPerPass {
			break
		}
		reads++
		m.observe(ctx, r, now)
	}
	return reads, nil
}

// observe reads r once and records what the read found.
func (m *Manager) observe(ctx context.Context, r *Resource, now time.Time) {
	m.scheduleRead(r.ID, r.Type, now)
	prov, err := m.provider(r.Type)
	if err != nil {
		m.metrics.reads.WithLabelValues(r.Type, "error").Inc()
		return
	}
	// The secrets the spec refers to mask what the Read returns, as they masked the applied
	// state: the same value reads the same, a changed one shows as a difference, never as itself.
	spec, err := m.openSecrets(ctx, r)
	if err != nil {
		m.metrics.reads.WithLabelValues(r.Type, "error").Inc()
		m.cfg.Logger.Warn("resource drift read skipped", "resource", r.ID, "error", err)
		return
	}
	cur, err := readCurrent(ctx, prov, r)
	if err != nil {
		m.metrics.reads.WithLabelValues(r.Type, "error").Inc()
		m.cfg.Logger.Warn("resource drift read failed", "resource", r.ID, "error", spec.maskErr(err))
		return
	}
	var got json.RawMessage
	result := "absent"
	if cur != nil {
		got, err = spec.Mask(cur.Attributes)
		if err == nil {
			got, err = canonical(got)
		}
		if err != nil {
			m.metrics.reads.WithLabelValues(r.Type, "error").Inc()
			return
		}
		result = "drifted"
	}
	diff, err := Diff(r.AppliedJSON(), got)
	if err != nil {
		m.metrics.reads.WithLabelValues(r.Type, "error").Inc()
		return
	}
	if cur != nil && len(diff) == 0 {
		m.metrics.reads.WithLabelValues(r.Type, "same").Inc()
		if r.Status == StatusDrifted {
			m.setStatus(ctx, r, StatusReady, "", now)
		}
		return
	}
	m.metrics.reads.WithLabelValues(r.Type, result).Inc()
	reason := "drifted: " + strings.Join(diff, "; ")
	if cur == nil {
		reason = "drifted: the provider no longer has the resource"
	}
	if r.Status == StatusDrifted && r.Reason == reason && r.OnDrift != OnDriftReconcile {
		return // already reported
	}
	m.metrics.drifts.WithLabelValues(r.Type).Inc()
	rev, ok := m.setStatus(ctx, r, StatusDrifted, reason, now)
	if !ok {
		return
	}
	m.event(ctx, r, "resource.drifted", map[string]any{"difference": diff, "on_drift": r.OnDrift})
	if r.OnDrift != OnDriftReconcile {
		return
	}
	// Put it back: a new generation of the same spec, applied like any other.
	rev, err = m.cfg.Store.SetIfRevision(ctx, Collection, r.ID, rev, store.Fields{
		"generation": r.Generation + 1, "status": StatusProgressing, "updated_at": now.UTC()})
	if err != nil {
		if !errors.Is(err, store.ErrConflict) {
			m.cfg.Logger.Warn("resource reconcile not started", "resource", r.ID, "error", err)
		}
		return
	}
	next := *r
	next.Generation, next.Status, next.Revision = r.Generation+1, StatusProgressing, rev
	if err := m.enqueue(ctx, &next, KindApply); err != nil {
		m.cfg.Logger.Warn("resource reconcile not enqueued", "resource", r.ID, "error", err)
	}
}

// setStatus records status and reason on r when r is unchanged since it was listed, and returns
// its new revision and whether it did.
func (m *Manager) setStatus(ctx context.Context, r *Resource, status Status, reason string, now time.Time) (int64, bool) {
	set := store.Fields{"status": status, "reason": reason, "message": "", "observed_at": now.UTC(), "updated_at": now.UTC()}
	if status == StatusDrifted {
		set["drifts"] = r.Drifts + 1
	}
	rev, err := m.cfg.Store.SetIfRevision(ctx, Collection, r.ID, r.Revision, set)
	if err != nil {
		if !errors.Is(err, store.ErrConflict) {
			m.cfg.Logger.Warn("resource status not recorded", "resource", r.ID, "error", err)
		}
		return 0, false
	}
	return rev, true
}
