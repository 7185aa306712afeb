package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/sdk/client"
)

// LeaseSessions is what the lease endpoints ask of live node sessions (docs/node-protocol.md
// section 8). *session.Server satisfies it; the API uses it when Config.Sessions implements it.
type LeaseSessions interface {
	// RevokeAll revokes every lease nodeID holds and waits for each answer, bounded by ctx.
	RevokeAll(ctx context.Context, nodeID, reason string) (int, error)
	// RevokeLease revokes one lease on nodeID's live session; returns at once.
	RevokeLease(ctx context.Context, nodeID string, l *fencing.Lease, reason string)
	// DeliverFenceAck sends command fence_ack with nodeID's pending acknowledgements and waits.
	DeliverFenceAck(ctx context.Context, nodeID string) error
}

// removalRevokeTimeout bounds how long DELETE /nodes/{id} waits for a connected node to fence
// the leases it holds before removing it anyway (its leases are then superseded by token).
const removalRevokeTimeout = 30 * time.Second

// fenceAckDeliveryTimeout bounds the background delivery of command fence_ack after an
// acknowledgement; an undelivered one is sent again at the node's next session.
const fenceAckDeliveryTimeout = time.Minute

func apiLease(l *fencing.Lease) client.Lease {
	out := client.Lease{LeaseID: l.ID, ResourceType: l.ResourceType, ResourceID: l.ResourceID, Holder: l.Holder,
		FencingToken: l.FencingToken, Mode: string(l.Mode), DurationMS: l.DurationMS, GrantedAt: l.GrantedAt,
		FenceFailed: l.FenceFailed, Deleted: l.Deleted}
	if at, ok := l.Gate(); ok && !l.Deleted && !l.Blocked() {
		at := at.UTC()
		out.GateAt = &at
	}
	return out
}

func apiLeases(ls []fencing.Lease) []client.Lease {
	out := make([]client.Lease, 0, len(ls))
	for i := range ls {
		out = append(out, apiLease(&ls[i]))
	}
	return out
}

// listLeases serves GET /api/v1/leases (scope nodes:read): every lease, by id.
func (s *Server) listLeases(c echo.Context) error {
	ls, err := s.cfg.Leases.List(c.Request().Context(), nil)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, client.List[client.Lease]{Items: apiLeases(ls)})
}

// nodeFence serves GET /api/v1/nodes/{id}/fence (scope nodes:read): the node's failed fences and
// unconfirmed acknowledgements.
func (s *Server) nodeFence(c echo.Context) error {
	n, err := s.cfg.Nodes.Get(c.Request().Context(), c.Param("id"))
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	out := client.NodeFence{NodeID: n.ID, FenceFailure: []client.FenceFailure{}, FenceAckPending: n.FenceAckPending}
	if out.FenceAckPending == nil {
		out.FenceAckPending = []string{}
	}
	for _, f := range n.FenceFailure {
		out.FenceFailure = append(out.FenceFailure, client.FenceFailure(f))
	}
	return c.JSON(http.StatusOK, out)
}

// nodeLost serves POST /api/v1/nodes/{id}/lost (scope node:remove, human-only): the operator
// declares the node lost; every lease it holds is freed under a higher token (one compare-and-set
// each), so its stateful services may start elsewhere at once and its stale writes are refused.
// A connected node is also sent lease_revoke (reason lost). Idempotent; 404 node_not_found.
func (s *Server) nodeLost(c echo.Context) error {
	ctx := c.Request().Context()
	n, err := s.cfg.Nodes.Get(ctx, c.Param("id"))
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	// Each lease's change goes into its outbox, in the compare-and-set that supersedes it.
	wctx, done := s.changeCtx(c)
	changed, err := s.cfg.Leases.Lost(wctx, n.ID)
	done()
	for i := range changed {
		s.awaitChange(c, fencing.Collection, changed[i].ID, changed[i].LogOutbox)
	}
	if err != nil {
		return err
	}
	if ls, ok := s.cfg.Sessions.(LeaseSessions); ok {
		for i := range changed {
			ls.RevokeLease(context.WithoutCancel(ctx), n.ID, &changed[i], node.RevokeLost)
		}
	}
	out := client.LeaseChange{NodeID: n.ID, Leases: apiLeases(changed)}
	if len(changed) > 0 {
		s.log.Warn("node declared lost; its leases were superseded", "node_id", n.ID, "leases", len(changed))
		s.cfg.Hinter.Hint("node.lost")
	}
	return c.JSON(http.StatusOK, out)
}

