package fencing

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one lease document per leased resource, with _id the lease id.
const Collection = "leases"

// Lease is one lease document (docs/node-protocol.md section 8, docs/api.md "Leases").
type Lease struct {
	ID           string         `bson:"_id" json:"lease_id"`
	ResourceType string         `bson:"resource_type" json:"resource_type"`
	ResourceID   string         `bson:"resource_id" json:"resource_id"`
	Holder       string         `bson:"holder" json:"holder,omitempty"`
	FencingToken int64          `bson:"fencing_token" json:"fencing_token"`
	Mode         node.LeaseMode `bson:"mode" json:"mode"`
	DurationMS   int64          `bson:"duration_ms" json:"duration_ms,omitempty"`
	// GrantedAt is T_grant of the current holding (the last grant or renewal answer).
	GrantedAt time.Time `bson:"granted_at" json:"granted_at"`
	// GateAt is when a free lease may be granted again (zero: at once).
	GateAt      time.Time `bson:"gate_at" json:"gate_at"`
	FenceFailed []string  `bson:"fence_failed" json:"fence_failed,omitempty"`
	Deleted     bool      `bson:"deleted" json:"deleted,omitempty"`
	Revision    int64     `bson:"revision" json:"revision"`

	// LogOutbox holds the lease's changes not yet in the change log,
	// written with the change (docs/node-protocol.md section 7.2): a
	// holding superseded by [Authority.Lost].
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
}

// LostEntityType is the change-log entity type of a node declared lost:
// one entry per lease superseded, entity id the node id, op update, payload
// [LostChange] (docs/node-protocol.md section 7.6).
const LostEntityType = "node_lost"

// LostChange is the payload of a [LostEntityType] entry: the node and the
// one lease freed from it, as written.
type LostChange struct {
	NodeID string  `json:"node_id"`
	Leases []Lease `json:"leases"`
}

// State returns l as the decider sees it.
func (l *Lease) State() State {
	return State{LeaseID: l.ID, Holder: l.Holder, Token: l.FencingToken, Mode: l.Mode,
		Duration: time.Duration(l.DurationMS) * time.Millisecond, GrantedAt: l.GrantedAt, GateAt: l.GateAt,
		FenceFailed: l.FenceFailed, Deleted: l.Deleted}
}

func (l *Lease) set(s State) {
	l.Holder, l.FencingToken, l.Mode, l.DurationMS = s.Holder, s.Token, s.Mode, s.Duration.Milliseconds()
	l.GrantedAt, l.GateAt, l.FenceFailed, l.Deleted = s.GrantedAt, s.GateAt, s.FenceFailed, s.Deleted
	if l.FenceFailed == nil {
		l.FenceFailed = []string{}
	}
}

// Gate returns when l may be granted to a node other than its holder, and false when never by
// time (a held local lease). See [State.Gate].
func (l *Lease) Gate() (time.Time, bool) { return l.State().Gate() }

// GrantMessage returns the lease_grant body for l's current holding, signed with key.
func (l *Lease) GrantMessage(key ed25519.PrivateKey) (node.LeaseGrant, error) {
	g := node.LeaseGrant{LeaseID: l.ID, ResourceType: l.ResourceType, ResourceID: l.ResourceID, Mode: l.Mode,
		FencingToken: l.FencingToken, DurationMS: l.DurationMS, GrantedAt: l.GrantedAt.UTC()}
	if err := node.SignLeaseGrant(&g, key); err != nil {
		return g, fmt.Errorf("sign lease_grant %s: %w", l.ID, err)
	}
	return g, nil
}

// RevokeMessage returns a lease_revoke body for l with reason, signed with key. The token is the
// lease's current one, or token when that is higher (a node that claims a token the core never
// issued is revoked at its own token, so it cannot refuse the revoke as older).
func RevokeMessage(leaseID string, token int64, reason string, key ed25519.PrivateKey) (node.LeaseRevoke, error) {
	r := node.LeaseRevoke{LeaseID: leaseID, FencingToken: token, Reason: reason}
	if err := node.SignLeaseRevoke(&r, key); err != nil {
		return r, fmt.Errorf("sign lease_revoke %s: %w", leaseID, err)
	}
	return r, nil
}

// LeaseID returns the lease id of a resource: "lse_" followed by the resource id without its
// type prefix, so each resource has exactly one lease document.
func LeaseID(resourceID string) string {
	if _, rest, ok := strings.Cut(resourceID, "_"); ok {
		return "lse_" + rest
	}
	return "lse_" + resourceID
}

// Config configures an [Authority].
type Config struct {
	// Now is the core's clock; nil means time.Now. The gate is measured on it.
	Now func() time.Time
	// Logger receives repairs done by [Authority.Sweep]; nil discards.
	Logger *slog.Logger
}

// Authority grants, renews, revokes and moves the leases of stateful services. Every change of a
// lease is one compare-and-set on that lease's document (DESIGN.md section 4), re-decided by the
// pure functions of this package after a lost race. Safe for concurrent use, also by several cores
// sharing one store.
type Authority struct {
	st     *store.Store
	leases *mongo.Collection
	nodes  *mongo.Collection
	now    func() time.Time
	log    *slog.Logger
}

