package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
)

// changeTimeout bounds how long a request waits for the entry of its change
// once the write committed; the entry is appended whether or not it waits.
const changeTimeout = 10 * time.Second

// writeTimeout bounds a write that runs detached from its request.
const writeTimeout = 30 * time.Second

// changeCtx returns the context for a write that records its change: the
// request's values carrying its principal as the change-log actor, so a
// store that records its writes puts the change in the written document's
// outbox, in the same write (docs/node-protocol.md section 7.2). It is
// detached from the request's cancellation (bounded by writeTimeout): a
// client that leaves mid-write does not leave a write that committed
// unseen by the handler that hands its change to the log. Without a change
// log it is the plain request context. Call cancel when the write is done.
func (s *Server) changeCtx(c echo.Context) (ctx context.Context, cancel context.CancelFunc) {
	ctx = c.Request().Context()
	if s.cfg.Changelog == nil {
		return ctx, func() {}
	}
	a := changelog.Actor{Type: "system", ID: "berthd", IdempotencyKey: idempotencyKey(c)}
	if p := principal(c); p != nil {
		a.Type, a.ID = actorOf(p)
	}
	ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	return changelog.WithActor(ctx, a), cancel
}

// awaitChange hands the changes in the outbox of the document id in
// collection coll, as the write left it (its own change last, after any
// earlier write's still pending), to the change log and waits, at most
// changeTimeout and not past the request, for the entry of its own. The
// change is durable in the document already: a failure or a timeout here is
// logged, and the log appends it anyway (now, on its next round, or at the
// next start).
func (s *Server) awaitChange(c echo.Context, coll string, id any, outbox []changelog.Pending) {
	s.awaitRemoval(c, coll, id, "", outbox)
}

// awaitRemoval is awaitChange for a document deleted in two steps
// (changelog.RemoveOnField): removeOn is the id of its deletion change,
// whose append removes the document ("" for a document that stays).
func (s *Server) awaitRemoval(c echo.Context, coll string, id any, removeOn string, outbox []changelog.Pending) {
	if s.cfg.Changelog == nil || len(outbox) == 0 {
		return
	}
	p := outbox[len(outbox)-1]
	ctx, cancel := context.WithTimeout(c.Request().Context(), changeTimeout)
	defer cancel()
	if _, err := s.cfg.Changelog.RecordOutbox(ctx, changelog.Ref{Collection: coll, ID: id, RemoveOn: removeOn}, outbox); err != nil {
		s.log.Warn("change stored; its change-log entry follows", "entity_type", p.EntityType, "entity_id", p.EntityID, "change_id", p.ID, "err", err)
	}
}

// refuseLargeChange answers 413 change_too_large when a change of entityType
// with payload could not fit in one change-log entry (docs/node-protocol.md
// section 7.8), for writes without an outbox that must be refused before
// they are stored. payload is a provisional form of what the write records,
// with ids and names at their widest, so it is at least as large.
func refuseLargeChange(entityType string, payload any) error {
	wide := strings.Repeat("x", 64)
	_, err := changelog.Prepare(changelog.Change{ActorType: wide, ActorID: wide, EntityType: entityType, EntityID: wide, Op: node.OpCreate, Payload: payload})
	if errors.Is(err, changelog.ErrEntryTooLarge) {
		return abierrors.Wrap(abierrors.ChangeTooLarge, deploy.TrimSentinel(err), nil)
	}
	return err
}

// listChangelog serves GET /api/v1/changelog for auditors (docs/node-protocol.md section
// 7.3): {"entries": [...], "head_seq": S, "next_seq": N} with up to limit (default and at most
// 500) entries, each as sent in log_entries. Without a filter, the consecutive entries from
// from_seq (default 1); with entity_type, entity_id, op or actor_id, those that match, scanned
// from from_seq up, or with order=desc from until_seq (default the head) down, reading at
// most changelog.DefaultMaxScan entries; next_seq is where the same query goes on.
func (s *Server) listChangelog(c echo.Context) error {
	from, err := queryInt(c, "from_seq", 1)
	if err != nil {
		return err
	}
	until, err := queryInt(c, "until_seq", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(c, "limit", node.MaxLogBatch)
	if err != nil {
		return err
	}
	if from < 1 || limit < 1 || limit > node.MaxLogBatch {
		return problem(abierrors.ValidationFailed, "from_seq must be at least 1 and limit between 1 and 500")
	}
	q := changelog.Query{FromSeq: from, UntilSeq: until, Limit: int(limit),
		EntityType: c.QueryParam("entity_type"), EntityID: c.QueryParam("entity_id"), Op: c.QueryParam("op"), ActorID: c.QueryParam("actor_id")}
	for name, v := range map[string]string{"entity_type": q.EntityType, "entity_id": q.EntityID, "op": q.Op, "actor_id": q.ActorID} {
		if len(v) > 200 {
			return problem(abierrors.ValidationFailed, name+" is longer than 200 bytes")
		}
	}
	switch c.QueryParam("order") {
	case "", "asc":
	case "desc":
		q.Desc = true
	default:
		return problem(abierrors.ValidationFailed, "order must be asc or desc")
	}
	res, err := s.cfg.Changelog.Find(c.Request().Context(), q)
	if errors.Is(err, changelog.ErrBadQuery) {
		return problem(abierrors.ValidationFailed, "until_seq must be at least from_seq")
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"entries": res.Entries, "head_seq": res.Head, "next_seq": res.NextSeq})
}
