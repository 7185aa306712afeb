package runners

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/buckets"
)

// Collections of the registry. Nodes are spread over [NodeBuckets] collections
// "runner_nodes_bNN" by a hash of the node id ([NodeCollection]).
const (
	NodesCollection       = "runner_nodes"
	EnrollmentsCollection = "runner_enrollments"
	// NodeBuckets is how many collections hold the nodes; part of the storage layout.
	NodeBuckets = 32
)

// NodeCollection returns the collection that holds node id's document in s.
func NodeCollection(s *store.Store, id string) *mongo.Collection {
	return buckets.New(s.DB(), NodesCollection, NodeBuckets).For(id)
}

// Defaults of [Config].
const (
	DefaultNodeTTL       = 45 * time.Second
	DefaultEnrollmentTTL = time.Hour
	MaxEnrollmentTTL     = 7 * 24 * time.Hour
)

// Config configures a [Registry]. The zero value works.
type Config struct {
	// NodeTTL is how long a heartbeat keeps a node online for placement; zero means 45 s.
	NodeTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Registry reads and writes placement nodes and their enrollment tokens. Every change to a node is
// one compare-and-set on its document. Safe for concurrent use by several berthd processes.
type Registry struct {
	nodes   *buckets.Set
	view    *store.View // the store's read view: Get and List read it
	enroll  *mongo.Collection
	ttl     time.Duration
	now     func() time.Time
	changes atomic.Int64
}

// Changes returns how many declaration, drain or credential changes this Registry has written,
// heartbeats of nodes that were offline included (heartbeats that only extend an online node's
// expiry, and reservations, are not counted). Caches of the
// fleet compare it to notice changes made through the same process.
func (r *Registry) Changes() int64 { return r.changes.Load() }

// NewRegistry returns a Registry over s. It does no I/O.
func NewRegistry(s *store.Store, cfg Config) *Registry {
	if cfg.NodeTTL <= 0 {
		cfg.NodeTTL = DefaultNodeTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Registry{nodes: buckets.New(s.DB(), NodesCollection, NodeBuckets), view: s.View(), enroll: s.Collection(EnrollmentsCollection), ttl: cfg.NodeTTL, now: cfg.Now}
}

// Now returns the registry's clock reading (UTC).
func (r *Registry) Now() time.Time { return r.now().UTC() }

// NodeTTL returns how long a heartbeat keeps a node online.
func (r *Registry) NodeTTL() time.Duration { return r.ttl }

type enrollment struct {
	Digest    string     `bson:"_id"`
	NodeID    string     `bson:"node_id"`
	Region    string     `bson:"region"`
	CreatedAt time.Time  `bson:"created_at"`
	ExpiresAt time.Time  `bson:"expires_at"`
	UsedAt    *time.Time `bson:"used_at,omitempty"`
}

// CreateEnrollment makes a one-time enrollment token (prefix bre_) bound to nodeID and region,
// valid for ttl (zero: one hour; at most seven days). The token is returned once; only its digest is
// stored.
func (r *Registry) CreateEnrollment(ctx context.Context, nodeID, region string, ttl time.Duration) (token string, expires time.Time, err error) {
	if !ValidNodeID(nodeID) || len(region) > 63 {
		return "", time.Time{}, fmt.Errorf("runners: enrollment: node id must be a DNS label and region at most 63 bytes")
	}
	if ttl <= 0 {
		ttl = DefaultEnrollmentTTL
	}
	if ttl > MaxEnrollmentTTL {
		return "", time.Time{}, fmt.Errorf("runners: enrollment: ttl over %v", MaxEnrollmentTTL)
	}
	token, digest, err := identity.NewToken(identity.PrefixRunner)
	if err != nil {
		return "", time.Time{}, err
	}
	now := r.Now()
	e := enrollment{Digest: digest, NodeID: nodeID, Region: region, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if _, err := r.enroll.InsertOne(ctx, e); err != nil {
		return "", time.Time{}, fmt.Errorf("runners: store enrollment: %w", err)
	}
	return token, e.ExpiresAt, nil
}

// Register consumes an enrollment token bound to nodeID and d.Region (one conditional update of the
// token's document, so a token works once), then records the node or, for a node id enrolled
// before, rotates its credential and applies d, clearing revocation: re-enrolling a node id restores
// its pinned placements. Leases of the old credential are left to expire. The new credential (prefix
// brn_) is returned once. Errors: [ErrEnrollmentInvalid]; [ErrCapacityInUse] or
// [ErrRequirementInUse] when d contradicts the node's reservations (the token is used up).
func (r *Registry) Register(ctx context.Context, token, nodeID string, d Declaration) (*Node, string, error) {
	defer r.changes.Add(1)
	if !identity.WellFormed(token, identity.PrefixRunner) || !ValidNodeID(nodeID) {
		return nil, "", ErrEnrollmentInvalid
	}
	if err := d.Validate(); err != nil {
		return nil, "", fmt.Errorf("runners: register %s: %w", nodeID, err)
	}
	now := r.Now()
	res := r.enroll.FindOneAndUpdate(ctx,
		bson.M{"_id": identity.Digest(token), "node_id": nodeID, "region": d.Region, "used_at": bson.M{"$exists": false}, "expires_at": bson.M{"$gt": now}},
		bson.M{"$set": bson.M{"used_at": now}})
	if err := res.Err(); errors.Is(err, mongo.ErrNoDocuments) {
		return nil, "", ErrEnrollmentInvalid
	} else if err != nil {
		return nil, "", fmt.Errorf("runners: consume enrollment: %w", err)
	}
	return r.record(ctx, nodeID, d, now)
}

// RegisterLegacy records or rotates node nodeID like [Registry.Register], authorised by the legacy
// shared registration secret instead of a one-time enrollment token; the caller has checked the
// secret ([LegacySecret.Matches]). It can rotate any named node (docs/runner-protocol.md section
// 6.9). Errors: as Register, without ErrEnrollmentInvalid.
func (r *Registry) RegisterLegacy(ctx context.Context, nodeID string, d Declaration) (*Node, string, error) {
	defer r.changes.Add(1)
	if !ValidNodeID(nodeID) {
		return nil, "", fmt.Errorf("runners: register %s: node id must be a DNS label", nodeID)
	}
	if err := d.Validate(); err != nil {
		return nil, "", fmt.Errorf("runners: register %s: %w", nodeID, err)
	}
	return r.record(ctx, nodeID, d, r.Now())
}

// record inserts node nodeID or rotates its credential and applies d (one compare-and-set).
func (r *Registry) record(ctx context.Context, nodeID string, d Declaration, now time.Time) (*Node, string, error) {
	cred, digest, err := identity.NewToken(identity.PrefixNode)
	if err != nil {
		return nil, "", err
	}
	var out *Node
	err = store.RetryOnConflict(ctx, func() error {
		n, err := r.Get(ctx, nodeID)
		if errors.Is(err, ErrNotFound) {
			n = &Node{ID: nodeID, Region: d.Region, Endpoint: d.Endpoint, Capacity: d.Capacity, Labels: d.Labels,
				CredentialDigest: digest, EnrolledAt: now, LastHeartbeatAt: now, ExpiresAt: now.Add(r.ttl),
				Reservations: map[string]Reservation{}}
			if _, err := r.nodes.For(nodeID).InsertOne(ctx, n); store.IsDuplicateKey(err) {
				return fmt.Errorf("runners: record node %s: enrolled meanwhile: %w", nodeID, store.ErrConflict)
			} else if err != nil {
				return fmt.Errorf("runners: record node %s: %w", nodeID, err)
			}
			out = n
			return nil
		}
		if err != nil {
			return err
		}
		if err := CheckDeclaration(n, d); err != nil {
			return fmt.Errorf("runners: register %s: %w", nodeID, err)
		}
		set := declSet(d)
		set["credential_digest"], set["revoked"], set["last_heartbeat_at"], set["expires_at"] = digest, false, now, now.Add(r.ttl)
		rev, err := store.UpdateIfRevision(ctx, r.nodes.For(nodeID), nodeID, n.Revision, bson.M{"$set": set})
		if err != nil {
			return fmt.Errorf("runners: rotate credential of %s: %w", nodeID, err)
		}
		n.Region, n.Endpoint, n.Capacity, n.Labels, n.CredentialDigest, n.Revoked = d.Region, d.Endpoint, d.Capacity, d.Labels, digest, false
		n.LastHeartbeatAt, n.ExpiresAt, n.Revision = now, now.Add(r.ttl), rev
		out = n
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, cred, nil
}

func declSet(d Declaration) bson.M {
	return bson.M{"region": d.Region, "endpoint": d.Endpoint, "capacity": d.Capacity, "labels": d.Labels}
}

// Authenticate returns node nodeID when cred is its current credential and it is not revoked;
// every failure is exactly [ErrUnauthenticated] (a store failure is returned wrapped).
func (r *Registry) Authenticate(ctx context.Context, nodeID, cred string) (*Node, error) {
	if !identity.WellFormed(cred, identity.PrefixNode) || !ValidNodeID(nodeID) {
		return nil, ErrUnauthenticated
	}
	n, err := r.Get(ctx, nodeID)
	if errors.Is(err, ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, err
	}
	if n.Revoked || !identity.CheckBearer(cred, identity.PrefixNode, n.CredentialDigest) {
		return nil, ErrUnauthenticated
	}
	return n, nil
}

// Get returns one node, from the store's read view (a decision on it is a compare-and-set on the
// node's revision). Errors: wrapping [ErrNotFound].
func (r *Registry) Get(ctx context.Context, id string) (*Node, error) {
	var n Node
	err := r.view.Get(ctx, r.nodes.For(id), id, &n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("runners: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("runners: get %s: %w", id, err)
	}
	return &n, nil
}

// List returns every node, ordered by id, from the store's read view.
func (r *Registry) List(ctx context.Context) ([]Node, error) {
	out := []Node{}
	for _, c := range r.nodes.All() {
		var part []Node
		if err := r.view.Find(ctx, c, nil, &part); err != nil {
			return nil, fmt.Errorf("runners: list: %w", err)
		}
		out = append(out, part...)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Find returns the nodes matching a MongoDB filter on the node document's fields, ordered by id.
// It queries the store (every bucket is scanned on the embedded store): hot paths use [Registry.List]
// and filter in memory.
func (r *Registry) Find(ctx context.Context, filter bson.M) ([]Node, error) {
	out, err := buckets.Find[Node](ctx, r.nodes, filter)
	if err != nil {
		return nil, fmt.Errorf("runners: list: %w", err)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// update re-reads node id, asks decide for a $set and writes it with one compare-and-set,
// re-deciding after a lost race. decide may return nil to write nothing.
func (r *Registry) update(ctx context.Context, id string, decide func(n *Node, now time.Time) (bson.M, error)) (*Node, error) {
	var out *Node
	written := false
	err := store.RetryOnConflict(ctx, func() error {
		n, err := r.Get(ctx, id)
		if err != nil {
			return err
		}
		set, err := decide(n, r.Now())
		if err != nil || set == nil {
			out = n
			return err
		}
		if _, err = store.UpdateIfRevision(ctx, r.nodes.For(id), id, n.Revision, bson.M{"$set": set}); err != nil {
			return fmt.Errorf("runners: update %s: %w", id, err)
		}
		written = true
		return nil
	})
	if !written {
		return out, err // decide's answer, or the lost races
	}
	return r.Get(ctx, id)
}

// HeartbeatRequest is what [Registry.Heartbeat] applies.
type HeartbeatRequest struct {
	// Declaration, when not nil, replaces what the node advertises (checked like at registration).
	Declaration *Declaration
	// Draining, when not nil, sets or clears draining.
	Draining *bool
}

// Heartbeat authenticates the node and, in one compare-and-set, extends its expiry by the node TTL
// and applies req. Errors: [ErrUnauthenticated], [ErrCapacityInUse], [ErrRequirementInUse].
func (r *Registry) Heartbeat(ctx context.Context, nodeID, cred string, req HeartbeatRequest) (*Node, error) {
	if req.Declaration != nil || req.Draining != nil {
		defer r.changes.Add(1)
	}
	if _, err := r.Authenticate(ctx, nodeID, cred); err != nil {
		return nil, err
	}
	if req.Declaration != nil {
		if err := req.Declaration.Validate(); err != nil {
			return nil, fmt.Errorf("runners: heartbeat %s: %w", nodeID, err)
		}
	}
	digest := identity.Digest(cred)
	return r.update(ctx, nodeID, func(n *Node, now time.Time) (bson.M, error) {
		if n.Revoked || !identity.Equal(n.CredentialDigest, digest) {
			return nil, ErrUnauthenticated // rotated or revoked meanwhile
		}
		set := bson.M{"last_heartbeat_at": now, "expires_at": now.Add(r.ttl)}
		if n.Offline(now) {
			r.changes.Add(1) // back online: caches of the fleet must see it
		}
		if req.Declaration != nil {
			if err := CheckDeclaration(n, *req.Declaration); err != nil {
				return nil, fmt.Errorf("runners: heartbeat %s: %w", nodeID, err)
			}
			for k, v := range declSet(*req.Declaration) {
				set[k] = v
			}
		}
		if req.Draining != nil {
			set["draining"] = *req.Draining
		}
		return set, nil
	})
}

// SetDraining sets or clears draining (operator action). A draining node keeps its placements and
// leases but receives no new placement and no claim once the change commits.
func (r *Registry) SetDraining(ctx context.Context, nodeID string, draining bool) (*Node, error) {
	defer r.changes.Add(1)
	return r.update(ctx, nodeID, func(*Node, time.Time) (bson.M, error) { return bson.M{"draining": draining}, nil })
}

// Revoke revokes the node's credential (operator action): it authenticates no more and is
// unavailable for placement until it enrolls again.
func (r *Registry) Revoke(ctx context.Context, nodeID string) (*Node, error) {
	defer r.changes.Add(1)
	return r.update(ctx, nodeID, func(*Node, time.Time) (bson.M, error) {
		return bson.M{"revoked": true, "credential_digest": ""}, nil
	})
}

// ClaimGate is the linearisation point of a claim: one conditional update of the node's document
// that succeeds only while cred is current, the node is not revoked, not draining and online. A drain
// that commits before it refuses the claim; claims that passed it before the drain committed finish.
// Errors: [ErrUnauthenticated], [ErrDraining], or wrapping [ErrNotFound] for an offline node.
func (r *Registry) ClaimGate(ctx context.Context, nodeID, cred string) (*Node, error) {
	n, err := r.Authenticate(ctx, nodeID, cred)
	if err != nil {
		return nil, err
	}
	now := r.Now()
	res, err := r.nodes.For(nodeID).UpdateOne(ctx, bson.M{"_id": nodeID, "credential_digest": n.CredentialDigest, "revoked": false,
		"draining": false, "expires_at": bson.M{"$gt": now}}, bson.M{"$inc": bson.M{"claims": int64(1)}})
	if err != nil {
		return nil, fmt.Errorf("runners: claim gate %s: %w", nodeID, err)
	}
	if res.MatchedCount == 1 {
		return n, nil
	}
	if n.Draining {
		return nil, ErrDraining
	}
	return nil, fmt.Errorf("runners: %s is offline; heartbeat first: %w", nodeID, ErrNotFound)
}

// Reserve adds or resizes key's reservation on node id with one compare-and-set on the node's
// document, so two control planes can never both take its last unit. Errors: wrapping [ErrNoFit]
// when the node cannot take it; wrapping [store.ErrConflict] when the node kept changing.
func (r *Registry) Reserve(ctx context.Context, id, key string, res Reservation, fits Fits) (*Node, error) {
	return r.update(ctx, id, func(n *Node, _ time.Time) (bson.M, error) {
		if cur, ok := n.Reservations[key]; ok && cur.Units == res.Units && cur.Endpoint == res.Endpoint && equalLabels(cur.Labels, res.Labels) {
			return nil, nil
		}
		l, total, err := Reserve(n, key, res, fits)
		if err != nil {
			return nil, fmt.Errorf("runners: reserve %d units on %s: %w", res.Units, id, err)
		}
		return bson.M{"reservations": l, "reserved": total}, nil
	})
}

// TryReserve is one attempt of [Registry.Reserve] against the node as the caller read it: it
// decides on n and writes with one compare-and-set on n.Revision. It returns the node as written
// (a copy; n is not modified). Errors: wrapping [ErrNoFit], or wrapping [store.ErrConflict] when
// the node changed since it was read (the caller re-reads and re-selects).
func (r *Registry) TryReserve(ctx context.Context, n *Node, key string, res Reservation, fits Fits) (*Node, error) {
	l, total, err := Reserve(n, key, res, fits)
	if err != nil {
		return nil, fmt.Errorf("runners: reserve %d units on %s: %w", res.Units, n.ID, err)
	}
	rev, err := store.UpdateIfRevision(ctx, r.nodes.For(n.ID), n.ID, n.Revision, bson.M{"$set": bson.M{"reservations": l, "reserved": total}})
	if err != nil {
		return nil, fmt.Errorf("runners: reserve on %s: %w", n.ID, err)
	}
	out := *n
	out.Reservations, out.Reserved, out.Revision = l, total, rev
	return &out, nil
}

// Unreserve removes key's reservation from node id, if any. A missing node is success.
func (r *Registry) Unreserve(ctx context.Context, id, key string) error {
	_, err := r.update(ctx, id, func(n *Node, _ time.Time) (bson.M, error) {
		l, total, changed := Unreserve(n, key)
		if !changed {
			return nil, nil
		}
		return bson.M{"reservations": l, "reserved": total}, nil
	})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