// New returns an Authority over s. It does no I/O.
func New(s *store.Store, cfg Config) *Authority {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Authority{st: s, leases: s.Collection(Collection), nodes: s.Collection(nodesCollection), now: cfg.Now,
		log: cfg.Logger.With("component", "fencing")}
}

// Now returns the authority's clock reading.
func (a *Authority) Now() time.Time { return a.now() }

// Get returns the lease with id. Errors: wrapping [store.ErrNotFound].
func (a *Authority) Get(ctx context.Context, id string) (*Lease, error) {
	var l Lease
	if err := store.FindByID(ctx, a.leases, id, &l); err != nil {
		return nil, fmt.Errorf("fencing: lease %s: %w", id, err)
	}
	return &l, nil
}

// List returns the leases matching filter (nil: all), ordered by id.
func (a *Authority) List(ctx context.Context, filter bson.M) ([]Lease, error) {
	if filter == nil {
		filter = bson.M{}
	}
	// An equality filter is answered by the store's read view; an operator filter by the store.
	eq := bson.D{}
	for k, v := range filter {
		switch v.(type) {
		case bson.M, bson.D, map[string]any:
			eq = nil
		}
		if eq == nil {
			break
		}
		eq = append(eq, bson.E{Key: k, Value: v})
	}
	if eq != nil {
		out := []Lease{}
		if err := a.st.View().Find(ctx, a.leases, eq, &out); err != nil {
			return nil, fmt.Errorf("fencing: list leases: %w", err)
		}
		return out, nil
	}
	cur, err := a.leases.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("fencing: list leases: %w", err)
	}
	out := []Lease{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("fencing: list leases: %w", err)
	}
	return out, nil
}

// HeldBy returns the leases nodeID holds.
func (a *Authority) HeldBy(ctx context.Context, nodeID string) ([]Lease, error) {
	return a.List(ctx, bson.M{"holder": nodeID})
}

// apply reads lease id (a fresh one for resource when absent), runs decide on it at the
// authority's clock and writes the result with one compare-and-set, re-deciding after a lost race
// (as [store.RetryOnConflict] says). decide returns changed=false to write nothing. It returns the lease
// as written (or as read when unchanged) and decide's error, unwrapped.
func (a *Authority) apply(ctx context.Context, id, resType, resID string, create bool, decide func(State, time.Time) (State, bool, error)) (*Lease, error) {
	return a.applyLogged(ctx, id, resType, resID, create, decide, nil)
}

// applyLogged is [Authority.apply] that records the change in the lease's
// outbox, in the same compare-and-set, when logged is not nil and ctx
// carries the actor (changelog.WithActor): logged returns the change of the
// lease as it is about to be written. The lease returned carries its outbox
// as that write left it.
func (a *Authority) applyLogged(ctx context.Context, id, resType, resID string, create bool, decide func(State, time.Time) (State, bool, error), logged func(*Lease) changelog.Change) (*Lease, error) {
	actor, withActor := changelog.ActorFrom(ctx)
	var out *Lease
	err := store.RetryOnConflictFunc(ctx, lostLeaseRace, func() error {
		var l Lease
		out = nil
		err := store.FindByID(ctx, a.leases, id, &l)
		exists := err == nil
		switch {
		case errors.Is(err, store.ErrNotFound) && create:
			l = Lease{ID: id, ResourceType: resType, ResourceID: resID, FenceFailed: []string{}}
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("fencing: lease %s: %w", id, err)
		case err != nil:
			return fmt.Errorf("fencing: read lease %s: %w", id, err)
		}
		next, changed, derr := decide(l.State(), a.now().UTC())
		if derr != nil || !changed {
			out = &l
			return derr
		}
		prev := l.Revision
		l.set(next)
		var push *changelog.Pending
		if logged != nil && withActor {
			written := l
			written.Revision, written.LogOutbox = prev+1, nil
			ch := logged(&written)
			ch.ActorType, ch.ActorID = actor.Type, actor.ID
			p, err := changelog.Prepare(ch)
			if err != nil {
				return fmt.Errorf("fencing: lease %s: %w", id, err)
			}
			push = &p
		}
		if !exists {
			l.Revision = 1
			if push != nil {
				l.LogOutbox = []changelog.Pending{*push}
			}
			_, err = a.leases.InsertOne(ctx, l)
		} else {
			update := bson.M{"$set": bson.M{
				"holder": l.Holder, "fencing_token": l.FencingToken, "mode": l.Mode, "duration_ms": l.DurationMS,
				"granted_at": l.GrantedAt, "gate_at": l.GateAt, "fence_failed": l.FenceFailed, "deleted": l.Deleted,
			}}
			if push != nil {
				update["$push"] = bson.M{changelog.OutboxField: *push}
			}
			l.Revision, err = a.st.UpdateIfRevision(ctx, a.leases, id, prev, update)
			if err == nil && push != nil {
				l.LogOutbox = append(l.LogOutbox, *push)
			}
		}
		if err != nil {
			return fmt.Errorf("fencing: write lease %s: %w", id, errLostRace{err})
		}
		out = &l
		return nil
	})
	if err != nil && out == nil {
		return nil, err
	}
	return out, err // out with an error: decide's, unwrapped
}

