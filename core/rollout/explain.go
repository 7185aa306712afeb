package rollout

import (
	"context"
	"fmt"
	"strconv"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// Placement explains where each replica of svc stands or would go and why each node was taken
// or refused, with the decider the rollout places with ([placement.Choose]) over the nodes and
// the workloads as they are now (docs/placement.md section 6). A replica that stands on a node
// still meeting the service's region and selector is shown there (standing), with the verdicts
// the decider would give each node if it were placed again; the others are decided as the next
// sweep would. It writes nothing.
func (v Views) Placement(ctx context.Context, svc *services.Service) (*client.PlacementExplanation, error) {
	out := &client.PlacementExplanation{Service: svc.Project + "/" + svc.Name, Replicas: []client.ReplicaPlacement{}}
	doc, err := v.Store.SpecInForce(ctx, svc)
	if err != nil {
		return nil, err
	}
	spec := doc.Spec
	if spec.Placement.Mode != slots.PlacementScheduled {
		out.Note = fmt.Sprintf("placement %s: the runtime spec names the nodes; the decider chooses none", spec.Placement.Mode)
		return out, nil
	}
	in, err := v.placementInputs(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	total := spec.Replicas.Total
	if svc.Stateful() {
		total = min(total, 1)
		out.Note = "stateful: the replica runs where the service's lease is held; the lease moves only by the lease rules"
	}
	ns, byID, use := in.nodes, in.byID, in.use
	r := &view{svc: svc, spec: &SpecDoc{Spec: spec}, set: in.set}
	placed := map[string]string{}
	req, cands := request(r, ns, byID, use, placed, nil, nil)
	if cands == nil {
		cands = placement.Candidates(ns, use, svc.Runtime)
	}
	req.Explain = true
	own := placement.ReplicaResources(svc)
	next := placement.Choose(req, cands) // the replicas the next sweep places
	byReplica := map[string]placement.Choice{}
	for _, c := range next.Choices {
		byReplica[c.Replica] = c
	}
	for i := 0; i < total; i++ {
		rep := strconv.Itoa(i)
		c, ok := byReplica[rep]
		if at := placed[rep]; at != "" {
			// Decide it again as if it stood nowhere: its node without its resources, the other
			// replicas where they are.
			again := req
			again.Place, again.Existing = []string{rep}, map[string]string{}
			for k, id := range req.Existing {
				if k != rep {
					again.Existing[k] = id
				}
			}
			without := make([]placement.Node, len(cands))
			copy(without, cands)
			for j := range without {
				if without[j].ID == at {
					without[j].Used = subtract(without[j].Used, own)
				}
			}
			c, ok = placement.Choose(again, without).Choices[0], true
			c.NodeID, c.Existing = at, true
		}
		if !ok {
			continue
		}
		rp := client.ReplicaPlacement{Replica: rep, NodeID: c.NodeID, Standing: c.Existing, Reason: c.Reason}
		for _, nv := range c.Considered {
			rp.Considered = append(rp.Considered, client.NodeVerdict{NodeID: nv.NodeID, Code: string(nv.Code), Text: nv.Text})
		}
		out.Replicas = append(out.Replicas, rp)
	}
	return out, nil
}

// subtract returns r - o.
func subtract(r, o placement.Resources) placement.Resources {
	return r.Add(o.Times(-1))
}

// placementInputs is what explaining a service's placement and planning its rebalance read
// besides the service and its spec, as they are now.
type placementInputs struct {
	set   *SlotSet               // the service's slots
	nodes []nodes.Node           // every node
	byID  map[string]*nodes.Node // nodes by id
	use   *placement.Usage       // the usage of every service and workload
}

// placementInputs reads the slots of service serviceID, the nodes, and the services and
// workloads whose usage the decider weighs.
func (v Views) placementInputs(ctx context.Context, serviceID string) (*placementInputs, error) {
	set, err := v.Store.Slots(ctx, serviceID)
	if err != nil {
		return nil, err
	}
	ns, err := v.Nodes.List(ctx)
	if err != nil {
		return nil, err
	}
	svcs, err := v.Catalog.ListServices(ctx, nil)
	if err != nil {
		return nil, err
	}
	wls, err := v.Catalog.ListWorkloads(ctx, nil)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*nodes.Node, len(ns))
	for i := range ns {
		byID[ns[i].ID] = &ns[i]
	}
	return &placementInputs{set: set, nodes: ns, byID: byID, use: placement.UsageOf(svcs, wls)}, nil
}
