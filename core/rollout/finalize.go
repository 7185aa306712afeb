package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/slots"
)

// finalize is the deletion finalizer of one deleting service (docs/reconciliation.md section
// 9): while a slot has not reached its removal with both receipts it waits
// (slot-settlement-pending); then it removes the slots, their workloads, the spec, the verdict
// and the service. It reports whether the service is gone.
func (p *Producer) finalize(ctx context.Context, v *view) (bool, error) {
	rows := make([]slots.Slot, 0, len(v.set.Slots))
	for _, row := range v.set.Slots {
		rows = append(rows, slotOf(row, nil, nil))
	}
	if wait := slots.SettlementPending(rows); wait != "" {
		return false, nil
	}
	for _, row := range v.set.Slots {
		if err := p.cfg.Catalog.RemoveWorkload(ctx, row.WorkloadID); err != nil {
			return false, err
		}
	}
	if err := p.cfg.Store.forget(ctx, v.svc.ID); err != nil {
		return false, err
	}
	if err := p.cfg.Catalog.DeleteServiceByID(ctx, v.svc.ID); err != nil {
		return false, err
	}
	p.log.Info("service deleted: every slot settled", "service", v.svc.Project+"/"+v.svc.Name, "service_id", v.svc.ID, "slots", len(v.set.Slots))
	return true, nil
}

// pruneSettled drops from the slot set the rows the plan found settled (removed with both
// receipts and no longer desired), with one compare-and-set; a conflict leaves them to the next
// sweep.
func (p *Producer) pruneSettled(ctx context.Context, v *view, settled []string) (bool, error) {
	if len(settled) == 0 || v.svc != nil && v.svc.Deleting {
		return false, nil
	}
	rows := slices.DeleteFunc(slices.Clone(v.set.Slots), func(r SlotRow) bool {
		return slices.Contains(settled, r.Replica) && r.Generation == int(slots.GenRemove) && r.Acked == int(slots.GenRemove)
	})
	if len(rows) == len(v.set.Slots) {
		return false, nil
	}
	err := p.cfg.Store.writeSlots(ctx, v.set, rows)
	if errors.Is(err, slots.ErrConflict) {
		return false, nil
	}
	return err == nil, err
}

// ReasonSlotSettlementPending is the wait of a withdrawn node's retirement while a slot on it
// has not settled.
const ReasonSlotSettlementPending = string(slots.ReasonSlotSettlementPending)

// UnsettledOn counts, per node id, the slots that stand on it and have not settled.
func (s *Store) UnsettledOn(ctx context.Context) (map[string]int, error) {
	var sets []SlotSet
	if err := s.st.View().Find(ctx, s.slots, nil, &sets); err != nil {
		return nil, fmt.Errorf("list slot sets: %w", err)
	}
	out := map[string]int{}
	for _, set := range sets {
		for _, row := range set.Slots {
			if row.Generation != int(slots.GenRemove) || row.Acked != int(slots.GenRemove) {
				out[row.NodeID]++
			}
		}
	}
	return out, nil
}

// retirements finishes the retirement of every retiring node that no slot stands on any more
// (docs/reconciliation.md section 10): a withdrawn node once its slots were stopped and removed
// against its receipts, a lost node at once (its slots were released by this sweep).
func (p *Producer) retirements(ctx context.Context, ns []nodes.Node) error {
	var retiring []*nodes.Node
	for i := range ns {
		if r := ns[i].Retirement; r != nil && r.State == nodes.RetirementRetiring {
			retiring = append(retiring, &ns[i])
		}
	}
	if len(retiring) == 0 {
		return nil
	}
	on, err := p.cfg.Store.UnsettledOn(ctx)
	if err != nil {
		return err
	}
	for _, n := range retiring {
		if on[n.ID] > 0 && n.Retirement.Disposition == nodes.DispositionWithdrawn {
			p.log.Info("node retirement waits", "node_id", n.ID, "wait", ReasonSlotSettlementPending, "slots", on[n.ID])
			continue
		}
		if _, err := p.cfg.Nodes.FinishRetirement(ctx, n.ID); err != nil {
			return err
		}
		p.log.Info("node retired", "node_id", n.ID, "disposition", n.Retirement.Disposition)
		if p.cfg.OnRetired != nil {
			p.cfg.OnRetired(ctx, n.ID)
		}
	}
	return nil
}

// RetirementWait returns what a node's retirement waits on ("" when nothing) and the number of
// unsettled slots on it.
func (v Views) RetirementWait(ctx context.Context, n *nodes.Node) (string, int, error) {
	if n.Retirement == nil || n.Retirement.State != nodes.RetirementRetiring {
		return "", 0, nil
	}
	on, err := v.Store.UnsettledOn(ctx)
	if err != nil {
		return "", 0, err
	}
	if on[n.ID] > 0 && n.Retirement.Disposition == nodes.DispositionWithdrawn {
		return ReasonSlotSettlementPending, on[n.ID], nil
	}
	return "", on[n.ID], nil
}
