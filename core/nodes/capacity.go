package nodes

import (
	"context"
	"errors"
	"fmt"
	"github.com/berthhq/berth/core/store"
	"maps"
	"regexp"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// Resources is an amount of a node's resources: what it can give to workloads (its
// allocatable capacity) or what an operator says it can. CPUMilli is in thousandths of a CPU,
// MemoryMiB and DiskMiB (space for volumes) in mebibytes; Extended holds operator-declared
// countable resources by name (e.g. "gpu": 1). A zero field is "not stated".
type Resources struct {
	CPUMilli  int64            `bson:"cpu_m,omitempty" json:"cpu_m,omitempty"`
	MemoryMiB int64            `bson:"memory_mib,omitempty" json:"memory_mib,omitempty"`
	DiskMiB   int64            `bson:"disk_mib,omitempty" json:"disk_mib,omitempty"`
	Extended  map[string]int64 `bson:"extended,omitempty" json:"extended,omitempty"`
}

// Equal reports whether r and o state the same amounts (a nil and an empty Extended are equal).
func (r Resources) Equal(o Resources) bool {
	return r.CPUMilli == o.CPUMilli && r.MemoryMiB == o.MemoryMiB && r.DiskMiB == o.DiskMiB &&
		maps.Equal(r.Extended, o.Extended)
}

// IsZero reports whether r states nothing.
func (r Resources) IsZero() bool { return r.Equal(Resources{}) }

// ResourcesFromWire converts what an agent reports (abi/node) into Resources.
func ResourcesFromWire(a node.Allocatable) Resources {
	r := Resources{CPUMilli: a.CPUMilli, MemoryMiB: a.MemoryMiB, DiskMiB: a.DiskMiB}
	if len(a.Extended) > 0 {
		r.Extended = maps.Clone(a.Extended)
	}
	return r
}

// extendedName is the form of an extended resource's name: a lowercase label, optionally
// prefixed by a domain ("example.com/fpga").
var extendedName = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)

// ValidExtendedName reports whether s may name an extended resource: 1 to 63 of [a-z0-9_-]
// starting and ending with a letter or digit, optionally after a "<domain>/" prefix.
func ValidExtendedName(s string) bool { return extendedName.MatchString(s) }

// Validate checks r's amounts: no negative amount, extended names well formed. what names r in
// the error ("capacity override", "allocatable").
func (r Resources) Validate(what string) error {
	switch {
	case r.CPUMilli < 0:
		return fmt.Errorf("%s: cpu_m must not be negative, got %d", what, r.CPUMilli)
	case r.MemoryMiB < 0:
		return fmt.Errorf("%s: memory_mib must not be negative, got %d", what, r.MemoryMiB)
	case r.DiskMiB < 0:
		return fmt.Errorf("%s: disk_mib must not be negative, got %d", what, r.DiskMiB)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Extended)) {
		if !ValidExtendedName(k) {
			return fmt.Errorf("%s: extended resource name %q must be a lowercase label (a-z, 0-9, '-', '_'), optionally after '<domain>/'", what, k)
		}
		if r.Extended[k] < 0 {
			return fmt.Errorf("%s: extended resource %s must not be negative, got %d", what, k, r.Extended[k])
		}
	}
	return nil
}

// Capacity returns what the node offers to placement: its reported [Node.Allocatable] with
// every field the operator's [Node.CapacityOverride] states (non-zero) in its place; an
// extended resource the override names replaces the reported one, 0 included (an operator
// hides a reported gpu with gpu=0). Pure; the result shares nothing with n.
func (n *Node) Capacity() Resources {
	out := n.Allocatable
	out.Extended = maps.Clone(n.Allocatable.Extended)
	o := n.CapacityOverride
	if o == nil {
		return out
	}
	if o.CPUMilli > 0 {
		out.CPUMilli = o.CPUMilli
	}
	if o.MemoryMiB > 0 {
		out.MemoryMiB = o.MemoryMiB
	}
	if o.DiskMiB > 0 {
		out.DiskMiB = o.DiskMiB
	}
	for k, v := range o.Extended {
		if out.Extended == nil {
			out.Extended = map[string]int64{}
		}
		out.Extended[k] = v
	}
	return out
}

// Errors of the operator's node changes ([Registry.SetCapacityOverride], [Registry.Cordon],
// [Registry.Drain]).
var (
	// ErrInvalid is returned for an argument the change refuses (a negative amount, a bad name,
	// a deadline in the past); the message says which.
	ErrInvalid = errors.New("berth: invalid node change")
	// ErrNotMember is returned for a node that was removed or is retiring: it takes no
	// placement, so there is nothing to cordon, drain or size.
	ErrNotMember = errors.New("berth: node is removed or retiring")
)

// maxOpAttempts bounds the compare-and-set retries of an operator change against concurrent
// writers of the same node's operator fields.
const maxOpAttempts = 8

