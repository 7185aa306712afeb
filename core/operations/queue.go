package operations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/buckets"
)

// Collections of the queue. Live operations (queued, leased, retry) are spread over
// [LiveBuckets] collections "operations_bNN" by a hash of the operation id; a settled operation is
// moved to ArchiveCollection, so claims, sweeps and compare-and-sets never scan history
// (docs/runner-protocol.md section 5.3). KeysCollection holds one document per idempotency key.
const (
	Collection        = "operations"
	ArchiveCollection = "operations_done"
	KeysCollection    = "operation_keys"
	// LiveBuckets is how many collections hold live operations; part of the storage layout.
	LiveBuckets = 16
)

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
	// Lane is the claim-lane slot the operation is queued under while queued or retry; empty while
	// leased, settled, or parked until a retry delay passes (lanes.go).
	Lane      string    `bson:"lane" json:"-"`
	CreatedAt time.Time `bson:"created_at" json:"created_at"`
	UpdatedAt time.Time `bson:"updated_at" json:"updated_at"`
	Revision  int64     `bson:"revision" json:"revision"`
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
	st      *store.Store
	live    *buckets.Set
	archive *mongo.Collection
	keys    *mongo.Collection
	lanes   *mongo.Collection
	policy  Policy
	now     func() time.Time

	mu          sync.Mutex
	nextDue     time.Time // the earliest lease expiry or retry this process knows of; mu must be held
	lastPromote time.Time // when a claim last scanned for due work; mu must be held
}

// NewQueue returns a Queue over s. It does no I/O.
func NewQueue(s *store.Store, cfg Config) *Queue {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Queue{st: s, live: buckets.New(s.DB(), Collection, LiveBuckets), archive: s.Collection(ArchiveCollection),
		keys: s.Collection(KeysCollection), lanes: s.Collection(LanesCollection), policy: cfg.Policy.withDefaults(), now: cfg.Now}
}

// Policy returns the queue's timing and attempt rules.
func (q *Queue) Policy() Policy { return q.policy }

// EnsureIndexes creates the archive's project index (listing); idempotent. Live operations are
// read by id or by a scan of their small buckets, and idempotency keys by id.
func (q *Queue) EnsureIndexes(ctx context.Context) error {
	m := mongo.IndexModel{Keys: bson.D{{Key: "project_id", Value: 1}, {Key: "created_at", Value: 1}}, Options: options.Index().SetName("project")}
	if _, err := q.archive.Indexes().CreateOne(ctx, m); err != nil {
		return fmt.Errorf("operations: create indexes: %w", err)
	}
	return nil
}

// keyRecord is a document in [KeysCollection]: the intent record of an enqueue, written before the
// operation itself, so a repeat of the request converges on one operation even after a crash
// between the two writes.
type keyRecord struct {
	ID        string    `bson:"_id"` // keyID(project, key)
	Operation Operation `bson:"operation"`
}

func keyID(projectID, key string) string {
	sum := sha256.Sum256([]byte(projectID + "\x00" + key))
	return hex.EncodeToString(sum[:])
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
	digest := requestDigest(req.Kind, req.TargetNode, req.MaxAttempts, req.Payload)
	now := q.now().UTC()
	lane, err := q.nextSlot(ctx, req.TargetNode)
	if err != nil {
		return nil, false, err
	}
	o := &Operation{
		ID: identity.NewID(identity.IDPrefixOperation), ProjectID: req.ProjectID, Kind: req.Kind,
		IdempotencyKey: req.IdempotencyKey, RequestDigest: digest, Payload: string(req.Payload), TargetNode: req.TargetNode,
		State: Queued, MaxAttempts: req.MaxAttempts, AvailableAt: now, CreatedAt: now, UpdatedAt: now, Lane: lane,
	}
	// 1. The intent: the key record holds the whole operation; it exists once per key.
	_, err = q.keys.InsertOne(ctx, keyRecord{ID: keyID(req.ProjectID, req.IdempotencyKey), Operation: *o})
	switch {
	case err == nil:
		created = true
	case store.IsDuplicateKey(err):
		var prev keyRecord
		if err := store.FindByID(ctx, q.keys, keyID(req.ProjectID, req.IdempotencyKey), &prev); err != nil {
			return nil, false, fmt.Errorf("operations: enqueue %s: read the operation of the idempotency key: %w", req.Kind, err)
		}
		if !identity.Equal(prev.Operation.RequestDigest, digest) {
			return nil, false, fmt.Errorf("operations: enqueue %s: %w", req.Kind, ErrIdempotencyKeyReused)
		}
		if cur, err := q.Get(ctx, prev.Operation.ID); err == nil {
			return cur, false, nil
		} else if !errors.Is(err, ErrNotFound) {
			return nil, false, err
		}
		// The first request stopped between its two writes (or is between them now): finish it.
		o = &prev.Operation
	default:
		return nil, false, fmt.Errorf("operations: enqueue %s: %w", req.Kind, err)
	}
	// 2. The operation itself, idempotent under its id.
	if _, err := q.live.For(o.ID).InsertOne(ctx, o); err != nil && !store.IsDuplicateKey(err) {
		return nil, false, fmt.Errorf("operations: enqueue %s: %w", req.Kind, err)
	}
	// 3. Its slot in the claim lane (the sweep queues it again if this step is lost).
	if err := q.publish(ctx, o); err != nil {
		return nil, false, err
	}
	if !created {
		cur, err := q.Get(ctx, o.ID)
		return cur, false, err
	}
	return o, true, nil
}

