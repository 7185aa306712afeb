package operations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per operation.
const Collection = "operations"

// MaxPayloadBytes bounds an operation's JSON payload and its completion result.
const MaxPayloadBytes = 64 << 10

// PrefixLease is the prefix of operation lease tokens.
const PrefixLease = "brl_"

// FenceSequence returns the name of a project's fence sequence in the store's sequences collection.
func FenceSequence(projectID string) string { return "fence:" + projectID }

// Operation is a document in collection "operations".
type Operation struct {
	ID             string    `bson:"_id" json:"id"`
	ProjectID      string    `bson:"project_id" json:"project_id"`
	Kind           string    `bson:"kind" json:"kind"`
	IdempotencyKey string    `bson:"idempotency_key" json:"idempotency_key"`
	RequestDigest  string    `bson:"request_digest" json:"-"`
	Payload        string    `bson:"payload" json:"-"`                         // canonical JSON, never secret
	TargetNode     string    `bson:"target_node" json:"target_node,omitempty"` // empty: any node
	State          State     `bson:"state" json:"state"`
	Attempts       int       `bson:"attempts" json:"attempts"`
	MaxAttempts    int       `bson:"max_attempts" json:"max_attempts"`
	AvailableAt    time.Time `bson:"available_at" json:"available_at"`
	NodeID         string    `bson:"node_id" json:"node_id,omitempty"`
	TokenDigest    string    `bson:"token_digest" json:"-"`
	LeaseExpiresAt time.Time `bson:"lease_expires_at" json:"lease_expires_at,omitzero"`
	Fence          int64     `bson:"fence" json:"fence"`
	LastError      string    `bson:"last_error" json:"last_error,omitempty"`
	Result         string    `bson:"result" json:"-"`
	CreatedAt      time.Time `bson:"created_at" json:"created_at"`
	UpdatedAt      time.Time `bson:"updated_at" json:"updated_at"`
	Revision       int64     `bson:"revision" json:"revision"`
}

func (o *Operation) status() Status {
	return Status{State: o.State, Attempts: o.Attempts, MaxAttempts: o.MaxAttempts, AvailableAt: o.AvailableAt,
		NodeID: o.NodeID, TokenDigest: o.TokenDigest, LeaseExpiresAt: o.LeaseExpiresAt, Fence: o.Fence, LastError: o.LastError}
}

func statusSet(s Status, now time.Time) bson.M {
	return bson.M{"state": s.State, "attempts": s.Attempts, "available_at": s.AvailableAt, "node_id": s.NodeID,
		"token_digest": s.TokenDigest, "lease_expires_at": s.LeaseExpiresAt, "fence": s.Fence, "last_error": s.LastError,
		"updated_at": now}
}

func (o *Operation) setStatus(s Status, now time.Time) {
	o.State, o.Attempts, o.AvailableAt, o.NodeID = s.State, s.Attempts, s.AvailableAt, s.NodeID
	o.TokenDigest, o.LeaseExpiresAt, o.Fence, o.LastError, o.UpdatedAt = s.TokenDigest, s.LeaseExpiresAt, s.Fence, s.LastError, now
}

