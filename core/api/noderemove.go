package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/nodes"
)

// NodeRemover ends a removed node's live session with a fatal node_removed
// (docs/node-protocol.md section 10). *session.Server satisfies it; the API
// uses it when Config.Sessions implements it.
type NodeRemover interface {
	Remove(ctx context.Context, nodeID string)
}

// removeNode serves DELETE /api/v1/nodes/{id} (scope node:remove, human-only):
// the node is marked removed, its session ends with a fatal node_removed, it
// never authenticates again, and the reconciler moves its workloads. The node
// itself stops dialling and leaves its workloads running; nothing on it is
// destroyed remotely. Answers 204, also for a node already removed (the
// change is recorded once); 404 node_not_found for an unknown id.
func (s *Server) removeNode(c echo.Context) error {
	ctx := c.Request().Context()
	if _, err := s.cfg.Nodes.Get(ctx, c.Param("id")); errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	// Leases first: a connected node fences before its session ends (section 10).
	if err := s.revokeForRemoval(ctx, c.Param("id")); err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	n, changed, err := s.cfg.Nodes.Remove(wctx, c.Param("id"))
	done()
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	if r, ok := s.cfg.Sessions.(NodeRemover); ok {
		r.Remove(ctx, n.ID)
	}
	if changed {
		s.log.Info("node removed", "node_id", n.ID, "hostname", n.Hostname)
		s.awaitChange(c, "nodes", n.ID, n.LogOutbox)
		s.cfg.Hinter.Hint("node.removed")
	}
	return c.NoContent(http.StatusNoContent)
}
