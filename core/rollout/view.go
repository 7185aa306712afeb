package rollout

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// Views answers the read-only runtime views (docs/reconciliation.md section 11): they write
// nothing and derive only what the stored rows say.
type Views struct {
	Store   *Store
	Catalog *services.Catalog
	Nodes   *nodes.Registry
}

// Slots returns a service's slots in replica order, as the workloads view answers them.
func (v Views) Slots(ctx context.Context, svc *services.Service) ([]client.SlotView, error) {
	set, err := v.Store.Slots(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	spec, err := v.Store.Spec(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	rows := slices.Clone(set.Slots)
	slices.SortFunc(rows, func(a, b SlotRow) int { return compareReplica(a.Replica, b.Replica) })
	applied := map[string]int64{}
	out := make([]client.SlotView, 0, len(rows))
	for _, row := range rows {
		sv := client.SlotView{ServiceID: svc.ID, Replica: row.Replica, NodeID: row.NodeID, WorkloadID: row.WorkloadID,
			AttemptID: row.Attempt.ID, Disposition: slots.Generation(row.Generation).String(),
			TerminalReceipts: max(row.Acked-int(slots.GenRun), 0), Delivery: "undelivered"}
		if len(row.Ancestors) > 0 {
			sv.PreviousWorkloadID = workloadID(svc.ID, row.Replica, row.Ancestors[0].ID)
		}
		if key, ok := currentKey(svc, spec, row); ok {
			sv.Current = key == row.Attempt.Key
		}
		w, err := v.Catalog.GetWorkload(ctx, row.WorkloadID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if w != nil {
			o := observation(w, spec)
			sv.Observation = client.SlotObservation{Phase: string(o.Phase), Ready: o.Phase == slots.PhaseRunning && o.Ready, ObservedAt: w.ObservedAt}
			if o.Phase == slots.PhaseFailed {
				sv.Observation.Message = w.Message
			}
			sv.LastFailure = APIFailure(SlotFailure(row, w))
			rev, ok := applied[row.NodeID]
			if !ok {
				if n, err := v.Nodes.Get(ctx, row.NodeID); err == nil {
					rev = n.AppliedRev
				}
				applied[row.NodeID] = rev
			}
			if w.StatusRev > 0 && rev >= w.StatusRev {
				sv.Delivery = "delivered"
			}
		} else {
			sv.LastFailure = APIFailure(row.LastFailure)
			if row.Acked == row.Generation {
				sv.Delivery = "delivered"
			}
		}
		out = append(out, sv)
	}
	return out, nil
}

// currentKey recomputes the desired attempt key of row's replica on its node.
func currentKey(svc *services.Service, spec *SpecDoc, row SlotRow) (string, bool) {
	if spec == nil || svc.Deleting {
		return "", false
	}
	key, err := desiredKey(svc, spec, Platform)
	return key, err == nil
}

// Rollout returns how far svc is on its way to its current desire.
func (v Views) Rollout(ctx context.Context, svc *services.Service) (*client.RolloutStatus, error) {
	out := &client.RolloutStatus{Service: svc.Project + "/" + svc.Name, Revision: svc.Revision, Release: svc.Release().Digest(), Deleting: svc.Deleting}
	if svc.Previous != nil {
		out.PreviousRelease = svc.Previous.Release().Digest()
	}
	spec, err := v.Store.Spec(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	if spec != nil {
		out.SpecRevision = spec.Revision
		if spec.Spec.Placement.Mode == slots.PlacementScheduled && !spec.Spec.Hold && !svc.Deleting {
			out.Desired = spec.Spec.Replicas.Total
		}
	}
	if vd, err := v.VerdictOf(ctx, svc); err != nil {
		return nil, err
	} else if vd != nil {
		out.Verdict = *vd
	}
	rows, err := v.Slots(ctx, svc)
	if err != nil {
		return nil, err
	}
	desired := 0
	if !svc.Deleting {
		out.WaitingOn = waitingOn(rows, out.Verdict)
	}
	for _, r := range rows {
		if r.Disposition != "run" {
			continue
		}
		desired++
		switch {
		case r.Current && r.Observation.Ready:
			out.Updated++
		case !r.Current:
			out.Outdated++
		}
	}
	if spec != nil && spec.Spec.Placement.Mode != slots.PlacementScheduled && !spec.Spec.Hold && !svc.Deleting {
		out.Desired = desired
	}
	return out, nil
}

// waitingOn returns what the rollout waits on (nil: nothing): the first slot that runs the
// current attempt and is not ready, else the first slot of any other kind that waits. While a
// rollout surges, a replica's incumbent is outdated until its successor is ready: the successor
// is what it waits on. The replica is named without its second slot name's "~".
func waitingOn(rows []client.SlotView, v client.Verdict) *client.SlotWait {
	var first *client.SlotWait
	for _, r := range rows {
		w := waitOf(r, v)
		if w == nil {
			continue
		}
		w.Replica = slots.BaseReplica(w.Replica)
		if r.Current && r.Disposition == "run" {
			return w
		}
		if first == nil {
			first = w
		}
	}
	return first
}

// waitOf returns what slot r waits on under verdict v, nil when r runs the current attempt
// ready. A waiting or refused verdict's reason is the slot's when the slot failed or is not
// ready; otherwise the slot's own state says it.
func waitOf(r client.SlotView, v client.Verdict) *client.SlotWait {
	if r.Disposition == "run" && r.Current && r.Observation.Ready {
		return nil
	}
	w := &client.SlotWait{Replica: r.Replica, NodeID: r.NodeID, WorkloadID: r.WorkloadID, LastFailure: r.LastFailure}
	switch {
	case r.Disposition == "stop":
		w.Reason = "stopping"
	case r.Disposition == "remove":
		w.Reason = "removing"
	case !r.Current:
		w.Reason = "outdated"
	case (v.State == string(slots.Waiting) || v.State == string(slots.Refused)) && v.Reason != "":
		w.Reason = v.Reason
	case r.Observation.Phase == string(slots.PhaseRunning):
		w.Reason = "not ready"
	case r.Observation.Phase == string(slots.PhaseFailed):
		w.Reason = "failed"
	default:
		w.Reason = "starting"
	}
	return w
}

// APIFailure returns f as the API shows it, nil for nil.
func APIFailure(f *services.Failure) *client.Failure {
	if f == nil {
		return nil
	}
	return &client.Failure{Kind: f.Kind, ExitCode: f.ExitCode, Signal: f.Signal, ProbeURL: f.ProbeURL, ProbeStatus: f.ProbeStatus,
		Message: f.Message, At: f.At, Count: f.Count}
}

// VerdictOf returns the verdict of svc as the API shows it: refused(policy: <module>: <reason>)
// while the latest unattended change to it was refused by policy and it has not changed since,
// converging for a service no sweep decided yet, nil for a deleting one without a verdict. A stored
// verdict decided over an older revision of the service (a release change, which leaves the
// spec revision as it is) or of its spec reads as converging until the next sweep decides again.
func (v Views) VerdictOf(ctx context.Context, svc *services.Service) (*client.Verdict, error) {
	out, err := v.verdictOf(ctx, svc)
	if err != nil {
		return nil, err
	}
	return v.withRefusal(ctx, svc, out)
}

func (v Views) verdictOf(ctx context.Context, svc *services.Service) (*client.Verdict, error) {
	d, err := v.Store.Verdict(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	if d == nil {
		// Right after an apply no sweep has decided yet: the service is on its way.
		if svc.Deleting {
			return nil, nil
		}
		out := &client.Verdict{State: string(slots.Converging), ChangedAt: svc.UpdatedAt}
		if spec, err := v.Store.Spec(ctx, svc.ID); err != nil {
			return nil, err
		} else if spec != nil {
			out.SpecRevision = spec.Revision
		}
		return out, nil
	}
	spec, err := v.Store.Spec(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	out := &client.Verdict{SpecRevision: d.Verdict.SpecRevision, State: string(d.Verdict.State), Reason: string(d.Verdict.Reason), ChangedAt: d.ChangedAt}
	if d.ServiceRevision != svc.Revision || spec != nil && spec.Revision != d.Verdict.SpecRevision {
		out.State, out.Reason = string(slots.Converging), ""
		if spec != nil {
			out.SpecRevision = spec.Revision
		}
	}
	return out, nil
}

// withRefusal returns out, or the refusal of the latest change to svc a policy refused with no
// caller to answer while svc is still at the revision it was judged against
// (refused(policy: <module>: <reason>), docs/deploy.md).
func (v Views) withRefusal(ctx context.Context, svc *services.Service, out *client.Verdict) (*client.Verdict, error) {
	if svc.Deleting {
		return out, nil
	}
	r, err := v.Store.Refusal(ctx, svc.ID)
	if err != nil || r == nil || r.ServiceRevision != svc.Revision {
		return out, err
	}
	var specRev int64
	if out != nil {
		specRev = out.SpecRevision
	}
	vd := r.Verdict(specRev)
	return &client.Verdict{SpecRevision: specRev, State: string(vd.State), Reason: string(vd.Reason), ChangedAt: r.At}, nil
}

// Annotate fills in what the API shows of svc beyond its document: the verdict, and the
// replica count an operator spec of scheduled placement states (it owns the count then).
func (v Views) Annotate(ctx context.Context, svc *services.Service, out *client.Service) error {
	var err error
	if out.Verdict, err = v.VerdictOf(ctx, svc); err != nil {
		return err
	}
	spec, err := v.Store.Spec(ctx, svc.ID)
	if err != nil {
		return err
	}
	if spec != nil && spec.Source == SourceOperator && spec.Spec.Placement.Mode == slots.PlacementScheduled {
		out.Replicas = spec.Spec.Replicas.Total
	}
	return nil
}

// compareReplica orders "<i>" numerically before "<node>.<i>" by node, then index.
func compareReplica(a, b string) int {
	pa, pb := lastDot(a), lastDot(b)
	na, nb := "", ""
	if pa >= 0 {
		na = a[:pa]
	}
	if pb >= 0 {
		nb = b[:pb]
	}
	if c := strings.Compare(na, nb); c != 0 {
		return c
	}
	return replicaIndex(a) - replicaIndex(b)
}
