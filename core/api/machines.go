package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/machines"
)

// registerMachines serves /machines (docs/machines.md section 4) when berthd runs the machine
// worker.
func (s *Server) registerMachines(v1 *echo.Group) {
	if s.cfg.Machines == nil {
		return
	}
	v1.POST("/machines", s.createMachine, s.auth(identity.ScopeNodeEnroll))
	v1.GET("/machines", s.listMachines, s.auth(identity.ScopeNodesRead))
	v1.GET("/machines/:id", s.getMachine, s.auth(identity.ScopeNodesRead))
	v1.DELETE("/machines/:id", s.deleteMachine, s.auth(identity.ScopeNodeEnroll))
}

// machineError maps the machines package's refusals to problems.
func machineError(err error) error {
	switch {
	case errors.Is(err, machines.ErrInvalid):
		return problem(abierrors.ValidationFailed, err.Error())
	case errors.Is(err, machines.ErrNoProvider):
		return problem(abierrors.ValidationFailed, err.Error())
	case errors.Is(err, machines.ErrNotFound):
		return problem(abierrors.NotFound, err.Error())
	}
	return err
}

// createMachine serves POST /machines: the machine is recorded and its create operation
// enqueued; the answer (202) is the machine in state provisioning. An Idempotency-Key header
// makes a repeat return the same machine.
func (s *Server) createMachine(c echo.Context) error {
	var req machines.CreateRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	req.IdempotencyKey = c.Request().Header.Get("Idempotency-Key")
	m, err := s.cfg.Machines.Create(c.Request().Context(), req)
	if err != nil {
		return machineError(err)
	}
	s.log.Info("machine requested", "machine", m.ID, "provider", m.Provider, "type", m.Type, "location", m.Location, "operation", m.Operation)
	return c.JSON(http.StatusAccepted, m)
}

func (s *Server) listMachines(c echo.Context) error {
	ms, err := s.cfg.Machines.List(c.Request().Context())
	if err != nil {
		return err
	}
	if ms == nil {
		ms = []machines.Machine{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ms})
}

func (s *Server) getMachine(c echo.Context) error {
	m, err := s.cfg.Machines.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return machineError(err)
	}
	return c.JSON(http.StatusOK, m)
}

// deleteMachine serves DELETE /machines/{id}: the deletion of its server is enqueued (202).
func (s *Server) deleteMachine(c echo.Context) error {
	m, err := s.cfg.Machines.Delete(c.Request().Context(), c.Param("id"))
	if err != nil {
		return machineError(err)
	}
	s.log.Info("machine deletion requested", "machine", m.ID, "node", m.NodeID)
	return c.JSON(http.StatusAccepted, m)
}