// errLostRace marks the write of [Authority.applyLogged], so that only a write that lost to
// another writer (a duplicate insert, a changed revision) is retried, never decide's answer.
type errLostRace struct{ err error }

func (e errLostRace) Error() string { return e.err.Error() }
func (e errLostRace) Unwrap() error { return e.err }

// lostLeaseRace reports whether err is a lease write that lost a race.
func lostLeaseRace(err error) bool {
	var lost errLostRace
	return errors.As(err, &lost) && (store.IsDuplicateKey(lost.err) || errors.Is(lost.err, store.ErrConflict))
}

// GrantRequest asks for a lease on a resource for a node.
type GrantRequest struct {
	ResourceType string // node.LeaseResourceService
	ResourceID   string
	NodeID       string
	Mode         node.LeaseMode
	// Duration is D for expiring leases (at least node.MinLeaseDuration); ignored for local ones.
	Duration time.Duration
}

// Grant grants the resource's lease to req.NodeID ([Grant] decides; the lease document is created
// at the first grant). It returns the lease as granted and the previous holder when the lease was
// moved from a node that still held it (the caller revokes that node with reason moved). A lease
// req.NodeID already holds is returned unchanged. Errors: [ErrHeld], [ErrGate], [ErrBlocked],
// [ErrDeleted], [ErrDurationTooShort] (wrapped), or a store error.
func (a *Authority) Grant(ctx context.Context, req GrantRequest) (*Lease, string, error) {
	var moved string
	l, err := a.apply(ctx, LeaseID(req.ResourceID), req.ResourceType, req.ResourceID, true, func(s State, now time.Time) (State, bool, error) {
		next, m, err := Grant(s, req.NodeID, req.Mode, req.Duration, now)
		moved = m
		return next, err == nil && next.Token != s.Token, err
	})
	return l, moved, err
}

// Renew answers a lease_renew (or re-confirms a holding before a grant is sent again): it records
// T_grant = now while nodeID holds lease id under token. Errors: [ErrStale], [ErrBlocked],
// [ErrDeleted] (the session answers lease_revoke with the returned lease's current token), a
// wrapped [store.ErrNotFound] for an unknown lease id, or a store error.
func (a *Authority) Renew(ctx context.Context, id, nodeID string, token int64) (*Lease, error) {
	return a.apply(ctx, id, "", "", false, func(s State, now time.Time) (State, bool, error) {
		next, err := Renew(s, nodeID, token, now)
		return next, err == nil, err
	})
}

// Release records that nodeID fenced lease id under token (revoke answered ok, or node.fenced):
// the lease is free at once. Errors: [ErrStale] when nodeID no longer holds it under token
// (nothing changes), a wrapped [store.ErrNotFound], or a store error.
func (a *Authority) Release(ctx context.Context, id, nodeID string, token int64) (*Lease, error) {
	return a.apply(ctx, id, "", "", false, func(s State, now time.Time) (State, bool, error) {
		next, err := Release(s, nodeID, token, now)
		return next, err == nil, err
	})
}

// Lost declares nodeID lost (POST /api/v1/nodes/{id}/lost): every lease it holds gets a higher
// token and is free at once, each by one compare-and-set. It returns the leases changed. When ctx
// carries the actor (changelog.WithActor), each compare-and-set also puts a [LostEntityType]
// change in that lease's outbox (Lease.LogOutbox), so the change reaches the log exactly once
// whatever happens after the write (docs/node-protocol.md section 7.2). Idempotent: a second call
// changes nothing and records nothing.
func (a *Authority) Lost(ctx context.Context, nodeID string) ([]Lease, error) {
	held, err := a.HeldBy(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, h := range held {
		var changed bool
		l, err := a.applyLogged(ctx, h.ID, "", "", false, func(s State, now time.Time) (State, bool, error) {
			next, c := Lost(s, nodeID, now)
			changed = c
			return next, c, nil
		}, func(l *Lease) changelog.Change {
			return changelog.Change{EntityType: LostEntityType, EntityID: nodeID, Op: node.OpUpdate,
				Payload: LostChange{NodeID: nodeID, Leases: []Lease{*l}}}
		})
		if err != nil {
			return out, err
		}
		if changed {
			out = append(out, *l)
		}
	}
	return out, nil
}

// Delete marks the resource's lease deleted (its service is gone): it is freed for good with a
// higher token. It returns the lease as it was before (to revoke its holder), or nil when the
// resource never had a lease. Idempotent.
func (a *Authority) Delete(ctx context.Context, resourceID string) (*Lease, error) {
	before, err := a.Get(ctx, LeaseID(resourceID))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	_, err = a.apply(ctx, before.ID, "", "", false, func(s State, now time.Time) (State, bool, error) {
		return Delete(s), !s.Deleted, nil
	})
	return before, err
}

// Blocked reports whether a failed fence of l is outstanding (granted to nobody).
func (l *Lease) Blocked() bool { return len(l.FenceFailed) > 0 }