// Config configures a [Queue]. The zero value works.
type Config struct {
	Policy Policy
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Queue is the durable operation queue. Every state change is one compare-and-set on the
// operation's document; fences come from [store.NextSequence] on [FenceSequence]. Safe for
// concurrent use by any number of berthd processes on one store.
type Queue struct {
	st     *store.Store
	coll   *mongo.Collection
	policy Policy
	now    func() time.Time
}

// NewQueue returns a Queue over s. It does no I/O.
func NewQueue(s *store.Store, cfg Config) *Queue {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Queue{st: s, coll: s.Collection(Collection), policy: cfg.Policy.withDefaults(), now: cfg.Now}
}

// Policy returns the queue's timing and attempt rules.
func (q *Queue) Policy() Policy { return q.policy }

// EnsureIndexes creates the unique (project_id, idempotency_key) index and the claim index; idempotent.
func (q *Queue) EnsureIndexes(ctx context.Context) error {
	// One index per call: FerretDB v1 panics on a createIndexes of several indexes that exist already.
	for _, m := range []mongo.IndexModel{
		{Keys: bson.D{{Key: "project_id", Value: 1}, {Key: "idempotency_key", Value: 1}},
			Options: options.Index().SetUnique(true).SetName("project_idempotency_key")},
		{Keys: bson.D{{Key: "state", Value: 1}, {Key: "available_at", Value: 1}}, Options: options.Index().SetName("claim")},
	} {
		if _, err := q.coll.Indexes().CreateOne(ctx, m); err != nil {
			return fmt.Errorf("operations: create indexes: %w", err)
		}
	}
	return nil
}

// EnqueueRequest describes one operation to enqueue.
type EnqueueRequest struct {
	ProjectID string
	// Kind names the work, e.g. "reconcile"; required.
	Kind string
	// IdempotencyKey makes the request converge: a repeat with the same key and the same kind,
	// payload and target returns the first operation. Required, at most 200 bytes.
	IdempotencyKey string
	// Payload is the operation's canonical JSON input (no secrets), at most [MaxPayloadBytes].
	// Nil means {}.
	Payload json.RawMessage
	// TargetNode restricts claims to one node; empty lets any node claim.
	TargetNode string
	// MaxAttempts is the attempt limit; zero means the policy's.
	MaxAttempts int
}

// Enqueue records an operation in state queued, or returns the one recorded earlier under the same
// idempotency key (created is false). Errors: wrapping [ErrIdempotencyKeyReused] when the key was
// used for another request; a validation error for a missing kind or key or an oversized payload.
func (q *Queue) Enqueue(ctx context.Context, req EnqueueRequest) (op *Operation, created bool, err error) {
	if req.ProjectID == "" || req.Kind == "" || req.IdempotencyKey == "" || len(req.IdempotencyKey) > 200 {
		return nil, false, fmt.Errorf("operations: enqueue: project, kind and an idempotency key of at most 200 bytes are required")
	}
	if req.Payload == nil {
		req.Payload = json.RawMessage("{}")
	}
	if len(req.Payload) > MaxPayloadBytes || !json.Valid(req.Payload) {
		return nil, false, fmt.Errorf("operations: enqueue: payload must be JSON of at most %d bytes", MaxPayloadBytes)
	}
	if req.MaxAttempts <= 0 {
		req.MaxAttempts = q.policy.MaxAttempts
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%q\x00%q\x00%d\x00%s", req.Kind, req.TargetNode, req.MaxAttempts, req.Payload))
	digest := hex.EncodeToString(sum[:])
	now := q.now().UTC()
	o := &Operation{
		ID: identity.NewID(identity.IDPrefixOperation), ProjectID: req.ProjectID, Kind: req.Kind,
		IdempotencyKey: req.IdempotencyKey, RequestDigest: digest, Payload: string(req.Payload), TargetNode: req.TargetNode,
		State: Queued, MaxAttempts: req.MaxAttempts, AvailableAt: now, CreatedAt: now, UpdatedAt: now,
	}
	_, err = q.coll.InsertOne(ctx, o)
	if err == nil {
		return o, true, nil
	}
	if !store.IsDuplicateKey(err) {
		return nil, false, fmt.Errorf("operations: enqueue %s: %w", req.Kind, err)
	}
	var prev Operation
	if err := q.coll.FindOne(ctx, bson.M{"project_id": req.ProjectID, "idempotency_key": req.IdempotencyKey}).Decode(&prev); err != nil {
		return nil, false, fmt.Errorf("operations: enqueue %s: read the operation of the idempotency key: %w", req.Kind, err)
	}
	if !identity.Equal(prev.RequestDigest, digest) {
		return nil, false, fmt.Errorf("operations: enqueue %s: %w", req.Kind, ErrIdempotencyKeyReused)
	}
	return &prev, false, nil
}

// Get returns one operation. Errors: wrapping [ErrNotFound].
func (q *Queue) Get(ctx context.Context, id string) (*Operation, error) {
	var o Operation
	err := store.FindByID(ctx, q.coll, id, &o)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("operations: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("operations: get %s: %w", id, err)
	}
	return &o, nil
}

// List returns a project's operations, oldest first (every project's when projectID is empty).
func (q *Queue) List(ctx context.Context, projectID string) ([]Operation, error) {
	filter := bson.M{}
	if projectID != "" {
		filter["project_id"] = projectID
	}
	cur, err := q.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "created_at", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	out := []Operation{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	return out, nil
}

// Claimed is one operation handed to a node by [Queue.Claim], with its lease token in clear (shown
// once; only its digest is stored).
type Claimed struct {
	Operation  Operation
	LeaseToken string
}

// Claim leases up to max claimable operations to nodeID: queued or retry operations whose delay has
// passed and leased operations whose lease expired, restricted to those targeting nodeID or no node,
// oldest first. Each claim draws a new fence from the project's sequence (a reclaim too) and is one
// compare-and-set on the operation; a lost race skips the operation, so a fence value may go unused
// but none is ever given twice. Operations whose attempts are exhausted are failed on the way.
// eligible, when not nil, filters candidates (placement requirements); it must be pure.
// The caller has authenticated the node and checked that it may claim (not draining, not expired).
func (q *Queue) Claim(ctx context.Context, nodeID string, max int, eligible func(*Operation) bool) ([]Claimed, error) {
	if max <= 0 {
		return nil, nil
	}
	now := q.now().UTC()
	filter := bson.M{
		"target_node": bson.M{"$in": bson.A{nodeID, ""}},
		"$or": bson.A{
			bson.M{"state": bson.M{"$in": bson.A{Queued, Retry}}, "available_at": bson.M{"$lte": now}},
			bson.M{"state": Leased, "lease_expires_at": bson.M{"$lte": now}},
		},
	}
	cur, err := q.coll.Find(ctx, filter, options.Find().
		SetSort(bson.D{{Key: "created_at", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(max*4+8)))
	if err != nil {
		return nil, fmt.Errorf("operations: claim for %s: %w", nodeID, err)
	}
	var cands []Operation
	if err := cur.All(ctx, &cands); err != nil {
		return nil, fmt.Errorf("operations: claim for %s: %w", nodeID, err)
	}
	var out []Claimed
	for i := range cands {
		if len(out) >= max {
			break
		}
		o := &cands[i]
		if !Claimable(o.status(), now) || (eligible != nil && !eligible(o)) {
			continue
		}
		if o.Attempts >= o.MaxAttempts {
			next, _ := Claim(q.policy, o.status(), nodeID, "", o.Fence, now)
			if _, err := store.UpdateIfRevision(ctx, q.coll, o.ID, o.Revision, bson.M{"$set": statusSet(next, now)}); err != nil && !errors.Is(err, store.ErrConflict) {
				return out, fmt.Errorf("operations: fail exhausted %s: %w", o.ID, err)
			}
			continue
		}
		fence, err := store.NextSequence(ctx, q.st, FenceSequence(o.ProjectID))
		if err != nil {
			return out, fmt.Errorf("operations: claim %s: %w", o.ID, err)
		}
		token, digest, err := identity.NewToken(PrefixLease)
		if err != nil {
			return out, err
		}
		next, _ := Claim(q.policy, o.status(), nodeID, digest, fence, now)
		rev, err := store.UpdateIfRevision(ctx, q.coll, o.ID, o.Revision, bson.M{"$set": statusSet(next, now)})
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("operations: claim %s: %w", o.ID, err)
		}
		o.setStatus(next, now)
		o.Revision = rev
		out = append(out, Claimed{Operation: *o, LeaseToken: token})
	}
	return out, nil
}

// casLoop reads operation id, asks decide for the next status and writes it with one
// compare-and-set, re-reading after a lost race (a concurrent renewal of the same lease).
func (q *Queue) casLoop(ctx context.Context, id string, extra bson.M, decide func(Status, time.Time) (Status, error)) (*Operation, error) {
	for attempt := 0; ; attempt++ {
		o, err := q.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		now := q.now().UTC()
		next, err := decide(o.status(), now)
		if err != nil {
			return nil, fmt.Errorf("operations: %s: %w", id, err)
		}
		set := statusSet(next, now)
		for k, v := range extra {
			set[k] = v
		}
		rev, err := store.UpdateIfRevision(ctx, q.coll, id, o.Revision, bson.M{"$set": set})
		if errors.Is(err, store.ErrConflict) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("operations: update %s: %w", id, err)
		}
		o.setStatus(next, now)
		o.Revision = rev
		return o, nil
	}
}

// Renew extends h's lease on operation id by the lease TTL. Errors: wrapping [ErrLeaseLost].
func (q *Queue) Renew(ctx context.Context, id string, h Holder) (*Operation, error) {
	return q.casLoop(ctx, id, nil, func(s Status, now time.Time) (Status, error) { return Renew(q.policy, s, h, now) })
}

// Complete settles operation id as succeeded with result (bounded JSON, never secret; nil means
// null). Errors: wrapping [ErrLeaseLost] for a stale holder (a late completion after a reclaim).
func (q *Queue) Complete(ctx context.Context, id string, h Holder, result json.RawMessage) (*Operation, error) {
	if result == nil {
		result = json.RawMessage("null")
	}
	if len(result) > MaxPayloadBytes || !json.Valid(result) {
		return nil, fmt.Errorf("operations: complete %s: result must be JSON of at most %d bytes", id, MaxPayloadBytes)
	}
	return q.casLoop(ctx, id, bson.M{"result": string(result)}, func(s Status, now time.Time) (Status, error) { return Complete(s, h, now) })
}

// Fail settles a failed attempt of h on operation id (retry with backoff, or failed). msg is bounded
// non-secret text. Errors: wrapping [ErrLeaseLost].
func (q *Queue) Fail(ctx context.Context, id string, h Holder, msg string, retryable bool) (*Operation, error) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return q.casLoop(ctx, id, nil, func(s Status, now time.Time) (Status, error) { return Fail(q.policy, s, h, now, msg, retryable) })
}

// Sweep moves every leased operation whose lease expired to retry, or to failed when its attempts
// are exhausted, and returns how many it changed. Claims reclaim expired leases by themselves; the
// sweep makes exhaustion visible without a claimer.
func (q *Queue) Sweep(ctx context.Context) (int, error) {
	now := q.now().UTC()
	cur, err := q.coll.Find(ctx, bson.M{"state": Leased, "lease_expires_at": bson.M{"$lte": now}})
	if err != nil {
		return 0, fmt.Errorf("operations: sweep: %w", err)
	}
	var ops []Operation
	if err := cur.All(ctx, &ops); err != nil {
		return 0, fmt.Errorf("operations: sweep: %w", err)
	}
	n := 0
	for _, o := range ops {
		next, changed := Expire(o.status(), now)
		if !changed {
			continue
		}
		if _, err := store.UpdateIfRevision(ctx, q.coll, o.ID, o.Revision, bson.M{"$set": statusSet(next, now)}); err == nil {
			n++
		} else if !errors.Is(err, store.ErrConflict) {
			return n, fmt.Errorf("operations: sweep %s: %w", o.ID, err)
		}
	}
	return n, nil
}

// RetargetProject points every non-terminal operation of a project at node (portable failover), so
// the next claim by that node takes them. Idempotent.
func (q *Queue) RetargetProject(ctx context.Context, projectID, node string) error {
	_, err := q.coll.UpdateMany(ctx,
		bson.M{"project_id": projectID, "state": bson.M{"$in": bson.A{Queued, Retry, Leased}}, "target_node": bson.M{"$nin": bson.A{node, ""}}},
		bson.M{"$set": bson.M{"target_node": node}, "$inc": bson.M{"revision": int64(1)}})
	if err != nil {
		return fmt.Errorf("operations: retarget %s to %s: %w", projectID, node, err)
	}
	return nil
}

// RevokeProject fails every non-terminal operation of the project and then removes its fence
// sequence, in that order: the sequence is removed only once no operation of the project can be
// claimed, renewed or settled any more. Run it under the project's lease. Idempotent; an error
// leaves the sequence in place.
func (q *Queue) RevokeProject(ctx context.Context, projectID string) error {
	ops, err := q.List(ctx, projectID)
	if err != nil {
		return err
	}
	for _, o := range ops {
		if _, err := q.casLoop(ctx, o.ID, nil, func(s Status, _ time.Time) (Status, error) {
			next, _ := Revoke(s)
			return next, nil
		}); err != nil {
			return fmt.Errorf("operations: revoke %s: %w", o.ID, err)
		}
	}
	n, err := q.coll.CountDocuments(ctx, bson.M{"project_id": projectID, "state": bson.M{"$in": bson.A{Queued, Retry, Leased}}})
	if err != nil {
		return fmt.Errorf("operations: revoke %s: count: %w", projectID, err)
	}
	if n > 0 {
		return fmt.Errorf("operations: revoke %s: %d operations were enqueued meanwhile; the fence sequence stays", projectID, n)
	}
	if _, err := q.st.Collection(store.SequencesCollection).DeleteOne(ctx, bson.M{"_id": FenceSequence(projectID)}); err != nil {
		return fmt.Errorf("operations: remove the fence sequence of %s: %w", projectID, err)
	}
	return nil
}

// PayloadJSON returns the operation's canonical JSON payload.
func (o *Operation) PayloadJSON() json.RawMessage { return json.RawMessage(o.Payload) }

// Check returns operation id when h holds its current, unexpired lease, and changes nothing. The
// artifact call uses it to authenticate a lease before and after provider I/O
// (docs/runner-protocol.md section 6). Errors: wrapping [ErrLeaseLost] (an unknown id included).
func (q *Queue) Check(ctx context.Context, id string, h Holder) (*Operation, error) {
	o, err := q.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("operations: %s: %w", id, ErrLeaseLost)
	}
	if err != nil {
		return nil, err
	}
	if !current(o.status(), h, q.now().UTC()) {
		return nil, fmt.Errorf("operations: %s: %w", id, ErrLeaseLost)
	}
	return o, nil
}
