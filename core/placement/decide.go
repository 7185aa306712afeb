// Package placement owns the one placement decider of Berth ([Choose]: feasibility, then ranking,
// with a reason for every node; docs/placement.md), used by services, stateful lease grants and
// runner projects, and the runner projects' desired placements: one document per project, assigned
// to a runner node by reserving capacity on that node (docs/runner-protocol.md section 4).
package placement

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/berthhq/berth/core/runners"
)

// Mode is a placement's data-mobility contract.
type Mode string

// Placement modes.
const (
	// Portable placements may be reassigned when their node expires or is revoked; the default.
	Portable Mode = "portable"
	// Stateful placements keep the node selected first, across releases, stopped state, heartbeat
	// expiry and credential revocation; an unavailable node makes the placement unavailable.
	Stateful Mode = "stateful"
)

// RunState is the desired run state.
type RunState string

// Run states.
const (
	Running RunState = "running"
	Stopped RunState = "stopped"
)

// Status says where a placement stands.
type Status string

// Placement statuses.
const (
	Waiting     Status = "waiting"     // no node fits; retried on every pass
	Assigned    Status = "assigned"    // reserved on NodeID
	Unavailable Status = "unavailable" // stateful, and its node is offline, revoked or gone
)

// Errors of the decider.
var (
	ErrModeImmutable = errors.New("berth: placement_mode cannot change")
	// ErrProviderImmutable is returned by [Next] for a change of provider placement after the first
	// generation.
	ErrProviderImmutable = errors.New("berth: provider placement is chosen when the placement is created and cannot change")
	// ErrDeleting is returned by SetDesired for a placement whose project is being deleted.
	ErrDeleting = errors.New("berth: the project's placement is being deleted")
	// ErrNotProvider is returned for a runtime or lifecycle request on a placement that is not a
	// provider placement, or has no node.
	ErrNotProvider = errors.New("berth: the project is not placed with provider placement on a node")
	ErrPinned      = errors.New("berth: a pinned placement's region and requirements cannot change")
	ErrStale       = errors.New("berth: observation is older than the recorded one or not from the assigned node")
	ErrInvalid     = errors.New("berth: invalid desired placement")
)

// Requirements restrict the nodes a placement may use; stored with the desired state and evaluated
// at every placement.
type Requirements struct {
	// Endpoint reports whether the node must have registered a private provider origin.
	Endpoint bool `bson:"endpoint" json:"endpoint"`
	// Labels must be present on the node with exactly these values.
	Labels map[string]string `bson:"labels,omitempty" json:"labels,omitempty"`
}

func (r Requirements) equal(o Requirements) bool {
	return r.Endpoint == o.Endpoint && maps.Equal(r.Labels, o.Labels)
}

// Observation is what the assigned node reports it runs.
type Observation struct {
	Generation int64     `bson:"generation" json:"generation"`
	Release    string    `bson:"release" json:"release"`
	State      RunState  `bson:"state" json:"state"`
	NodeID     string    `bson:"node_id" json:"node_id"`
	At         time.Time `bson:"at" json:"at"`
}

// Placement is a document in collection "placements", keyed by project id.
type Placement struct {
	ProjectID     string       `bson:"_id" json:"project_id"`
	Generation    int64        `bson:"generation" json:"generation"`
	Release       string       `bson:"release" json:"release"`
	State         RunState     `bson:"state" json:"state"`
	Mode          Mode         `bson:"mode" json:"placement_mode"`
	Region        string       `bson:"region" json:"region,omitempty"`
	CapacityUnits int          `bson:"capacity_units" json:"capacity_units"`
	Requirements  Requirements `bson:"requirements" json:"node_requirements"`
	NodeID        string       `bson:"node_id" json:"node_id,omitempty"`
	// Pinned reports whether a stateful placement has selected its node (for good).
	Pinned bool `bson:"pinned" json:"pinned"`
	// Provider reports whether the project was created with provider placement: its runner runs
	// the runtime and receives it through the runtime call (docs/runner-protocol.md section 6.2).
	Provider bool `bson:"provider" json:"provider"`
	// Deleting reports whether the project-delete workflow holds the placement: no new generation,
	// no new assignment.
	Deleting bool `bson:"deleting" json:"deleting,omitempty"`
	// Enqueued is the generation whose reconcile operation was last enqueued, so the placement pass
	// does not enqueue it again.
	Enqueued  int64        `bson:"enqueued" json:"-"`
	Status    Status       `bson:"status" json:"status"`
	Observed  *Observation `bson:"observed,omitempty" json:"observed,omitempty"`
	UpdatedAt time.Time    `bson:"updated_at" json:"updated_at"`
	Revision  int64        `bson:"revision" json:"revision"`
}

