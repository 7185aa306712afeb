package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/berthhq/berth/core/registry"
)

// RegistryCollector runs the registry's retention pass; *registry.Collector implements it.
type RegistryCollector interface {
	// Collect runs one pass; with dryRun it deletes nothing and reports what would go
	// (docs/registry.md section 10).
	Collect(ctx context.Context, dryRun bool) (*registry.GCReport, error)
}

// registryGCRequest is the optional body of POST /api/v1/registry/gc.
type registryGCRequest struct {
	DryRun bool `json:"dry_run"`
}

// registryGC serves POST /api/v1/registry/gc (admin, docs/api.md section 9): one retention
// pass of the registry, or with {"dry_run": true} the list of what it would delete. The answer
// is the pass's report.
func (s *Server) registryGC(c echo.Context) error {
	var req registryGCRequest
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	rep, err := s.cfg.RegistryGC.Collect(c.Request().Context(), req.DryRun)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}
