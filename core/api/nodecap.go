package api

import (
	"errors"
	"fmt"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/sdk/client"
)

// maxDrainDeadline bounds the deadline a drain may ask for.
const maxDrainDeadline = 7 * 24 * time.Hour

// registerNodeCapacity adds the operator's node maintenance routes: capacity override, cordon,
// uncordon and drain (docs/api.md section 4, docs/operating.md "Node capacity" and "Cordon and
// drain").
func (s *Server) registerNodeCapacity(v1 *echo.Group) {
	v1.PUT("/nodes/:id/capacity", s.setNodeCapacity, s.auth(identity.ScopeAdmin))
	v1.POST("/nodes/:id/cordon", s.cordonNode, s.auth(identity.ScopeAdmin))
	v1.POST("/nodes/:id/uncordon", s.uncordonNode, s.auth(identity.ScopeAdmin))
	v1.POST("/nodes/:id/drain", s.drainNode, s.auth(identity.ScopeAdmin))
}

// nodeChangeError maps the errors of the registry's operator changes onto problems.
func nodeChangeError(id string, err error) error {
	switch {
	case errors.Is(err, nodes.ErrNotFound):
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", id))
	case errors.Is(err, nodes.ErrInvalid):
		return problem(abierrors.ValidationFailed, deploy.TrimSentinel(err))
	case errors.Is(err, nodes.ErrNotMember):
		return problem(abierrors.NodeAlreadyRetired, fmt.Sprintf("node %s is removed or retiring: it takes no placement", id))
	case errors.Is(err, nodes.ErrConflict):
		return problem(abierrors.Conflict, fmt.Sprintf("node %s changed concurrently several times; try again", id))
	}
	return err
}

// setNodeCapacity serves PUT /api/v1/nodes/{id}/capacity ([client.NodeCapacityRequest]) and
// answers the node.
func (s *Server) setNodeCapacity(c echo.Context) error {
	var req client.NodeCapacityRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	var o *nodes.Resources
	if !req.Clear {
		o = &nodes.Resources{CPUMilli: req.CPUMilli, MemoryMiB: req.MemoryMiB, DiskMiB: req.DiskMiB, Extended: req.Extended}
	}
	wctx, done := s.changeCtx(c)
	n, err := s.cfg.Nodes.SetCapacityOverride(wctx, c.Param("id"), o)
	done()
	if err != nil {
		return nodeChangeError(c.Param("id"), err)
	}
	s.log.Info("node capacity override set", "node_id", n.ID, "override", n.CapacityOverride)
	return s.nodeChanged(c, n, "node.capacity")
}

// cordonNode serves POST /api/v1/nodes/{id}/cordon.
func (s *Server) cordonNode(c echo.Context) error { return s.cordon(c, true) }

// uncordonNode serves POST /api/v1/nodes/{id}/uncordon; it ends a drain too.
func (s *Server) uncordonNode(c echo.Context) error { return s.cordon(c, false) }

func (s *Server) cordon(c echo.Context, on bool) error {
	wctx, done := s.changeCtx(c)
	n, err := s.cfg.Nodes.Cordon(wctx, c.Param("id"), on)
	done()
	if err != nil {
		return nodeChangeError(c.Param("id"), err)
	}
	s.log.Info("node cordon changed", "node_id", n.ID, "cordoned", n.Cordoned)
	return s.nodeChanged(c, n, "node.cordon")
}

// drainNode serves POST /api/v1/nodes/{id}/drain ([client.NodeDrainRequest]): it cordons the
// node and marks it draining, and answers 202 with the node and its drain's progress.
func (s *Server) drainNode(c echo.Context) error {
	var req client.NodeDrainRequest
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	if req.DeadlineS < 0 || time.Duration(req.DeadlineS)*time.Second > maxDrainDeadline {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("deadline_s must be between 0 (none) and %d", int(maxDrainDeadline.Seconds())))
	}
	var deadline time.Time
	if req.DeadlineS > 0 {
		deadline = s.now().Add(time.Duration(req.DeadlineS) * time.Second)
	}
	wctx, done := s.changeCtx(c)
	n, err := s.cfg.Nodes.StartDrain(wctx, c.Param("id"), deadline)
	done()
	if err != nil {
		return nodeChangeError(c.Param("id"), err)
	}
	s.log.Info("node draining", "node_id", n.ID, "deadline", n.Drain.Deadline)
	return s.nodeChanged(c, n, "node.drain")
}

// nodeChanged waits for n's change-log entry, wakes the reconciler with hint, and answers the node
// as GET /nodes/{id} does.
func (s *Server) nodeChanged(c echo.Context, n *nodes.Node, hint string) error {
	s.awaitChange(c, "nodes", n.ID, n.LogOutbox)
	s.cfg.Hinter.Hint(hint)
	return s.getNode(c)
}
