package services

import "slices"

// Rebalance is what `berth rebalance` recorded on a service (docs/placement.md section 7): the
// replicas to move for a better spread. The rollout's placement honours a move while the
// replica still stands on From and To is feasible for it; once the replica stands elsewhere the
// move is spent. A later rebalance replaces the whole record.
type Rebalance struct {
	// Generation counts the rebalances written to the service.
	Generation int64 `bson:"generation" json:"generation"`
	// Moves are the replica moves, in replica order.
	Moves []RebalanceMove `bson:"moves,omitempty" json:"moves,omitempty"`
}

// RebalanceMove moves one replica from one node to another.
type RebalanceMove struct {
	Replica string `bson:"replica" json:"replica"`
	From    string `bson:"from" json:"from"`
	To      string `bson:"to" json:"to"`
}

// MoveOf returns the node a rebalance moves replica to while it stands on from, "" when none.
func (r *Rebalance) MoveOf(replica, from string) string {
	if r == nil {
		return ""
	}
	for _, m := range r.Moves {
		if m.Replica == replica && m.From == from && m.To != from {
			return m.To
		}
	}
	return ""
}

// SameRebalance reports whether a and b carry the same rebalance record (nil and a record
// without moves at generation 0 are equal).
func SameRebalance(a, b *Service) bool {
	var x, y Rebalance
	if a.Rebalance != nil {
		x = *a.Rebalance
	}
	if b.Rebalance != nil {
		y = *b.Rebalance
	}
	return x.Generation == y.Generation && slices.Equal(x.Moves, y.Moves)
}
