package operations

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/buckets"
)

// LanesCollection holds the claim lanes (docs/runner-protocol.md section 5.3): for each target
// node, and one for operations any node may take, a FIFO of slots numbered by a sequence, each
// slot naming the operation queued under it, and a head marking where claims start. Every lane
// access is by _id, so a claim reads a handful of small documents however long the queue or its
// history is.
//
// A slot only proposes: an operation is claimable through slot k only while its own document
// names k (field lane) and is queued or retry, and the claim is one compare-and-set on that
// document. A slot taken but never written (its writer crashed) is filled with a tombstone by the
// first claim that reaches it; a writer that finds its slot tombstoned takes a new one.
const LanesCollection = "operation_lanes"

// laneScan bounds how many slots one claim reads in one lane.
const laneScan = 64

// promoteEvery is how often, at most, a claim that found too little scans the live operations
// for expired leases and retries that became due; it also runs whenever the clock passes the
// earliest due time this process knows of.
const promoteEvery = time.Second

func laneOf(target string) string {
	if target == "" {
		return "*"
	}
	return target
}

func slotKey(lane string, seq int64) string { return fmt.Sprintf("e/%s/%016d", lane, seq) }
func headKey(lane string) string            { return "h/" + lane }
func laneSequence(lane string) string       { return "lane/" + lane }

type slot struct {
	ID string `bson:"_id"`
	Op string `bson:"op"` // empty: a tombstone
}

type head struct {
	ID   string `bson:"_id"`
	Head int64  `bson:"head"`
}

// nextSlot takes the next slot of target's lane.
func (q *Queue) nextSlot(ctx context.Context, target string) (string, error) {
	lane := laneOf(target)
	n, err := store.NextSequence(ctx, q.st, laneSequence(lane))
	if err != nil {
		return "", fmt.Errorf("operations: take a slot in lane %s: %w", lane, err)
	}
	return slotKey(lane, n), nil
}

// writeSlot writes slot key naming op; it reports false when the slot holds something else (a
// tombstone).
func (q *Queue) writeSlot(ctx context.Context, key, op string) (bool, error) {
	_, err := q.lanes.InsertOne(ctx, slot{ID: key, Op: op})
	if err == nil {
		return true, nil
	}
	if !store.IsDuplicateKey(err) {
		return false, fmt.Errorf("operations: write slot %s: %w", key, err)
	}
	var s slot
	if err := store.FindByID(ctx, q.lanes, key, &s); err != nil {
		return false, fmt.Errorf("operations: read slot %s: %w", key, err)
	}
	return s.Op == op, nil
}

// publish writes the slot o.Lane names, or queues o under a new slot when that one was
// tombstoned. o is pending (queued or retry) with a lane.
func (q *Queue) publish(ctx context.Context, o *Operation) error {
	if o.Lane == "" {
		return nil
	}
	ok, err := q.writeSlot(ctx, o.Lane, o.ID)
	if err != nil || ok {
		return err
	}
	return q.relane(ctx, o.ID)
}

// relane queues pending operation id under a new slot of its target's lane: one compare-and-set
// of its lane field, then the slot. Idempotent; a settled or leased operation is left alone.
func (q *Queue) relane(ctx context.Context, id string) error {
	return store.RetryOnConflict(ctx, func() error {
		o, err := q.getLive(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if o.State != Queued && o.State != Retry {
			return nil
		}
		key, err := q.nextSlot(ctx, o.TargetNode)
		if err != nil {
			return err
		}
		if _, err := store.UpdateIfRevision(ctx, q.live.For(id), id, o.Revision, bson.M{"$set": bson.M{"lane": key}}); err != nil {
			return fmt.Errorf("operations: queue %s: %w", id, err)
		}
		ok, err := q.writeSlot(ctx, key, id)
		if err == nil && !ok {
			return fmt.Errorf("operations: queue %s: slot %s taken meanwhile: %w", id, key, store.ErrConflict)
		}
		return err
	})
}

// laneState reads the lane's head and the last slot taken.
//
// Lanes and their sequences are read from the store by _id, not from the read view: every claim
// and enqueue writes them and reads them right back, so the view would only add a re-read.
func (q *Queue) laneState(ctx context.Context, lane string) (first, last int64, err error) {
	var h head
	if err := store.FindByID(ctx, q.lanes, headKey(lane), &h); err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, 0, fmt.Errorf("operations: read lane %s: %w", lane, err)
	}
	var seq struct {
		Value int64 `bson:"value"`
	}
	if err := store.FindByID(ctx, q.st.Collection(store.SequencesCollection), laneSequence(lane), &seq); err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, 0, fmt.Errorf("operations: read lane %s: %w", lane, err)
	}
	return h.Head + 1, seq.Value, nil
}

