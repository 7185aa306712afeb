// Package runners owns placement nodes, the runners of /api/runner/v1: one-time enrollment tokens,
// node credentials, heartbeats and expiry, draining, and each node's reservation ledger
// (docs/runner-protocol.md sections 3 and 4).
package runners

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"time"

	"github.com/berthhq/berth/core/identity"
)

// Errors of the ledger decider and of [Registry].
var (
	// ErrUnauthenticated is returned for every node authentication failure, with no detail.
	ErrUnauthenticated = identity.ErrUnauthenticated
	// ErrEnrollmentInvalid is returned by [Registry.Register] for an enrollment token that is
	// unknown, used, expired, or bound to another node id or region.
	ErrEnrollmentInvalid = errors.New("berth: enrollment token invalid")
	// ErrCapacityInUse is returned when a node declares less capacity than it has reserved.
	ErrCapacityInUse = errors.New("berth: capacity below the node's reservations")
	// ErrRequirementInUse is returned when a node drops a label or endpoint that a placement
	// assigned to it requires, or changes region while it holds reservations.
	ErrRequirementInUse = errors.New("berth: an assigned placement requires what the node dropped")
	// ErrNoFit is returned by [Reserve] when the node cannot take the reservation (state, capability
	// or free capacity).
	ErrNoFit = errors.New("berth: the node cannot take the reservation")
	// ErrDraining is returned by [Registry.ClaimGate] for a draining node.
	ErrDraining = errors.New("berth: node is draining")
	// ErrNotFound is returned for an unknown node id.
	ErrNotFound = errors.New("berth: runner node not found")
)

var nodeIDRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidNodeID reports whether id is a DNS label, the shape of runner node ids.
func ValidNodeID(id string) bool { return nodeIDRE.MatchString(id) }

// Reservation is one entry of a node's ledger: the capacity and capabilities a placement holds.
type Reservation struct {
	Units    int               `bson:"units" json:"units"`
	Labels   map[string]string `bson:"labels,omitempty" json:"labels,omitempty"`
	Endpoint bool              `bson:"endpoint" json:"endpoint"`
	// Generation is the desired generation that made or last confirmed the reservation.
	Generation int64 `bson:"generation" json:"generation"`
	// At is when the reservation was made; the sweep spares reservations younger than its grace.
	At time.Time `bson:"at" json:"at"`
}

// Declaration is what a node advertises at registration and heartbeat.
type Declaration struct {
	Region string
	// Endpoint is the node's private provider origin (an https or loopback http URL); empty: none.
	Endpoint string
	// Capacity is in capacity units (process slots), 0 to 1,000,000.
	Capacity int
	Labels   map[string]string
}

// Validate reports a malformed declaration.
func (d Declaration) Validate() error {
	if d.Capacity < 0 || d.Capacity > 1_000_000 {
		return fmt.Errorf("capacity must be between 0 and 1000000 units")
	}
	if len(d.Labels) > 64 || len(d.Region) > 63 || len(d.Endpoint) > 2048 {
		return fmt.Errorf("too many labels, or region or endpoint too long")
	}
	for k, v := range d.Labels {
		if k == "" || len(k) > 63 || len(v) > 253 {
			return fmt.Errorf("label %q: keys are 1 to 63 bytes, values at most 253", k)
		}
	}
	return nil
}

// Node is a document in collection "runner_nodes".
type Node struct {
	ID               string                 `bson:"_id"`
	Region           string                 `bson:"region"`
	Endpoint         string                 `bson:"endpoint"`
	Capacity         int                    `bson:"capacity"`
	Labels           map[string]string      `bson:"labels,omitempty"`
	Draining         bool                   `bson:"draining"`
	Revoked          bool                   `bson:"revoked"`
	CredentialDigest string                 `bson:"credential_digest"`
	EnrolledAt       time.Time              `bson:"enrolled_at"`
	LastHeartbeatAt  time.Time              `bson:"last_heartbeat_at"`
	ExpiresAt        time.Time              `bson:"expires_at"`
	Reservations     map[string]Reservation `bson:"reservations"`
	Reserved         int                    `bson:"reserved"`
	Revision         int64                  `bson:"revision"`
}

// Offline reports whether the node's heartbeat expired at now.
func (n *Node) Offline(now time.Time) bool { return !now.Before(n.ExpiresAt) }

// Fits reports whether node n, with reserved units held by the other reservations, may take
// reservation r: its state, capabilities and free capacity. core/placement supplies it (the
// feasibility step of its decider), so the ledger applies the same rules the decider chose by.
type Fits func(n *Node, reserved int, r Reservation) bool

// CheckDeclaration decides whether n may advertise d: capacity at least its reservations, every
// label and the endpoint its reservations require kept, and the region unchanged while it holds
// reservations. Errors: [ErrCapacityInUse], [ErrRequirementInUse].
func CheckDeclaration(n *Node, d Declaration) error {
	if d.Capacity < n.Reserved {
		return fmt.Errorf("%w: declared %d units, %d reserved", ErrCapacityInUse, d.Capacity, n.Reserved)
	}
	if len(n.Reservations) > 0 && n.Region != "" && d.Region != n.Region {
		return fmt.Errorf("%w: region %q is held by %d placements", ErrRequirementInUse, n.Region, len(n.Reservations))
	}
	for key, r := range n.Reservations {
		if r.Endpoint && d.Endpoint == "" {
			return fmt.Errorf("%w: placement %s requires an endpoint", ErrRequirementInUse, key)
		}
		for k, v := range r.Labels {
			if d.Labels[k] != v {
				return fmt.Errorf("%w: placement %s requires label %s=%s", ErrRequirementInUse, key, k, v)
			}
		}
	}
	return nil
}

// Reserve decides the ledger after adding (or resizing) key's reservation r on n. A new or grown
// reservation requires fits to accept the node with the others' reservations; a shrink or an
// unchanged one always succeeds. It returns the new ledger and its sum, or [ErrNoFit].
func Reserve(n *Node, key string, r Reservation, fits Fits) (map[string]Reservation, int, error) {
	prev, had := n.Reservations[key]
	add := r.Units
	if had {
		add -= prev.Units
	}
	if (add > 0 || !had) && !fits(n, n.Reserved-prev.Units, r) {
		return nil, 0, ErrNoFit
	}
	out := maps.Clone(n.Reservations)
	if out == nil {
		out = map[string]Reservation{}
	}
	out[key] = r
	return out, sum(out), nil
}

// Unreserve returns n's ledger without key, and whether it changed.
func Unreserve(n *Node, key string) (map[string]Reservation, int, bool) {
	if _, ok := n.Reservations[key]; !ok {
		return n.Reservations, n.Reserved, false
	}
	out := maps.Clone(n.Reservations)
	delete(out, key)
	return out, sum(out), true
}

func sum(l map[string]Reservation) int {
	t := 0
	for _, r := range l {
		t += r.Units
	}
	return t
}
