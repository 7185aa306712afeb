package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
)

// recordChange appends a change made by the request's principal to the change
// log (docs/node-protocol.md section 7). The change is already stored, so a
// failure here is logged, not returned: the next change still chains on the
// current head.
func (s *Server) recordChange(c echo.Context, entityType, entityID, op string, payload any) {
	actorType, actorID := actorOf(principal(c))
	s.recordChangeAs(c, actorType, actorID, entityType, entityID, op, payload)
}

// recordChangeAs is recordChange with an explicit actor, for requests that
// carry no principal (enrollment, where the join token is the proof and the
// new node is the actor).
func (s *Server) recordChangeAs(c echo.Context, actorType, actorID, entityType, entityID, op string, payload any) {
	if s.cfg.Changelog == nil {
		return
	}
	if _, err := s.cfg.Changelog.Append(c.Request().Context(), changelog.Change{
		ActorType: actorType, ActorID: actorID, EntityType: entityType, EntityID: entityID, Op: op, Payload: payload,
		IdempotencyKey: idempotencyKey(c),
	}); err != nil {
		s.log.Error("append to the change log", "entity_type", entityType, "entity_id", entityID, "err", err)
	}
}

// listChangelog serves GET /api/v1/changelog?from_seq=N&limit=L for auditors:
// {"entries": [...], "head_seq": S} with up to L (default and at most 500)
// consecutive entries from N (default 1), each as sent in log_entries
// (docs/node-protocol.md section 7).
func (s *Server) listChangelog(c echo.Context) error {
	from, err := queryInt(c, "from_seq", 1)
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
	ctx := c.Request().Context()
	head, _, err := s.cfg.Changelog.Head(ctx)
	if err != nil {
		return err
	}
	entries, err := s.cfg.Changelog.Range(ctx, from, int(limit))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"entries": entries, "head_seq": head})
}

// nodeLogPayload is a node as the change log records it: what the cluster
// decided about the node, never its credential digest, and none of its
// session state (status, last seen, applied revision), which is observation,
// not a change of desired state (docs/node-protocol.md section 7.1).
func nodeLogPayload(n *nodes.Node) map[string]any {
	return map[string]any{
		"id": n.ID, "hostname": n.Hostname, "region": n.Region, "labels": n.Labels, "address": n.Address,
		"cpus": n.CPUs, "memory_mb": n.MemoryMB, "public_key": n.PublicKey, "enrolled_at": n.EnrolledAt.UTC(),
	}
}