// readSlot returns slot key, writing a tombstone into a slot taken but not written.
func (q *Queue) readSlot(ctx context.Context, key string) (slot, error) {
	var s slot
	err := store.FindByID(ctx, q.lanes, key, &s)
	if errors.Is(err, store.ErrNotFound) {
		if _, err := q.lanes.InsertOne(ctx, slot{ID: key}); err != nil && !store.IsDuplicateKey(err) {
			return s, fmt.Errorf("operations: tombstone slot %s: %w", key, err)
		}
		err = store.FindByID(ctx, q.lanes, key, &s)
	}
	if err != nil {
		return s, fmt.Errorf("operations: read slot %s: %w", key, err)
	}
	return s, nil
}

// advance moves lane's head to at least n and deletes the consumed slots behind it (tombstones
// stay, so a late writer of such a slot is refused and takes a new one).
func (q *Queue) advance(ctx context.Context, lane string, n int64, consumed []string) error {
	// One round trip for the whole decision: the head's upsert and the deletes, unordered (a
	// delete applied before the head moves leaves a slot a reader tombstones, which is spent too).
	models := make([]mongo.WriteModel, 0, 1+len(consumed))
	models = append(models, mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: headKey(lane)}}).
		SetUpdate(bson.M{"$max": bson.M{"head": n}}).SetUpsert(true))
	for _, key := range consumed {
		models = append(models, mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: key}}))
	}
	if _, err := q.lanes.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false)); err != nil && !onlyDuplicateKeys(err) {
		return fmt.Errorf("operations: advance lane %s: %w", lane, err)
	}
	return nil
}

// onlyDuplicateKeys reports whether every error of a bulk write is a duplicate key (a concurrent
// first upsert of a lane's head, which lost to an equal or higher head).
func onlyDuplicateKeys(err error) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		return store.IsDuplicateKey(err)
	}
	if bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return false
	}
	for _, we := range bwe.WriteErrors {
		if !store.IsDuplicateKey(we) && !(we.Code == 1 && strings.Contains(we.Message, "UNIQUE constraint failed")) {
			return false
		}
	}
	return true
}

// claimLane claims up to max operations for node from one lane, appending to out.
func (q *Queue) claimLane(ctx context.Context, lane, node string, max int, eligible func(*Operation) bool, now time.Time, out []Claimed) ([]Claimed, error) {
	first, last, err := q.laneState(ctx, lane)
	if err != nil {
		return out, err
	}
	contiguous, headTo := true, first-1
	var consumed []string
	defer func() {
		if headTo >= first {
			_ = q.advance(context.WithoutCancel(ctx), lane, headTo, consumed)
		}
	}()
	start := len(out)
	for i := first; i <= last && i < first+laneScan && len(out)-start < max; i++ {
		key := slotKey(lane, i)
		s, err := q.readSlot(ctx, key)
		if err != nil {
			return out, err
		}
		done, c, err := q.claimSlot(ctx, s, node, eligible, now)
		if err != nil {
			return out, err
		}
		if c != nil {
			out = append(out, *c)
		}
		switch {
		case done && contiguous:
			headTo = i
			if s.Op != "" {
				consumed = append(consumed, key)
			}
		case !done:
			contiguous = false
		}
	}
	return out, nil
}

