package changelog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
)

// maxClears bounds the outbox clears one pass of the cleaner sends (in one
// bulk write per collection); a clear names its change in full, payload
// included, so this also bounds the pass's message size.
const maxClears = 256

// clearsPerCommand bounds the statements of one bulk write. FerretDB v1
// keeps the cursor of every statement of an update command open until the
// whole command ends (internal/handler/msg_update.go), each holding one of
// its 100 SQLite connections: a command of more statements than that never
// finishes and takes the embedded store down with it (seen at 128). 32
// keeps one round trip per 32 clears with room to spare.
const clearsPerCommand = 32

// clear is one change to take out of its document's outbox once appended.
type clear struct {
	ref Ref
	p   Pending
	// seq is the change's entry; set in ref.SeqField when that is not
	// empty and seq > 0.
	seq int64
}

// chore is the housekeeping that follows a stored batch: the head hint to
// move to head (zero Seq: none), and the outboxes to clear.
type chore struct {
	head   node.LogEntry
	clears []clear
}

// tidy queues c for the cleaner, starting it when none runs. The cleaner is
// one goroutine at a time, on a context of its own (bounded per pass by
// batchTimeout), so no caller waits for it and it does not race itself:
// clears of one document run in the order their changes were appended.
func (l *Log) tidy(c chore) {
	c.clears = slices.DeleteFunc(c.clears, func(c clear) bool { return c.ref.Collection == "" }) // held nowhere else
	if c.head.Seq == 0 && len(c.clears) == 0 {
		return
	}
	l.cmu.Lock()
	l.chores = append(l.chores, c)
	l.choresQueued++
	start := !l.cleaning
	l.cleaning = true
	l.cmu.Unlock()
	if start {
		go l.clean()
	}
}

// clean runs queued chores until none is left: each pass takes every queued
// chore (at most maxClears clears), moves the head hint once to the newest
// entry among them (or, when the pass clears nothing, leaves that to a later
// pass: [Log.hintCanWait]), and clears their outboxes with bulk writes
// ([Log.clearOutboxes]).
func (l *Log) clean() {
	for {
		l.cmu.Lock()
		if len(l.chores) == 0 {
			l.cleaning = false
			l.cmu.Unlock()
			return
		}
		var head node.LogEntry
		var clears []clear
		n := 0
		for n < len(l.chores) && (n == 0 || len(clears)+len(l.chores[n].clears) <= maxClears) {
			if l.chores[n].head.Seq > head.Seq {
				head = l.chores[n].head
			}
			clears = append(clears, l.chores[n].clears...)
			n++
		}
		l.chores = append([]chore(nil), l.chores[n:]...)
		if l.hintOwed.Seq > head.Seq {
			head = l.hintOwed
		}
		l.hintOwed = node.LogEntry{}
		gate := l.cleanGateForTest
		l.cmu.Unlock()
		if gate != nil {
			<-gate
		}
		if head.Seq > 0 && len(clears) == 0 && l.hintCanWait(head) {
			head = node.LogEntry{}
		}
		ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
		if head.Seq > 0 {
			l.advanceHead(ctx, head)
			l.cmu.Lock()
			l.hintSeq, l.hintAt = max(l.hintSeq, head.Seq), time.Now()
			l.cmu.Unlock()
		}
		l.clearOutboxes(ctx, clears)
		cancel()
		l.cmu.Lock()
		l.choresDone += n
		close(l.cleaned)
		l.cleaned = make(chan struct{})
		l.cmu.Unlock()
	}
}

// hintEvery and hintLag bound how far the head hint may trail this Log's
// appends: a pass that clears nothing moves it only when it was last moved
// hintEvery ago or trails by hintLag entries or more; else the move waits
// (at most hintEvery) and joins a later one. Under a burst of appends that
// is one hint write a second instead of one per batch, each of which took
// the store's one connection from the next batch.
const (
	hintEvery = time.Second
	hintLag   = maxBatch
)

// hintCanWait reports whether moving the hint to head can wait, and if so
// owes it: a timer then queues the move hintEvery later.
func (l *Log) hintCanWait(head node.LogEntry) bool {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	if head.Seq-l.hintSeq >= hintLag || time.Since(l.hintAt) >= hintEvery {
		return false
	}
	if head.Seq > l.hintOwed.Seq {
		l.hintOwed = head
	}
	if !l.hintTimer {
		l.hintTimer = true
		time.AfterFunc(hintEvery, func() {
			l.cmu.Lock()
			l.hintTimer = false
			owed := l.hintOwed
			l.cmu.Unlock()
			l.tidy(chore{head: owed})
		})
	}
	return true
}

