package scheduler

import "maps"

// Candidate is a placement node as [Select] sees it (docs/runner-protocol.md section 4).
type Candidate struct {
	ID     string
	Region string
	// Capacity and Reserved are in capacity units (process slots); Reserved is the sum of the
	// node's reservation ledger.
	Capacity, Reserved int
	Labels             map[string]string
	// Endpoint reports whether the node registered a private provider origin.
	Endpoint bool
	// Draining, Offline (heartbeat expired) and Revoked nodes receive no new placements.
	Draining, Offline, Revoked bool
}

// Demand is what a placement needs from a node.
type Demand struct {
	// Units is the capacity to reserve; at least 1.
	Units int
	// Region, when not empty, must equal the node's region.
	Region string
	// Labels must all be present on the node with exactly these values.
	Labels map[string]string
	// Endpoint reports whether the node must have registered an endpoint.
	Endpoint bool
}

// Capable reports whether c has the region, labels and endpoint d requires, whatever its state
// and free capacity.
func Capable(c Candidate, d Demand) bool {
	if d.Region != "" && c.Region != d.Region {
		return false
	}
	if d.Endpoint && !c.Endpoint {
		return false
	}
	for k, v := range d.Labels {
		if got, ok := c.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Fits reports whether d may be newly placed on c: c is online, not draining or revoked, capable
// of d, and has at least d.Units free.
func Fits(c Candidate, d Demand) bool {
	return !c.Draining && !c.Offline && !c.Revoked && Capable(c, d) && c.Capacity-c.Reserved >= max(d.Units, 1)
}

// Select chooses the node for d among cands: of the nodes that [Fits], the one with the most free
// capacity after the reservation (spread), then the lowest id. ok is false when none fits: the
// placement waits. Select is pure and deterministic.
func Select(d Demand, cands []Candidate) (id string, ok bool) {
	bestFree := -1
	for _, c := range cands {
		if !Fits(c, d) {
			continue
		}
		free := c.Capacity - c.Reserved - max(d.Units, 1)
		if free > bestFree || (free == bestFree && c.ID < id) {
			id, bestFree = c.ID, free
		}
	}
	return id, bestFree >= 0
}

// CloneLabels returns a copy of labels (nil for an empty map).
func CloneLabels(labels map[string]string) map[string]string {
	if len(labels) == 0 {
		return nil
	}
	return maps.Clone(labels)
}