// requestDigest identifies what an enqueue asks for; a repeat of its idempotency key must match it.
func requestDigest(kind, target string, maxAttempts int, payload json.RawMessage) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%q\x00%q\x00%d\x00%s", kind, target, maxAttempts, payload))
	return hex.EncodeToString(sum[:])
}

// Get returns one operation. Errors: wrapping [ErrNotFound].
func (q *Queue) Get(ctx context.Context, id string) (*Operation, error) {
	o, err := q.getLive(ctx, id)
	if !errors.Is(err, ErrNotFound) {
		return o, err
	}
	// Settled operations are moved: inserted into the archive before they leave the live set,
	// so reading the live set first and the archive second never misses one.
	var a Operation
	err = store.FindByID(ctx, q.archive, id, &a)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("operations: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("operations: get %s: %w", id, err)
	}
	return &a, nil
}

// getLive reads operation id from the live set only. Errors: wrapping [ErrNotFound].
func (q *Queue) getLive(ctx context.Context, id string) (*Operation, error) {
	var o Operation
	err := q.st.View().Get(ctx, q.live.For(id), id, &o)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("operations: %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("operations: get %s: %w", id, err)
	}
	return &o, nil
}

// archiveOp moves a settled operation out of the live set: insert into the archive (a repeat is
// success), then delete the live document. Idempotent; the sweep finishes a move a crash stopped.
func (q *Queue) archiveOp(ctx context.Context, o *Operation) error {
	if !o.State.Terminal() {
		return nil
	}
	if _, err := q.archive.InsertOne(ctx, o); err != nil && !store.IsDuplicateKey(err) {
		return fmt.Errorf("operations: archive %s: %w", o.ID, err)
	}
	if _, err := q.live.For(o.ID).DeleteOne(ctx, bson.D{{Key: "_id", Value: o.ID}}); err != nil {
		return fmt.Errorf("operations: archive %s: %w", o.ID, err)
	}
	return nil
}