func units(n int) Resources { return Resources{Units: int64(n)} }

// Request returns what p asks of a runner node: its capacity units (at least 1), region,
// labels and endpoint, for its one replica "0".
func (p *Placement) Request() Request {
	return Request{Service: p.ProjectID, Resources: units(max(p.CapacityUnits, 1)),
		Constraints: Constraints{Region: p.Region, NodeSelector: p.Requirements.Labels, Endpoint: p.Requirements.Endpoint},
		Place:       []string{"0"}}
}

// RunnerNode returns runner node n at now as the decider sees it: its capacity units in
// [Resources.Units], unavailable while revoked, draining or offline.
func RunnerNode(n *runners.Node, now time.Time) Node {
	why := ""
	switch {
	case n.Revoked:
		why = "revoked"
	case n.Draining:
		why = "draining"
	case n.Offline(now):
		why = "offline (heartbeat expired)"
	}
	return Node{ID: n.ID, Region: n.Region, Labels: n.Labels, Capacity: units(n.Capacity), Used: units(n.Reserved),
		Unavailable: why, Endpoint: n.Endpoint != ""}
}

// fits returns the ledger check of p's reservations at now: the decider's feasibility
// ([Feasible]) of the node as the ledger holds it.
func (p *Placement) fits(now time.Time) runners.Fits {
	req := p.Request()
	return func(n *runners.Node, reserved int, r runners.Reservation) bool {
		node := RunnerNode(n, now)
		node.Used = units(reserved)
		q := req
		q.Resources = units(max(r.Units, 1))
		code, _ := Feasible(q, node)
		return code == ""
	}
}

// DesiredRequest is a new desired generation. Nil pointers inherit the previous generation's value
// (mode portable, no region, 1 unit and no requirements for the first).
type DesiredRequest struct {
	Release       string
	State         RunState
	Mode          *Mode
	Region        *string
	CapacityUnits *int
	Requirements  *Requirements
	// Provider selects provider placement; only the first generation may set it.
	Provider *bool
}

// Next decides the placement after req on cur (nil: none yet): the generation increases by one;
// mode, region, capacity units and requirements are inherited when omitted. Errors: [ErrInvalid];
// [ErrModeImmutable] for a mode change; [ErrPinned] for a change of region (or, for a stateful
// placement, of requirements) after its node was selected. A portable placement whose region or
// requirements change is released from its node and placed again.
func Next(cur *Placement, req DesiredRequest, now time.Time) (Placement, error) {
	var p Placement
	if cur != nil {
		p = *cur
	} else {
		p = Placement{Mode: Portable, CapacityUnits: 1, Status: Waiting}
	}
	if req.State == "" {
		req.State = Running
	}
	if req.State != Running && req.State != Stopped {
		return p, fmt.Errorf("%w: state must be running or stopped", ErrInvalid)
	}
	if req.Release == "" || len(req.Release) > 200 {
		return p, fmt.Errorf("%w: release is required (at most 200 bytes)", ErrInvalid)
	}
	if req.Mode != nil {
		if *req.Mode != Portable && *req.Mode != Stateful {
			return p, fmt.Errorf("%w: placement_mode must be portable or stateful", ErrInvalid)
		}
		if cur != nil && *req.Mode != cur.Mode {
			return p, ErrModeImmutable
		}
		p.Mode = *req.Mode
	}
	if cur != nil && cur.Deleting {
		return p, ErrDeleting
	}
	if req.Provider != nil {
		if cur != nil && *req.Provider != cur.Provider {
			return p, ErrProviderImmutable
		}
		p.Provider = *req.Provider
	}
	selected := cur != nil && cur.NodeID != ""
	if req.Region != nil && *req.Region != p.Region {
		if selected && (p.Mode == Stateful || p.Pinned) {
			return p, ErrPinned
		}
		p.Region = *req.Region
		p.NodeID = ""
	}
	if req.CapacityUnits != nil {
		if *req.CapacityUnits < 1 || *req.CapacityUnits > 1_000_000 {
			return p, fmt.Errorf("%w: capacity_units must be between 1 and 1000000", ErrInvalid)
		}
		p.CapacityUnits = *req.CapacityUnits
	}
	if req.Requirements != nil && !req.Requirements.equal(p.Requirements) {
		if p.Pinned {
			return p, ErrPinned
		}
		p.Requirements = Requirements{Endpoint: req.Requirements.Endpoint, Labels: cloneLabels(req.Requirements.Labels)}
		p.NodeID = ""
	}
	p.Release, p.State = req.Release, req.State
	p.Generation++
	p.UpdatedAt = now
	return p, nil
}