// fenceAck serves POST /api/v1/nodes/{id}/fence-ack (scope node:fence_ack, human-only), body
// {"lease_ids": [...]}: exactly the node's outstanding failed fences, else 409 fence_ack_mismatch
// and nothing changes. The leases are freed under higher tokens and the node is sent command
// fence_ack now when connected, else at its next session (docs/node-protocol.md section 8.5).
func (s *Server) fenceAck(c echo.Context) error {
	var req client.FenceAckRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if len(req.LeaseIDs) == 0 {
		return problem(abierrors.ValidationFailed, "lease_ids must list the node's outstanding failed fences")
	}
	ctx := c.Request().Context()
	// The acknowledgement's change goes into the node's outbox, in its commit point.
	wctx, done := s.changeCtx(c)
	acked, err := s.cfg.Leases.FenceAck(wctx, c.Param("id"), req.LeaseIDs)
	done()
	switch {
	case errors.Is(err, fencing.ErrNodeNotFound):
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	case errors.Is(err, fencing.ErrAckMismatch):
		return problem(abierrors.FenceAckMismatch, deploy.TrimSentinel(err))
	case err != nil:
		return err
	}
	out := client.LeaseChange{NodeID: c.Param("id"), Leases: apiLeases(acked)}
	s.log.Warn("failed fences acknowledged by an operator", "node_id", out.NodeID, "lease_ids", req.LeaseIDs)
	if n, err := s.cfg.Nodes.Get(ctx, out.NodeID); err != nil {
		// The change is durable in the node's outbox: the log appends it at its next round.
		s.log.Warn("read the node's outbox after a fence acknowledgement", "node_id", out.NodeID, "err", err)
	} else {
		s.awaitChange(c, "nodes", n.ID, n.LogOutbox)
	}
	s.cfg.Hinter.Hint("node.fence_ack")
	if ls, ok := s.cfg.Sessions.(LeaseSessions); ok {
		go func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fenceAckDeliveryTimeout)
			defer cancel()
			if err := ls.DeliverFenceAck(dctx, out.NodeID); err != nil {
				s.log.Info("fence_ack not delivered now; it is sent at the node's next session", "node_id", out.NodeID, "err", err)
			}
		}()
	}
	return c.JSON(http.StatusOK, out)
}

// revokeForRemoval runs the lease part of a node removal (docs/node-protocol.md section 10): a
// connected node is sent lease_revoke for every lease it holds, each awaited (bounded), so it
// fences first; then every lease it still holds (it was not connected, or did not confirm) is
// superseded by token as when declaring it lost.
func (s *Server) revokeForRemoval(ctx context.Context, nodeID string) error {
	if s.cfg.Leases == nil {
		return nil
	}
	if ls, ok := s.cfg.Sessions.(LeaseSessions); ok {
		rctx, cancel := context.WithTimeout(ctx, removalRevokeTimeout)
		n, err := ls.RevokeAll(rctx, nodeID, node.RevokeLost)
		cancel()
		if err != nil {
			s.log.Info("node removal: not every lease revoke was confirmed; superseding them by token", "node_id", nodeID, "confirmed", n, "err", err)
		}
	}
	_, err := s.cfg.Leases.Lost(ctx, nodeID)
	return err
}

// checkFencing admits a shared-storage write carrying the fencing headers (docs/api.md "Fencing
// tokens"): both headers or none; a token lower than the highest the guard has seen for the
// resource is refused with 409 stale_fencing_token before anything is written.
func (s *Server) checkFencing(c echo.Context) error {
	tok, res := c.Request().Header.Get(client.HeaderFencingToken), c.Request().Header.Get(client.HeaderFencingResource)
	if tok == "" && res == "" {
		return nil
	}
	if s.cfg.Guard == nil {
		return problem(abierrors.Unavailable, "this server has no fencing guard")
	}
	token, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || res == "" || len(res) > 200 {
		return problem(abierrors.BadRequest, fmt.Sprintf("a fenced write carries both %s (an integer) and %s", client.HeaderFencingToken, client.HeaderFencingResource))
	}
	if err := s.cfg.Guard.Check(c.Request().Context(), res, token); errors.Is(err, fencing.ErrStaleToken) {
		s.log.Warn("write refused: stale fencing token", "resource", res, "token", token)
		return problem(abierrors.StaleFencingToken, deploy.TrimSentinel(err))
	} else if err != nil {
		return err
	}
	return nil
}
