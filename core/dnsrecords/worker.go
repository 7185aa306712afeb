package dnsrecords

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
)

// ResourceType is the DNS plugin's resource type (docs/dns.md section 2).
const ResourceType = "dns.record"

// claimBatch is how many writes one claim takes.
const claimBatch = 8

// Run claims and executes DNS writes until ctx ends: at once when this process enqueued one,
// otherwise every Poll (retries whose backoff passed, leases a dead berthd left). It also
// enqueues again the write of every record the server has not caught up with (an enqueue a
// crash lost), every 12 polls. Several berthd processes may run it at once: each write is
// claimed by one of them under a fence.
func (r *Records) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Poll)
	defer t.Stop()
	for n := 0; ; n++ {
		if n%12 == 0 {
			if err := r.Resume(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("dns: resume unfinished writes", "error", err)
			}
		}
		for {
			did, err := r.RunOnce(ctx)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("dns: claim writes", "error", err)
			}
			if did == 0 || err != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

// Resume enqueues the write of every record whose generation the server does not hold and whose
// write has not failed for good (the enqueue of a write already queued returns it), and withdraws
// every challenge value held for longer than ChallengeMaxAge.
func (r *Records) Resume(ctx context.Context) error {
	var recs []Record
	if err := r.cfg.Store.All(ctx, Collection, &recs); err != nil {
		return fmt.Errorf("dnsrecords: %w", err)
	}
	old := r.cfg.Now().Add(-r.cfg.ChallengeMaxAge)
	for i := range recs {
		rec := &recs[i]
		for _, h := range rec.Holdings {
			if (strings.HasPrefix(h.Holder, HolderACME) || strings.HasPrefix(h.Holder, HolderNode)) && h.Since.Before(old) {
				r.log.Info("dns: withdrawing a challenge value nobody cleaned up", "record", rec.ID, "holder", h.Holder, "since", h.Since)
				if _, err := r.set(ctx, rec.FQDN, rec.Type, h.Holder, nil, rec.TTL, false); err != nil {
					return err
				}
			}
		}
		if rec.Written < rec.Generation && rec.Failed < rec.Generation {
			if err := r.enqueue(ctx, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// RunOnce claims up to 8 due writes and executes them, and returns how many it claimed.
func (r *Records) RunOnce(ctx context.Context) (int, error) {
	claimed, err := r.cfg.Queue.ClaimTargeted(ctx, Target, claimBatch, func(o *operations.Operation) bool { return o.Kind == KindWrite })
	if err != nil {
		return 0, err
	}
	for _, c := range claimed {
		r.execute(ctx, c)
	}
	return len(claimed), nil
}

// retryable reports whether a failed write is worth another attempt: the server or the plugin
// was unavailable, the records changed under the update, or the failure has no code of ours.
func retryable(err error) bool {
	switch abierrors.CodeOf(err) {
	case abierrors.DNSAuthRefused, abierrors.DNSZoneNotServed, abierrors.DNSRecordNotOwned, abierrors.ValidationFailed:
		return false
	}
	return true
}

// execute runs one claimed write (docs/dns.md section 6.2):
//
//  1. read the record as it is now (a write never applies a state older than its claim);
//  2. Plan and Apply its values (Delete when none is held) with the claim's fence as the fencing
//     token, and an idempotency key naming the operation and fence;
//  3. record the generation written with one compare-and-set, removing a record nobody holds;
//  4. complete the operation, or fail it: retryable failures come back with the queue's backoff,
//     the others are recorded on the record for Wait to return.
func (r *Records) execute(ctx context.Context, c operations.Claimed) {
	op := c.Operation
	h := operations.Holder{NodeID: op.NodeID, Token: c.LeaseToken, Fence: op.Fence}
	var p writePayload
	if err := json.Unmarshal(op.PayloadJSON(), &p); err != nil || p.Record == "" {
		_, _ = r.cfg.Queue.Fail(ctx, op.ID, h, "payload is not a DNS write", false)
		return
	}
	var rec Record
	err := r.cfg.Store.Get(ctx, Collection, p.Record, &rec)
	if errors.Is(err, store.ErrNotFound) {
		_, _ = r.cfg.Queue.Complete(ctx, op.ID, h, nil) // withdrawn and removed since
		return
	}
	if err != nil {
		_, _ = r.cfg.Queue.Fail(ctx, op.ID, h, err.Error(), true)
		return
	}
	if rec.Written >= rec.Generation {
		_, _ = r.cfg.Queue.Complete(ctx, op.ID, h, nil) // a later write got there first
		return
	}
	values := rec.Values()
	m := pluginapi.Mutation{OperationID: op.ID, IdempotencyKey: op.ID + "/" + strconv.FormatInt(op.Fence, 10), FencingToken: uint64(op.Fence)}
	if len(values) == 0 {
		_, err = r.cfg.Writer.Delete(ctx, &abiprovider.DeleteRequest{Type: ResourceType, ID: rec.ID, Mutation: m})
	} else {
		err = r.apply(ctx, &rec, values, m)
	}
	if errors.Is(err, pluginapi.ErrStaleFencingToken) {
		// A write under a later fence reached the plugin first; it read this generation or a
		// later one unless the record changed again, which its own write then covers.
		err = abierrors.Wrap(abierrors.Unavailable, "superseded by a later write", err)
	}
	if err != nil {
		if !retryable(err) {
			r.recordFailure(ctx, &rec, err)
			r.log.Warn("dns write failed", "record", rec.ID, "generation", rec.Generation, "code", abierrors.CodeOf(err), "error", err)
		} else {
			r.log.Info("dns write will be retried", "record", rec.ID, "generation", rec.Generation, "attempt", op.Attempts, "error", err)
		}
		_, _ = r.cfg.Queue.Fail(ctx, op.ID, h, err.Error(), retryable(err))
		return
	}
	if err := r.recordWritten(ctx, &rec, len(values) == 0); err != nil {
		_, _ = r.cfg.Queue.Fail(ctx, op.ID, h, err.Error(), true)
		return
	}
	r.log.Info("dns record written", "record", rec.ID, "generation", rec.Generation, "values", values)
	_, _ = r.cfg.Queue.Complete(ctx, op.ID, h, nil)
}

func (r *Records) apply(ctx context.Context, rec *Record, values []string, m pluginapi.Mutation) error {
	attrs, _ := json.Marshal(struct {
		Values []string `json:"values"`
		TTL    uint32   `json:"ttl"`
	}{values, rec.TTL}) // cannot fail
	plan, err := r.cfg.Writer.Plan(ctx, &abiprovider.PlanRequest{Desired: abiprovider.Resource{Type: ResourceType, ID: rec.ID, Attributes: attrs}})
	if err != nil {
		return err
	}
	_, err = r.cfg.Writer.Apply(ctx, &abiprovider.ApplyRequest{Planned: plan.Planned, Mutation: m})
	return err
}

// recordWritten raises rec's Written to the generation read (never lowers it) and removes the
// document when nobody holds the record any more and nothing changed since.
func (r *Records) recordWritten(ctx context.Context, rec *Record, empty bool) error {
	return store.RetryOnConflict(ctx, func() error {
		var cur Record
		err := r.cfg.Store.Get(ctx, Collection, rec.ID, &cur)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Written >= rec.Generation {
			return nil
		}
		if empty && cur.Generation == rec.Generation {
			ok, err := r.cfg.Store.DeleteWhen(ctx, Collection, rec.ID, store.Fields{"revision": cur.Revision})
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("dnsrecords: record the write of %s: changed meanwhile: %w", rec.ID, store.ErrConflict)
			}
			return nil
		}
		_, err = r.cfg.Store.SetIfRevision(ctx, Collection, rec.ID, cur.Revision, store.Fields{"written": rec.Generation, "updated_at": time.Now().UTC()})
		return err
	})
}

// recordFailure keeps a write's failure for good on the record (best effort: Wait then times out
// instead of returning the reason).
func (r *Records) recordFailure(ctx context.Context, rec *Record, cause error) {
	msg := cause.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	_ = store.RetryOnConflict(ctx, func() error {
		var cur Record
		if err := r.cfg.Store.Get(ctx, Collection, rec.ID, &cur); err != nil {
			return err
		}
		if cur.Failed >= rec.Generation {
			return nil
		}
		_, err := r.cfg.Store.SetIfRevision(ctx, Collection, rec.ID, cur.Revision, store.Fields{
			"failed": rec.Generation, "last_error": msg, "last_code": string(abierrors.CodeOf(cause)), "updated_at": time.Now().UTC()})
		return err
	}) // best effort, as said
}
