package rollout

import (
	"context"
	"fmt"
	"slices"

	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// RebalancePlan is what a rebalance of one service would do ([Views.Rebalance]).
type RebalancePlan struct {
	// Moves are the replica moves that improve the spread, in replica order (empty: none).
	Moves []placement.Move
	// Before and After are the spread scores of the replicas now and after the moves.
	Before, After placement.SpreadScore
	// Pending are the moves of the service's stored rebalance not carried out yet: the replica
	// still stands on the move's From.
	Pending []services.RebalanceMove
	// Note says why the service has nothing to rebalance ("" when it may have).
	Note string
}

// Recorded returns the plan's moves as the service records them.
func (p *RebalancePlan) Recorded() []services.RebalanceMove {
	out := make([]services.RebalanceMove, 0, len(p.Moves))
	for _, m := range p.Moves {
		out = append(out, services.RebalanceMove{Replica: m.Replica, From: m.From, To: m.To})
	}
	return out
}

// NeedsWrite reports whether the plan differs from what the service already carries: its
// moves are not exactly the stored moves still pending. A rebalance that would record what
// is stored, or no moves over no pending ones, writes nothing (idempotent).
func (p *RebalancePlan) NeedsWrite() bool {
	return !slices.Equal(p.Recorded(), p.Pending)
}

// Result returns the plan as the API answers it, for svc.
func (p *RebalancePlan) Result(svc *services.Service) *client.RebalanceResult {
	out := &client.RebalanceResult{Service: svc.Project + "/" + svc.Name, Moves: []client.RebalanceMove{}, Note: p.Note,
		Before: client.SpreadScore(p.Before), After: client.SpreadScore(p.After), Revision: svc.Revision}
	for _, m := range p.Moves {
		out.Moves = append(out.Moves, client.RebalanceMove(m))
	}
	if svc.Rebalance != nil {
		out.Generation = svc.Rebalance.Generation
	}
	return out
}

// Rebalance plans a rebalance of svc (docs/placement.md section 7): over the nodes and
// workloads as they are now, the replicas that stand on a node and keep it (not those on a
// draining node or one they no longer satisfy) are given to [placement.Rebalance], which moves
// only replicas whose move lowers the spread score, never to a node that fails feasibility
// (cordoned, draining, full, ...). A stateful service (its replica follows its lease) and a
// pinned or every-node service have nothing to rebalance. It writes nothing.
func (v Views) Rebalance(ctx context.Context, svc *services.Service) (*RebalancePlan, error) {
	plan := &RebalancePlan{}
	if svc.Stateful() {
		plan.Note = "stateful: the replica runs where the service's lease is held; the lease moves only by the lease rules"
		return plan, nil
	}
	doc, err := v.Store.SpecInForce(ctx, svc)
	if err != nil {
		return nil, err
	}
	spec := doc.Spec
	if spec.Placement.Mode != slots.PlacementScheduled {
		plan.Note = fmt.Sprintf("placement %s: the runtime spec names the nodes; nothing to rebalance", spec.Placement.Mode)
		return plan, nil
	}
	in, err := v.placementInputs(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	ns, byID, use := in.nodes, in.byID, in.use
	placed := map[string]string{}
	req, _ := request(&view{svc: svc, spec: &SpecDoc{Spec: spec}, set: in.set}, ns, byID, use, placed, nil, nil)
	if svc.Rebalance != nil {
		for _, m := range svc.Rebalance.Moves {
			if placed[m.Replica] == m.From && m.To != m.From {
				plan.Pending = append(plan.Pending, m)
			}
		}
	}
	cands := placement.Candidates(ns, use, svc.Runtime)
	plan.Before = placement.SpreadOf(req, cands)
	plan.Moves = placement.Rebalance(req, cands)
	after := req
	after.Existing = make(map[string]string, len(req.Existing))
	for r, id := range req.Existing {
		after.Existing[r] = id
	}
	for _, m := range plan.Moves {
		after.Existing[m.Replica] = m.To
	}
	plan.After = placement.SpreadOf(after, cands)
	return plan, nil
}