// Observe decides whether obs may be recorded on p: it must come from the assigned node, name a
// generation not newer than p's desired one, and not be older than the recorded observation (a late
// report for generation N never overwrites N+1). Errors: [ErrStale].
func Observe(p *Placement, obs Observation) error {
	if obs.NodeID == "" || obs.NodeID != p.NodeID || obs.Generation < 1 || obs.Generation > p.Generation {
		return ErrStale
	}
	if p.Observed != nil && obs.Generation < p.Observed.Generation {
		return ErrStale
	}
	return nil
}

// Action is what [Decide] asks the loop to do.
type Action struct {
	// Reserve is the node to reserve on (a new selection, or the current node re-confirming the
	// reservation for this generation); empty reserves nothing.
	Reserve string
	// Release is a node whose reservation for this placement is dropped (portable failover).
	Release string
	// Status and NodeID are the placement's new status and node.
	Status Status
	NodeID string
}

// Decide returns the step that brings p to a node, given the runner nodes (by id) at now:
//
//  1. a placement on an online, unrevoked node keeps it (draining nodes keep current work), and
//     re-confirms the reservation when the demand grew;
//  2. a stateful placement whose node is offline, revoked or gone is unavailable and keeps its node;
//  3. a portable placement whose node is gone or unavailable, and a placement with no node, selects
//     a node with the decider ([Choose]), or waits with no node when none fits.
func Decide(p *Placement, nodes map[string]*runners.Node, reserved map[string]int, now time.Time) Action {
	if p.NodeID != "" {
		n, ok := nodes[p.NodeID]
		alive := ok && !n.Offline(now) && !n.Revoked
		switch {
		case alive:
			if reserved[p.NodeID] != p.CapacityUnits {
				return Action{Reserve: p.NodeID, Status: Assigned, NodeID: p.NodeID}
			}
			return Action{Status: Assigned, NodeID: p.NodeID}
		case p.Mode == Stateful:
			return Action{Status: Unavailable, NodeID: p.NodeID}
		}
	}
	req := p.Request()
	cands := make([]Node, 0, len(nodes))
	for _, n := range nodes {
		// Nodes that cannot take the placement whatever their room are left out before the
		// decider: they would only be refused, and Decide gives no reasons.
		if n.Revoked || n.Draining || n.Offline(now) || n.Capacity-n.Reserved < max(p.CapacityUnits, 1) {
			continue
		}
		c := RunnerNode(n, now)
		if code, _ := Satisfied(req, c); code != "" {
			continue
		}
		cands = append(cands, c)
	}
	c := Choose(req, cands).Choices[0]
	if c.NodeID == "" {
		return Action{Release: p.NodeID, Status: Waiting}
	}
	return Action{Reserve: c.NodeID, Release: p.NodeID, Status: Assigned, NodeID: c.NodeID}
}

// cloneLabels returns a copy of labels (nil for an empty map).
func cloneLabels(labels map[string]string) map[string]string {
	if len(labels) == 0 {
		return nil
	}
	return maps.Clone(labels)
}
