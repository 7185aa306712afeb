package nodes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// Retirement dispositions and states (docs/reconciliation.md section 10).
const (
	// DispositionWithdrawn: the node's slots are stopped and removed against its own receipts;
	// the node is retired once none is left.
	DispositionWithdrawn = "withdrawn"
	// DispositionLost: the node will never answer again; its slots are released at once.
	DispositionLost = "lost"

	RetirementRetiring = "retiring"
	RetirementRetired  = "retired"
)

// ReportFreshness is how recent a node's last report must be for a lost retirement to be
// refused as node-still-reporting.
const ReportFreshness = 90 * time.Second

// Errors of [Registry.Retire].
var (
	ErrAlreadyRetired  = errors.New("berth: node-already-retired")
	ErrStillReporting  = errors.New("berth: node-still-reporting")
	ErrBadDisposition  = errors.New("berth: retirement disposition must be withdrawn or lost")
	errRetirementMoved = errors.New("retirement changed concurrently")
)

// Retirement is a node's retirement record.
type Retirement struct {
	Disposition string     `bson:"disposition"`
	State       string     `bson:"state"`
	CreatedAt   time.Time  `bson:"created_at"`
	RetiredAt   *time.Time `bson:"retired_at,omitempty"`
}

// Retire writes node id's retirement (docs/reconciliation.md section 10) with one
// compare-and-set on its disposition, and returns the node after it. disposition "" asks for
// withdrawn. lost escalates a withdrawn retirement that is still retiring. Errors: ErrNotFound,
// ErrBadDisposition, ErrAlreadyRetired (removed, retired, or already retiring with that
// disposition), ErrStillReporting (lost while the node has a session or reported within
// [ReportFreshness]). Nothing is taken away here: the sweep acts on the record.
func (r *Registry) Retire(ctx context.Context, id, disposition string) (*Node, error) {
	if disposition == "" {
		disposition = DispositionWithdrawn
	}
	if disposition != DispositionWithdrawn && disposition != DispositionLost {
		return nil, ErrBadDisposition
	}
	n, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	now := r.now().UTC()
	var cond any
	switch {
	case n.Status == StatusRemoved, n.Retirement != nil && n.Retirement.State == RetirementRetired:
		return nil, fmt.Errorf("%w: %s", ErrAlreadyRetired, id)
	case n.Retirement != nil && (disposition == DispositionWithdrawn || n.Retirement.Disposition == DispositionLost):
		return nil, fmt.Errorf("%w: %s is already retiring as %s", ErrAlreadyRetired, id, n.Retirement.Disposition)
	case n.Retirement != nil:
		cond = DispositionWithdrawn
	}
	if disposition == DispositionLost && (n.Status == StatusConnected || n.LastSeenAt != nil && now.Sub(*n.LastSeenAt) < ReportFreshness) {
		return nil, fmt.Errorf("%w: %s has a session or reported within %s", ErrStillReporting, id, ReportFreshness)
	}
	ret := &Retirement{Disposition: disposition, State: RetirementRetiring, CreatedAt: now}
	if n.Retirement != nil {
		ret.CreatedAt = n.Retirement.CreatedAt
	}
	update := bson.M{"$set": bson.M{"retirement": ret, "retirement_disposition": disposition}}
	pend, logged, err := logChange(ctx, id, node.OpUpdate, ret)
	if err != nil {
		return nil, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
	}
	ok, err := r.st.UpdateIf(ctx, r.nodes, id, bson.D{{Key: "retirement_disposition", Value: cond}}, update)
	if err != nil {
		return nil, fmt.Errorf("retire node %s: %w", id, err)
	}
	if !ok {
		return nil, fmt.Errorf("retire node %s: %w", id, errRetirementMoved)
	}
	n.Retirement, n.RetirementDisposition = ret, disposition
	n.LogOutbox = nil
	if logged {
		n.LogOutbox = []changelog.Pending{pend}
	}
	return n, nil
}

// FinishRetirement marks a retiring node's retirement retired (idempotent) and the node
// removed, so it never authenticates or is placed on again. The caller ends its session.
func (r *Registry) FinishRetirement(ctx context.Context, id string) (*Node, error) {
	n, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if n.Retirement == nil {
		return nil, fmt.Errorf("finish retirement of %s: not retiring", id)
	}
	if n.Retirement.State != RetirementRetired {
		now := r.now().UTC()
		ret := *n.Retirement
		ret.State, ret.RetiredAt = RetirementRetired, &now
		if _, err := r.st.UpdateIf(ctx, r.nodes, id, bson.D{{Key: "retirement_disposition", Value: ret.Disposition}},
			bson.M{"$set": bson.M{"retirement": ret}}); err != nil {
			return nil, fmt.Errorf("finish retirement of %s: %w", id, err)
		}
	}
	n, _, err = r.Remove(ctx, id)
	return n, err
}
