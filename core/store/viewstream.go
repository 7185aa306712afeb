package store

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// streamRetry is the pause before the change stream is opened again after an error.
const streamRetry = time.Second

// codeHistoryLost is MongoDB's ChangeStreamHistoryLost: the resume token is older than the oplog.
const codeHistoryLost = 286

// watch feeds the view from a change stream on its database until ctx ends (MongoDB replica sets
// only): every event names a document that some process changed, which is marked stale so its
// next read re-reads it; drops, renames and invalidations mark every loaded collection for a
// reload. After an error the stream is resumed from the last token; when the token is refused, a
// new stream is opened first and every loaded collection is marked for a reload after it, so no
// change falls between the two.
func (v *View) watch(ctx context.Context, db *mongo.Database) {
	var token bson.Raw
	for ctx.Err() == nil {
		opts := options.ChangeStream()
		if token != nil {
			opts.SetResumeAfter(token)
		}
		cs, err := db.Watch(ctx, mongo.Pipeline{}, opts)
		if err != nil && token != nil && resumeLost(err) {
			v.log.Warn("store: change stream token lost; reloading the read view", "err", err)
			token = nil
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				v.log.Warn("store: open change stream for the read view", "err", err)
			}
			sleep(ctx, streamRetry)
			continue
		}
		if token == nil {
			// A fresh stream: everything before it is covered by a reload (the first time, there
			// is nothing loaded to reload).
			v.mark(touch{all: true})
		}
		invalidated := false
		for !invalidated && cs.Next(ctx) {
			invalidated = v.event(cs.Current)
			token = cs.ResumeToken()
		}
		if invalidated {
			_ = cs.Close(context.WithoutCancel(ctx))
			token = nil // a stream cannot resume after its invalidation
			continue
		}
		err = cs.Err()
		_ = cs.Close(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return
		}
		if resumeLost(err) {
			v.log.Warn("store: change stream token lost; reloading the read view", "err", err)
			token = nil
			continue
		}
		if t := cs.ResumeToken(); t != nil {
			token = t
		}
		sleep(ctx, streamRetry)
	}
}

// event queues what one change event names and reports whether it invalidated the stream.
func (v *View) event(raw bson.Raw) bool {
	op, _ := raw.Lookup("operationType").StringValueOK()
	coll, _ := raw.Lookup("ns", "coll").StringValueOK()
	switch op {
	case "insert", "update", "replace", "delete":
		id, err := raw.LookupErr("documentKey", "_id")
		if err != nil || coll == "" {
			v.mark(touch{all: true})
			return false
		}
		v.mark(touch{coll: coll, ids: []bson.RawValue{id}})
	case "drop":
		v.mark(touch{coll: coll, reload: true})
	default: // rename, dropDatabase, invalidate and anything newer
		v.mark(touch{all: true})
	}
	return op == "invalidate"
}

// resumeLost reports whether err says the stream cannot be resumed from its token.
func resumeLost(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return ce.Code == codeHistoryLost || ce.HasErrorLabel("NonResumableChangeStreamError")
	}
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(codeHistoryLost)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