// opCond is the compare-and-set condition on n's operator revision ([Node.OpRev]).
func opCond(n *Node) bson.D {
	var rev any // absent while no operator change was made
	if n.OpRev > 0 {
		rev = n.OpRev
	}
	return bson.D{{Key: "op_rev", Value: rev}}
}

// operatorChange applies change to node id's operator fields (capacity override, cordon,
// drain) with one compare-and-set on its op_rev, retried on a concurrent change, and records
// it in the change log when ctx carries an actor. change edits a copy of the node and returns
// the $set of the fields it changed, or nil when nothing changes (then nothing is written).
// It returns the node after the change.
func (r *Registry) operatorChange(ctx context.Context, id, what string, change func(n *Node) (bson.M, error)) (*Node, error) {
	for range maxOpAttempts {
		n, err := r.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if !n.Member() {
			return nil, fmt.Errorf("%s %s: %w", what, id, ErrNotMember)
		}
		cond := opCond(n)
		set, err := change(n)
		if err != nil {
			return nil, err
		}
		if set == nil {
			return n, nil
		}
		payload := logPayload(set) // before unsetOf: a cleared field is logged as null
		set["op_rev"] = n.OpRev + 1
		update := bson.M{"$set": set}
		if unset := unsetOf(set); len(unset) > 0 {
			update["$unset"] = unset
		}
		pend, logged, err := logChange(ctx, id, node.OpUpdate, payload)
		if err != nil {
			return nil, err
		}
		if logged {
			update["$push"] = bson.M{changelog.OutboxField: pend}
		}
		ok, err := r.st.UpdateIf(ctx, r.nodes, id, cond, update)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, id, err)
		}
		if !ok {
			continue
		}
		n.OpRev++
		n.LogOutbox = nil
		if logged {
			n.LogOutbox = []changelog.Pending{pend}
		}
		return n, nil
	}
	return nil, fmt.Errorf("%s %s: %w", what, id, ErrConflict)
}

// unsetOf moves the nil values of set into an $unset document (a cleared field goes from the
// node document instead of being stored as null).
func unsetOf(set bson.M) bson.M {
	unset := bson.M{}
	for k, v := range set {
		if v == nil {
			unset[k] = ""
			delete(set, k)
		}
	}
	return unset
}

// logPayload is the change log's payload of an operator change: the fields set, a cleared one
// as null.
func logPayload(set bson.M) map[string]any {
	out := make(map[string]any, len(set))
	for k, v := range set {
		out[k] = v
	}
	return out
}

// SetCapacityOverride replaces node id's operator capacity override with o (nil clears it, and
// so does an o that states nothing), with one compare-and-set on the node. The node's reported
// [Node.Allocatable] is kept; [Node.Capacity] merges the two. Errors: ErrNotFound, ErrInvalid,
// ErrNotMember, ErrConflict (the node's operator fields kept changing), or a store error.
// Idempotent: the same override again writes nothing.
func (r *Registry) SetCapacityOverride(ctx context.Context, id string, o *Resources) (*Node, error) {
	if o != nil {
		if err := o.Validate("capacity override"); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if o.IsZero() {
			o = nil
		}
	}
	return r.operatorChange(ctx, id, "set capacity of node", func(n *Node) (bson.M, error) {
		switch {
		case o == nil && n.CapacityOverride == nil:
			return nil, nil
		case o != nil && n.CapacityOverride != nil && o.Equal(*n.CapacityOverride):
			return nil, nil
		}
		n.CapacityOverride = o
		if o == nil {
			return bson.M{"capacity_override": nil}, nil
		}
		return bson.M{"capacity_override": o}, nil
	})
}

// ReportAllocatable records what node id's agent reported it can give to workloads, and how it
// enforces workload limits (limits, e.g. "cgroup2" or "none: <why>"), with one compare-and-set
// on the node's report revision, when either differs from what is stored (a report that
// changes nothing writes nothing). A removed or unknown node is left alone.
func (r *Registry) ReportAllocatable(ctx context.Context, id string, a Resources, limits string) error {
	if err := a.Validate("allocatable"); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	err := store.RetryOnConflict(ctx, func() error {
		n, err := r.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if n.Status == StatusRemoved || n.Allocatable.Equal(a) && n.ResourceLimits == limits {
			return nil
		}
		var rev any
		if n.ReportRev > 0 {
			rev = n.ReportRev
		}
		ok, err := r.st.UpdateIf(ctx, r.nodes, id, bson.D{{Key: "report_rev", Value: rev}},
			bson.M{"$set": bson.M{"allocatable": a, "resource_limits": limits, "report_rev": n.ReportRev + 1}})
		if err != nil {
			return err
		}
		if !ok {
			return ErrConflict
		}
		return nil
	}, ErrConflict)
	if err != nil {
		return fmt.Errorf("record allocatable of node %s: %w", id, err)
	}
	return nil
}
