package placement

import "slices"

// Lease is a stateful service's lease as [LeaseTarget] sees it (docs/node-protocol.md section
// 8). The zero value is a lease never granted that may be granted at once when Movable is set.
type Lease struct {
	// Holder is the node holding the lease, "" when nobody does.
	Holder string
	// Movable reports whether the lease may be granted to a node other than Holder now: a free
	// lease whose gate is open, or an expiring lease whose holder went silent past
	// T_grant + D + 2M. It is false while Blocked.
	Movable bool
	// Blocked reports whether an unacknowledged failed fence forbids every grant.
	Blocked bool
}

// LeaseTarget decides where the lease of a stateful service (one replica, req) should be held,
// and returns the node to grant it to ("" when no grant is needed or possible now) and, when the
// decider chose that node, its choice (the reasons). current is the node the service's workload
// stands on ("" for none). Rules, in order:
//
//  1. a blocked lease, or a request for no replica (wants false), is granted nowhere;
//  2. a lease that is not Movable stays with its holder (a local holder keeps its workload even
//     while disconnected);
//  3. a Movable lease stays with a holder that is available and still meets the request's
//     region and selector ([Satisfied]); else it goes to current when that node is available,
//     not cordoned and meets them; else to the node [Choose] takes for the replica (capacity,
//     requirements, ranking); with none, it stays where it is and nothing is granted.
//
// LeaseTarget is pure and deterministic.
func LeaseTarget(l Lease, wants bool, req Request, nodes []Node, current string) (grantTo string, chosen *Choice) {
	if !wants || l.Blocked || !l.Movable {
		return "", nil
	}
	ok := func(id string, cordonToo bool) bool {
		i := slices.IndexFunc(nodes, func(n Node) bool { return n.ID == id })
		if id == "" || i < 0 || nodes[i].Unavailable != "" || cordonToo && nodes[i].Cordoned {
			return false
		}
		code, _ := Satisfied(req, nodes[i])
		return code == ""
	}
	if ok(l.Holder, false) {
		return "", nil
	}
	if current != "" && current != l.Holder && ok(current, true) {
		return current, nil
	}
	req.Place, req.Existing = []string{"0"}, nil
	res := Choose(req, nodes)
	c := res.Choices[0]
	if c.NodeID == "" || c.NodeID == l.Holder {
		return "", &c
	}
	return c.NodeID, &c
}
