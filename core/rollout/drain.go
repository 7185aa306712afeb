package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// Drain states of [client.NodeDrain].
const (
	DrainDraining = "draining"
	DrainDrained  = "drained"
)

// DrainProgress returns node n's drain as the API shows it, nil when n does not drain: what still
// has to leave it, in service and replica order. A replica is a slot of a scheduled service that
// stands on n and has not settled (the rollout places it elsewhere and removes it from n; slots of
// every-node and pinned services stay and are not listed); a lease is one n holds (leases, the
// authority, may be nil). now decides whether the deadline passed. It reads the store's view only.
func (v Views) DrainProgress(ctx context.Context, n *nodes.Node, leases *fencing.Authority, now time.Time) (*client.NodeDrain, error) {
	if !n.Draining() {
		return nil, nil
	}
	out := &client.NodeDrain{StartedAt: n.Drain.StartedAt, Deadline: n.Drain.Deadline, Remaining: []client.DrainItem{}}
	ids, err := v.Store.ServicesWithSlots(ctx)
	if err != nil {
		return nil, err
	}
	leased := map[string]bool{}
	for _, id := range ids {
		set, err := v.Store.Slots(ctx, id)
		if err != nil {
			return nil, err
		}
		var rows []SlotRow
		for _, row := range set.Slots {
			if row.NodeID == n.ID && (row.Generation != int(slots.GenRemove) || row.Acked != int(slots.GenRemove)) {
				rows = append(rows, row)
			}
		}
		if len(rows) == 0 {
			continue
		}
		spec, err := v.Store.Spec(ctx, id)
		if err != nil {
			return nil, err
		}
		svc, err := v.Catalog.GetServiceByID(ctx, id)
		if err != nil && !errors.Is(err, services.ErrServiceNotFound) {
			return nil, err
		}
		stateful := svc != nil && svc.Stateful()
		if !stateful && (spec == nil || spec.Spec.Placement.Mode != slots.PlacementScheduled) {
			continue // every-node and pinned replicas belong to the node: they stay
		}
		name := id
		if svc != nil {
			name = svc.Project + "/" + svc.Name
		}
		for _, row := range rows {
			it := client.DrainItem{Kind: "replica", Service: name, Replica: row.Replica, WorkloadID: row.WorkloadID}
			if stateful {
				it.Kind, it.LeaseID = "lease", fencing.LeaseID(id)
				leased[it.LeaseID] = true
			}
			out.Remaining = append(out.Remaining, it)
		}
	}
	if leases != nil {
		held, err := leases.HeldBy(ctx, n.ID)
		if err != nil {
			return nil, fmt.Errorf("read the leases of node %s: %w", n.ID, err)
		}
		for _, l := range held {
			if !leased[l.ID] && !l.Deleted {
				out.Remaining = append(out.Remaining, client.DrainItem{Kind: "lease", Service: l.ResourceID, LeaseID: l.ID})
			}
		}
	}
	slices.SortFunc(out.Remaining, func(a, b client.DrainItem) int {
		if c := strings.Compare(a.Service, b.Service); c != 0 {
			return c
		}
		return compareReplica(a.Replica, b.Replica)
	})
	out.State = DrainDraining
	if len(out.Remaining) == 0 {
		out.State = DrainDrained
	}
	out.Late = out.State == DrainDraining && n.Drain.Deadline != nil && now.After(*n.Drain.Deadline)
	return out, nil
}