// sortOps orders operations oldest first.
func sortOps(ops []Operation) {
	slices.SortFunc(ops, func(a, b Operation) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// List returns a project's operations, oldest first (every project's when projectID is empty).
func (q *Queue) List(ctx context.Context, projectID string) ([]Operation, error) {
	filter := bson.M{}
	if projectID != "" {
		filter["project_id"] = projectID
	}
	live, err := buckets.Find[Operation](ctx, q.live, filter)
	if err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	cur, err := q.archive.Find(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	var done []Operation
	if err := cur.All(ctx, &done); err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	// An operation caught between the archive insert and the live delete appears once.
	seen := make(map[string]bool, len(live))
	out := make([]Operation, 0, len(live)+len(done))
	for _, o := range live {
		seen[o.ID] = true
		out = append(out, o)
	}
	for _, o := range done {
		if !seen[o.ID] {
			out = append(out, o)
		}
	}
	sortOps(out)
	return out, nil
}

// Claimed is one operation handed to a node by [Queue.Claim], with its lease token in clear (shown
// once; only its digest is stored).
type Claimed struct {
	Operation  Operation
	LeaseToken string
}

// Claim leases up to max claimable operations to nodeID, oldest first: from nodeID's claim lane and
// then from the lane of operations any node may take (lanes.go). When that finds fewer than max, it
// scans once for expired leases and retries that became due (at most every second, or when a due
// time this process knows of has passed) and tries the lanes again. Each claim draws a new fence
// from the project's sequence (a reclaim too) and is one compare-and-set on the operation; a lost
// race skips the operation, so a fence value may go unused but none is ever given twice.
// Operations whose attempts are exhausted are failed on the way. eligible, when not nil, filters
// candidates (placement requirements); it must be pure. The caller has authenticated the node and
// checked that it may claim (not draining, not expired).
func (q *Queue) Claim(ctx context.Context, nodeID string, max int, eligible func(*Operation) bool) ([]Claimed, error) {
	return q.claim(ctx, nodeID, max, eligible, []string{laneOf(nodeID), laneOf("")})
}

// ClaimTargeted is [Queue.Claim] restricted to the operations enqueued with TargetNode nodeID: it
// never takes from the lane of operations any node may take. berthd's own workers (DNS writes,
// docs/dns.md section 6) claim their operations this way under a target no runner node has.
func (q *Queue) ClaimTargeted(ctx context.Context, nodeID string, max int, eligible func(*Operation) bool) ([]Claimed, error) {
	return q.claim(ctx, nodeID, max, eligible, []string{laneOf(nodeID)})
}

func (q *Queue) claim(ctx context.Context, nodeID string, max int, eligible func(*Operation) bool, lanes []string) ([]Claimed, error) {
	if max <= 0 {
		return nil, nil
	}
	now := q.now().UTC()
	var out []Claimed
	for pass := 0; pass < 2 && len(out) < max; pass++ {
		if pass == 1 {
			if !q.promoteDue(now) {
				break
			}
			if n, err := q.promote(ctx, now); err != nil {
				return out, err
			} else if n == 0 {
				break
			}
		}
		for _, lane := range lanes {
			var err error
			if out, err = q.claimLane(ctx, lane, nodeID, max-len(out), eligible, now, out); err != nil {
				return out, fmt.Errorf("operations: claim for %s: %w", nodeID, err)
			}
			if len(out) >= max {
				break
			}
		}
	}
	return out, nil
}

func newLeaseToken() (token, digest string, err error) { return identity.NewToken(PrefixLease) }

// casLoop reads live operation id, asks decide for the next status and writes it with one
// compare-and-set, re-reading after a lost race (a concurrent renewal of the same lease). A settled
// operation is decided on as read from the archive (nothing to write) and a newly settled one is
// moved there.
func (q *Queue) casLoop(ctx context.Context, id string, extra bson.M, decide func(Status, time.Time) (Status, error)) (*Operation, error) {
	var out *Operation
	err := store.RetryOnConflict(ctx, func() error {
		o, err := q.getLive(ctx, id)
		if errors.Is(err, ErrNotFound) {
			if o, err = q.Get(ctx, id); err != nil {
				return err
			}
			if _, err := decide(o.status(), q.now().UTC()); err != nil {
				return fmt.Errorf("operations: %s: %w", id, err)
			}
			out = o
			return nil // settled: no decider changes a terminal status
		}
		if err != nil {
			return err
		}
		now := q.now().UTC()
		next, err := decide(o.status(), now)
		if err != nil {
			return fmt.Errorf("operations: %s: %w", id, err)
		}
		set := statusSet(next, now)
		for k, v := range extra {
			set[k] = v
		}
		// Lanes: a pending operation that became pending, moved to another target, or has no slot
		// is queued under a new slot when it is due; a retry not due yet is parked until a claim or
		// the sweep finds it due; anything else leaves the lanes.
		target := o.TargetNode
		if tn, ok := extra["target_node"].(string); ok {
			target = tn
		}
		lane, publish := "", false
		switch pending := next.State == Queued || next.State == Retry; {
		case pending && now.Before(next.AvailableAt):
			q.noteDue(next.AvailableAt)
		case pending && o.Lane != "" && o.State == next.State && target == o.TargetNode:
			lane = o.Lane
		case pending:
			if lane, err = q.nextSlot(ctx, target); err != nil {
				return err
			}
			publish = true
		}
		set["lane"] = lane
		rev, err := store.UpdateIfRevision(ctx, q.live.For(id), id, o.Revision, bson.M{"$set": set})
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("operations: update %s: settled meanwhile: %w", id, store.ErrConflict) // read it from the archive
		}
		if err != nil {
			return fmt.Errorf("operations: update %s: %w", id, err)
		}
		o.setStatus(next, now)
		o.Revision, o.Lane, o.TargetNode = rev, lane, target
		if r, ok := extra["result"].(string); ok {
			o.Result = r
		}
		if err := q.archiveOp(ctx, o); err != nil {
			return err
		}
		if publish {
			if err := q.publish(ctx, o); err != nil {
				return err
			}
		}
		if o.State == Leased {
			q.noteDue(o.LeaseExpiresAt)
		}
		out = o
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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

// FailAfter settles a failed attempt of h on operation id to retry after delay (or failed when
// its attempts are exhausted). msg is bounded non-secret text. Errors: wrapping [ErrLeaseLost].
func (q *Queue) FailAfter(ctx context.Context, id string, h Holder, msg string, delay time.Duration) (*Operation, error) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return q.casLoop(ctx, id, nil, func(s Status, now time.Time) (Status, error) { return FailAfter(s, h, now, msg, delay) })
}

// Sweep moves every leased operation whose lease expired to retry (queued at once), or to failed
// when its attempts are exhausted, queues retries whose delay passed, finishes the move of settled
// operations to the archive and repairs claim lanes an interrupted write left behind. It returns
// how many operations it moved out of leased or parked. Claims do the same for due work by
// themselves; the sweep makes exhaustion visible without a claimer.
func (q *Queue) Sweep(ctx context.Context) (int, error) {
	now := q.now().UTC()
	settled, err := buckets.Find[Operation](ctx, q.live, bson.M{"state": bson.M{"$in": bson.A{Succeeded, Failed}}})
	if err != nil {
		return 0, fmt.Errorf("operations: sweep: %w", err)
	}
	for i := range settled {
		if err := q.archiveOp(ctx, &settled[i]); err != nil {
			return 0, err
		}
	}
	n, err := q.promote(ctx, now)
	if err != nil {
		return n, err
	}
	return n, q.repairLanes(ctx)
}

// RetargetProject points every live operation of a project that targets another node at node
// (portable failover), so the next claim by that node takes them; each change is one
// compare-and-set. Idempotent.
func (q *Queue) RetargetProject(ctx context.Context, projectID, node string) error {
	ops, err := buckets.Find[Operation](ctx, q.live, bson.M{"project_id": projectID,
		"state": bson.M{"$in": bson.A{Queued, Retry, Leased}}, "target_node": bson.M{"$nin": bson.A{node, ""}}})
	if err != nil {
		return fmt.Errorf("operations: retarget %s to %s: %w", projectID, node, err)
	}
	for _, o := range ops {
		if _, err := q.casLoop(ctx, o.ID, bson.M{"target_node": node}, func(s Status, _ time.Time) (Status, error) { return s, nil }); err != nil {
			return fmt.Errorf("operations: retarget %s to %s: %w", o.ID, node, err)
		}
	}
	return nil
}

// RetargetStray finishes failovers a crash interrupted: every live operation of a project in
// nodes (project id to its assigned node) that targets another node is pointed at that node. One
// scan of the live set; each change is one compare-and-set.
func (q *Queue) RetargetStray(ctx context.Context, nodes map[string]string) error {
	ops, err := buckets.Find[Operation](ctx, q.live, bson.M{"state": bson.M{"$in": bson.A{Queued, Retry, Leased}}, "target_node": bson.M{"$ne": ""}})
	if err != nil {
		return fmt.Errorf("operations: retarget: %w", err)
	}
	for _, o := range ops {
		node, ok := nodes[o.ProjectID]
		if !ok || node == o.TargetNode {
			continue
		}
		if _, err := q.casLoop(ctx, o.ID, bson.M{"target_node": node}, func(s Status, _ time.Time) (Status, error) { return s, nil }); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("operations: retarget %s to %s: %w", o.ID, node, err)
		}
	}
	return nil
}

// RevokeProject fails every non-terminal operation of the project and then removes its fence
// sequence, in that order ([Queue.RevokeOperations], [Queue.RemoveFenceSequence]). Run it under the
// project's lease. Idempotent; an error leaves the sequence in place.
func (q *Queue) RevokeProject(ctx context.Context, projectID string) error {
	if _, err := q.RevokeOperations(ctx, projectID); err != nil {
		return err
	}
	return q.RemoveFenceSequence(ctx, projectID)
}

// RevokeOperations fails every non-terminal operation of the project ("revoked"): none can be
// claimed, renewed or settled any more. It returns how many it revoked. Idempotent.
func (q *Queue) RevokeOperations(ctx context.Context, projectID string) (int, error) {
	ops, err := buckets.Find[Operation](ctx, q.live, bson.M{"project_id": projectID})
	if err != nil {
		return 0, fmt.Errorf("operations: revoke %s: %w", projectID, err)
	}
	n := 0
	for _, o := range ops {
		if !o.State.Terminal() {
			n++
		}
		if _, err := q.casLoop(ctx, o.ID, nil, func(s Status, _ time.Time) (Status, error) {
			next, _ := Revoke(s)
			return next, nil
		}); err != nil && !errors.Is(err, ErrNotFound) {
			return n, fmt.Errorf("operations: revoke %s: %w", o.ID, err)
		}
	}
	return n, nil
}

// ErrProjectLive is returned by [Queue.RemoveFenceSequence] while the project has live operations.
var ErrProjectLive = errors.New("berth: the project has operations that are not revoked")

// RemoveFenceSequence removes the project's fence sequence, only once no operation of the project
// is queued, leased or waiting to retry (revoke them first). Idempotent. Errors: wrapping
// [ErrProjectLive].
func (q *Queue) RemoveFenceSequence(ctx context.Context, projectID string) error {
	left, err := buckets.Find[Operation](ctx, q.live, bson.M{"project_id": projectID, "state": bson.M{"$in": bson.A{Queued, Retry, Leased}}})
	if err != nil {
		return fmt.Errorf("operations: remove the fence sequence of %s: %w", projectID, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("operations: remove the fence sequence of %s: %d operations: %w", projectID, len(left), ErrProjectLive)
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