// Cleared returns once the housekeeping of every batch this Log stored
// before the call (its head hint and the clearing of its changes from their
// outboxes) has run, or with ctx's error; a hint move the cleaner left to a
// later pass is made by Cleared itself. An outbox clear that failed is
// logged and left to [Log.Recover]; Cleared returns nil for it too. Tests
// and shutdown call it; no write needs it (docs/node-protocol.md section
// 7.2.1).
func (l *Log) Cleared(ctx context.Context) error {
	l.cmu.Lock()
	target := l.choresQueued
	l.cmu.Unlock()
	for {
		l.cmu.Lock()
		done, ch := l.choresDone, l.cleaned
		l.cmu.Unlock()
		if done >= target {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("changelog: wait for outboxes to be cleared: %w", ctx.Err())
		}
	}
	// A hint move a pass left for later is made now.
	l.cmu.Lock()
	owed := l.hintOwed
	l.hintOwed = node.LogEntry{}
	l.cmu.Unlock()
	if owed.Seq > 0 {
		l.advanceHead(ctx, owed)
	}
	return nil
}

// clearOutboxes takes each change of clears out of its outbox and sets the
// tracked seq field, with one update per document however many of its
// changes the pass clears ($pullAll of them all, the seq field set to the
// newest one's seq), and one ordered bulk write per collection (one round
// trip per [clearsPerCommand] documents; the store applies them one after
// another), in the order the documents first appear in clears. On the
// embedded store every update statement is a query and a transaction of its
// own, so a document written many times in a burst (a node, a service) costs
// one of them per pass, not one per change (docs/node-protocol.md section
// 7.2.1). A document deleted by one of its changes ([Ref.RemoveOn]) is
// removed instead. A failure only leaves changes there: they are in the log,
// which [Log.Recover] finds before appending anything.
func (l *Log) clearOutboxes(ctx context.Context, clears []clear) {
	byColl := map[string][]mongo.WriteModel{}
	var order []string
	for _, g := range groupClears(clears) {
		m := clearModel(g)
		if m == nil {
			continue
		}
		coll := g[0].ref.Collection
		if _, ok := byColl[coll]; !ok {
			order = append(order, coll)
		}
		byColl[coll] = append(byColl[coll], m)
	}
	for _, coll := range order {
		for models := range slices.Chunk(byColl[coll], clearsPerCommand) {
			_, err := l.st.Collection(coll).BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
			if err == nil {
				continue
			}
			failed := len(models)
			var bwe mongo.BulkWriteException
			if errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 {
				failed = len(models) - bwe.WriteErrors[0].Index // ordered: it stopped at the first
			}
			l.log.Warn("clear appended changes from their outboxes; they stay until the next recovery", "collection", coll, "documents", len(models), "not_cleared", failed, "err", err)
		}
	}
}

// groupClears groups clears by document (collection and _id), in the order
// each document first appears, keeping each document's clears in order.
// Clears of changes held nowhere but in memory are left out.
func groupClears(clears []clear) [][]clear {
	idx := map[string]int{}
	var out [][]clear
	for _, c := range clears {
		if c.ref.Collection == "" {
			continue
		}
		k := fmt.Sprintf("%s\x00%T\x00%v", c.ref.Collection, c.ref.ID, c.ref.ID)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], c)
	}
	return out
}

// clearModel is the one write that clears the changes of g, all of one
// document: nil for none. A document that one of them deletes
// ([Ref.RemoveOn]) is removed (its other changes go with it); else the
// changes are pulled together and the seq field, when tracked, set to the
// newest seq among them.
func clearModel(g []clear) mongo.WriteModel {
	if len(g) == 0 || g[0].ref.Collection == "" {
		return nil
	}
	for _, c := range g {
		if c.ref.RemoveOn != "" && c.ref.RemoveOn == c.p.ID {
			// The document was deleted by this change: now it may go.
			return mongo.NewDeleteOneModel().SetFilter(bson.M{"_id": c.ref.ID, RemoveOnField: c.p.ID})
		}
	}
	// The embedded store's $pull matches whole values only (a condition
	// such as {"id": ...} removes nothing), so each item is named in full:
	// Pending holds times at millisecond precision, as stored.
	items := make(bson.A, 0, len(g))
	var field string
	var seq int64
	for _, c := range g {
		items = append(items, c.p)
		if c.ref.SeqField != "" && c.seq > seq {
			field, seq = c.ref.SeqField, c.seq
		}
	}
	update := bson.M{"$pullAll": bson.M{OutboxField: items}}
	if seq > 0 {
		update["$set"] = bson.M{field: seq}
	}
	return mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": g[0].ref.ID}).SetUpdate(update)
}
