package changelog

import (
	"context"
	"errors"

	"github.com/berthhq/berth/abi/node"
)

// Query selects change-log entries for auditors (GET /api/v1/changelog, docs/node-protocol.md
// section 7.3): those of one kind, operation, entity or actor, scanned from one end of a range
// of sequence numbers. The zero value of every filter field matches every entry.
type Query struct {
	// FromSeq and UntilSeq bound the range scanned, both inclusive; FromSeq below 1 means 1,
	// UntilSeq 0 means the head.
	FromSeq, UntilSeq int64
	// Desc scans from UntilSeq down (newest first); false scans from FromSeq up.
	Desc bool
	// Limit is how many matching entries the answer holds at most: 1 to node.MaxLogBatch;
	// other values mean node.MaxLogBatch.
	Limit int
	// EntityType, EntityID, Op and ActorID keep the entries whose field equals the value;
	// empty keeps every entry.
	EntityType, EntityID, Op, ActorID string
	// MaxScan bounds how many entries one Find reads (whole batches of node.MaxLogBatch);
	// zero means DefaultMaxScan. A Find that stops there says where to go on (Result.NextSeq).
	MaxScan int
}

// DefaultMaxScan is how many entries a Find reads at most when the query names no bound:
// 20 batches, so a filter that matches nothing costs a bounded number of range reads.
const DefaultMaxScan = 20 * node.MaxLogBatch

// Result is what [Log.Find] answers: the matching entries in scan order, the head when the
// scan began, how many entries it read, and NextSeq, where the same query goes on (the
// FromSeq of the next ascending scan, the UntilSeq of the next descending one); NextSeq is 0
// when a descending scan reached FromSeq.
type Result struct {
	Entries []node.LogEntry
	Head    int64
	Scanned int
	NextSeq int64
}

// filtered reports whether q keeps anything other than every entry.
func (q Query) filtered() bool {
	return q.EntityType != "" || q.EntityID != "" || q.Op != "" || q.ActorID != ""
}

func (q Query) match(e node.LogEntry) bool {
	return (q.EntityType == "" || e.EntityType == q.EntityType) && (q.EntityID == "" || e.EntityID == q.EntityID) &&
		(q.Op == "" || e.Op == q.Op) && (q.ActorID == "" || e.ActorID == q.ActorID)
}

// ErrBadQuery is returned by [Log.Find] for a range whose UntilSeq is below its FromSeq.
var ErrBadQuery = errors.New("changelog: until_seq is below from_seq")

// Find reads the entries q selects: batches of consecutive entries by sequence number (the
// same reads as [Log.Range], from memory near the head), kept when they match, until Limit
// matched, the range is scanned or MaxScan entries were read. Without a filter and
// ascending it answers what Range answers. It reads only; safe for concurrent use.
func (l *Log) Find(ctx context.Context, q Query) (Result, error) {
	if q.FromSeq < 1 {
		q.FromSeq = 1
	}
	if q.Limit <= 0 || q.Limit > node.MaxLogBatch {
		q.Limit = node.MaxLogBatch
	}
	if q.MaxScan <= 0 {
		q.MaxScan = DefaultMaxScan
	}
	if q.UntilSeq != 0 && q.UntilSeq < q.FromSeq {
		return Result{}, ErrBadQuery
	}
	head, _, err := l.Head(ctx)
	if err != nil {
		return Result{}, err
	}
	res := Result{Head: head, Entries: []node.LogEntry{}}
	top := head
	if q.UntilSeq != 0 {
		top = min(top, q.UntilSeq)
	}
	if q.Desc {
		return res, l.findDesc(ctx, q, top, &res)
	}
	return res, l.findAsc(ctx, q, top, &res)
}

func (l *Log) findAsc(ctx context.Context, q Query, top int64, res *Result) error {
	next := q.FromSeq
	for next <= top && res.Scanned < q.MaxScan {
		n := int(min(int64(node.MaxLogBatch), top-next+1))
		batch, err := l.Range(ctx, next, n)
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			break
		}
		for _, e := range batch {
			res.Scanned++
			next = e.Seq + 1
			if q.match(e) {
				res.Entries = append(res.Entries, e)
				if len(res.Entries) == q.Limit {
					res.NextSeq = next
					return nil
				}
			}
		}
		if !q.filtered() {
			break // one batch, as Range answers
		}
	}
	res.NextSeq = next
	return nil
}

func (l *Log) findDesc(ctx context.Context, q Query, top int64, res *Result) error {
	for top >= q.FromSeq && res.Scanned < q.MaxScan {
		lo := max(q.FromSeq, top-int64(node.MaxLogBatch)+1)
		batch, err := l.Range(ctx, lo, int(top-lo+1))
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			break
		}
		for i := len(batch) - 1; i >= 0; i-- {
			e := batch[i]
			if e.Seq > top {
				continue
			}
			res.Scanned++
			if q.match(e) {
				res.Entries = append(res.Entries, e)
				if len(res.Entries) == q.Limit {
					if e.Seq-1 >= q.FromSeq {
						res.NextSeq = e.Seq - 1
					}
					return nil
				}
			}
		}
		top = lo - 1
	}
	if top >= q.FromSeq {
		res.NextSeq = top
	}
	return nil
}