// claimSlot decides one slot: done reports whether the slot is spent (claimed, or naming an
// operation that is not queued under it any more).
func (q *Queue) claimSlot(ctx context.Context, s slot, node string, eligible func(*Operation) bool, now time.Time) (done bool, c *Claimed, err error) {
	if s.Op == "" {
		return true, nil, nil
	}
	o, err := q.getLive(ctx, s.Op)
	if errors.Is(err, ErrNotFound) {
		return true, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	if o.Lane != s.ID || (o.State != Queued && o.State != Retry) {
		return true, nil, nil
	}
	if (o.TargetNode != "" && o.TargetNode != node) || !Claimable(o.status(), now) || (eligible != nil && !eligible(o)) {
		return false, nil, nil
	}
	if o.Attempts >= o.MaxAttempts {
		next, _ := Claim(q.policy, o.status(), node, "", o.Fence, now)
		set := statusSet(next, now)
		set["lane"] = ""
		rev, err := store.UpdateIfRevision(ctx, q.live.For(o.ID), o.ID, o.Revision, bson.M{"$set": set})
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return false, nil, nil
		}
		if err != nil {
			return false, nil, fmt.Errorf("operations: fail exhausted %s: %w", o.ID, err)
		}
		o.setStatus(next, now)
		o.Revision, o.Lane = rev, ""
		return true, nil, q.archiveOp(ctx, o)
	}
	fence, err := store.NextSequence(ctx, q.st, FenceSequence(o.ProjectID))
	if err != nil {
		return false, nil, fmt.Errorf("operations: claim %s: %w", o.ID, err)
	}
	token, digest, err := newLeaseToken()
	if err != nil {
		return false, nil, err
	}
	next, _ := Claim(q.policy, o.status(), node, digest, fence, now)
	set := statusSet(next, now)
	set["lane"] = ""
	rev, err := store.UpdateIfRevision(ctx, q.live.For(o.ID), o.ID, o.Revision, bson.M{"$set": set})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return false, nil, nil // changed meanwhile: the next claim reads it again
	}
	if err != nil {
		return false, nil, fmt.Errorf("operations: claim %s: %w", o.ID, err)
	}
	o.setStatus(next, now)
	o.Revision, o.Lane = rev, ""
	q.noteDue(o.LeaseExpiresAt)
	return true, &Claimed{Operation: *o, LeaseToken: token}, nil
}

// noteDue records that something becomes due at t (a lease expiry, a parked retry), so a claim
// after t scans for it.
func (q *Queue) noteDue(t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.nextDue.IsZero() || t.Before(q.nextDue) {
		q.nextDue = t
	}
}

// promoteDue reports whether a claim at now should scan for due work, and marks the scan started.
func (q *Queue) promoteDue(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.lastPromote.IsZero() || now.Sub(q.lastPromote) >= promoteEvery || (!q.nextDue.IsZero() && !now.Before(q.nextDue)) {
		q.lastPromote, q.nextDue = now, time.Time{}
		return true
	}
	return false
}

// promote scans the live operations once: a lease that expired goes to retry (or failed when its
// attempts are exhausted) and is queued at once; a retry whose delay passed and that waits
// outside the lanes is queued. It returns how many operations it changed.
func (q *Queue) promote(ctx context.Context, now time.Time) (int, error) {
	ops, err := buckets.Find[Operation](ctx, q.live, bson.M{"state": bson.M{"$in": bson.A{Leased, Retry}}})
	if err != nil {
		return 0, fmt.Errorf("operations: scan for due work: %w", err)
	}
	n := 0
	for i := range ops {
		o := &ops[i]
		switch {
		case o.State == Leased && !now.Before(o.LeaseExpiresAt):
			if _, err := q.casLoop(ctx, o.ID, nil, func(s Status, now time.Time) (Status, error) {
				next, _ := Expire(s, now)
				return next, nil
			}); err != nil && !errors.Is(err, ErrNotFound) {
				return n, err
			}
			n++
		case o.State == Leased:
			q.noteDue(o.LeaseExpiresAt)
		case o.State == Retry && o.Lane == "" && !now.Before(o.AvailableAt):
			if err := q.relane(ctx, o.ID); err != nil {
				return n, err
			}
			n++
		case o.State == Retry && o.Lane == "":
			q.noteDue(o.AvailableAt)
		}
	}
	return n, nil
}

// repairLanes queues every pending operation whose slot is missing or names another operation
// (an enqueue or retry interrupted between its writes). Run by the sweep.
func (q *Queue) repairLanes(ctx context.Context) error {
	ops, err := buckets.Find[Operation](ctx, q.live, bson.M{"state": bson.M{"$in": bson.A{Queued, Retry}}, "lane": bson.M{"$ne": ""}})
	if err != nil {
		return fmt.Errorf("operations: repair lanes: %w", err)
	}
	for i := range ops {
		o := &ops[i]
		var s slot
		err := store.FindByID(ctx, q.lanes, o.Lane, &s)
		if errors.Is(err, store.ErrNotFound) {
			first, _, err := q.laneState(ctx, laneOf(o.TargetNode))
			if err != nil {
				return err
			}
			var seq int64
			if _, err := fmt.Sscanf(o.Lane[len("e/"+laneOf(o.TargetNode)+"/"):], "%d", &seq); err == nil && seq >= first {
				continue // ahead of the head and not written yet: its writer, or the next claim, handles it
			}
		} else if err != nil {
			return fmt.Errorf("operations: repair lanes: %w", err)
		} else if s.Op == o.ID {
			continue
		}
		if err := q.relane(ctx, o.ID); err != nil {
			return err
		}
	}
	return nil
}
