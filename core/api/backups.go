package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/labstack/echo/v4"

	abibackups "github.com/berthhq/berth/abi/backups"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/services"
)

// BackupsConfig serves the service backup routes (docs/backups.md, docs/api.md section 13).
type BackupsConfig struct {
	Manager *backups.Manager
	// Bindings names the bindings a service declares and their kinds; nil means none is
	// declared, so every backup request is refused backup_nothing_to_back.
	Bindings BindingKinds
}

// BindingKinds reports the bindings a service declares: binding name to kind. The core's
// bindings implement it; an unknown service answers services.ErrServiceNotFound.
type BindingKinds interface {
	BindingKinds(ctx context.Context, projectID, service string) (map[string]abibackups.Kind, error)
}

// BindingKindsFunc adapts a function to [BindingKinds].
type BindingKindsFunc func(ctx context.Context, projectID, service string) (map[string]abibackups.Kind, error)

// BindingKinds implements BindingKinds.
func (f BindingKindsFunc) BindingKinds(ctx context.Context, projectID, service string) (map[string]abibackups.Kind, error) {
	return f(ctx, projectID, service)
}

func (s *Server) registerBackups(v1 *echo.Group) {
	if s.cfg.Backups == nil || s.cfg.Backups.Manager == nil {
		return
	}
	v1.POST("/projects/:project/services/:name/backups", s.createBackup, s.auth(identity.ScopeServicesWrite))
	v1.GET("/projects/:project/backups", s.listBackups, s.auth(identity.ScopeServicesRead))
	v1.GET("/projects/:project/backups/:id", s.getBackup, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/backups/:id/restore", s.restoreBackup, s.auth(identity.ScopeServicesWrite))
	v1.POST("/projects/:project/backups/:id/drill", s.drillBackup, s.auth(identity.ScopeServicesWrite))
}

// backupProblem turns a core/backups error into its problem; others stay internal.
func backupProblem(err error) error {
	var ae *abierrors.Error
	if errors.As(err, &ae) {
		return abierrors.New(ae.Code, err.Error())
	}
	if errors.Is(err, operations.ErrIdempotencyKeyReused) {
		return problem(abierrors.IdempotencyKeyReused, "the idempotency key was used for another backup request")
	}
	return err
}

// requestKey is the request's Idempotency-Key, or a fresh random one: a request without a key
// asks for a new backup every time.
func requestKey(c echo.Context) string {
	if k := c.Request().Header.Get(HeaderIdempotencyKey); k != "" {
		return k
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "anon:" + hex.EncodeToString(b)
}

// createBackup requests a backup of one binding (body {"binding": "db"}) or of every binding
// the service declares (no body or no binding): 202 with {"items": [records]}.
func (s *Server) createBackup(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	var req struct {
		Binding string `json:"binding"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	svc, err := s.cfg.Catalog.GetService(ctx, p, c.Param("name"))
	if err != nil {
		return serviceError(err)
	}
	kinds := map[string]abibackups.Kind{}
	if s.cfg.Backups.Bindings != nil {
		if kinds, err = s.cfg.Backups.Bindings.BindingKinds(ctx, p.ID, svc.Name); err != nil {
			return serviceError(err)
		}
	}
	names := make([]string, 0, len(kinds))
	for n := range kinds {
		if req.Binding == "" || n == req.Binding {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		if req.Binding != "" {
			return problem(abierrors.BackupNothingToBack, fmt.Sprintf("service %s declares no binding %q", svc.Name, req.Binding))
		}
		return problem(abierrors.BackupNothingToBack, fmt.Sprintf("service %s declares no bindings to back up", svc.Name))
	}
	sort.Strings(names)
	key := requestKey(c)
	keep := 0 // the committer's default
	if svc.Backup != nil {
		keep = backups.Schedule{Keep: svc.Backup.Keep}.KeepOrDefault()
	}
	out := make([]backups.Record, 0, len(names))
	for _, n := range names {
		rec, _, err := s.cfg.Backups.Manager.Request(ctx, backups.BackupRequest{ProjectID: p.ID, Service: svc.Name, Binding: n, Kind: kinds[n], IdempotencyKey: key, Keep: keep})
		if err != nil {
			return backupProblem(err)
		}
		s.log.Info("backup requested", "project", p.Name, "service", svc.Name, "binding", n, "backup", rec.ID, "operation_id", rec.OperationID)
		out = append(out, *rec)
	}
	return c.JSON(http.StatusAccepted, map[string]any{"items": out})
}

// listBackups answers a project's backups, newest first, optionally of one service
// (?service=web): {"items": [records]}, each with its last drill.
func (s *Server) listBackups(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	svc := c.QueryParam("service")
	if svc != "" {
		if err := checkName("service", svc); err != nil {
			return err
		}
	}
	list, err := s.cfg.Backups.Manager.List(c.Request().Context(), p.ID, svc)
	if err != nil {
		return err
	}
	if list == nil {
		list = []backups.Record{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": list})
}

func (s *Server) getBackup(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	rec, err := s.cfg.Backups.Manager.Get(c.Request().Context(), p.ID, c.Param("id"))
	if err != nil {
		return backupProblem(err)
	}
	return c.JSON(http.StatusOK, rec)
}

// restoreBackup checks every precondition and enqueues the restore (docs/backups.md section
// 6): body {"into": "web", "into_scratch": false, "while_running": false}; 202 with the
// operation.
func (s *Server) restoreBackup(c echo.Context) error {
	var req struct {
		Into         string `json:"into"`
		IntoScratch  bool   `json:"into_scratch"`
		WhileRunning bool   `json:"while_running"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	if req.Into != "" {
		if err := checkName("service", req.Into); err != nil {
			return err
		}
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	target := backups.TargetFunc(func(ctx context.Context, projectID, service, binding string) (bool, bool, bool, error) {
		svc, err := s.cfg.Catalog.GetService(ctx, p, service)
		if errors.Is(err, services.ErrServiceNotFound) {
			return false, false, false, nil
		}
		if err != nil {
			return false, false, false, err
		}
		has := false
		if s.cfg.Backups.Bindings != nil {
			kinds, err := s.cfg.Backups.Bindings.BindingKinds(ctx, projectID, service)
			if err != nil {
				return false, false, false, err
			}
			_, has = kinds[binding]
		}
		return true, svc.Replicas > 0, has, nil
	})
	op, err := s.cfg.Backups.Manager.Restore(c.Request().Context(), target, backups.RestoreRequest{ProjectID: p.ID, BackupID: c.Param("id"),
		Into: req.Into, IntoScratch: req.IntoScratch, WhileRunning: req.WhileRunning, IdempotencyKey: requestKey(c)})
	if err != nil {
		return backupProblem(err)
	}
	s.log.Info("restore requested", "project", p.Name, "backup", c.Param("id"), "operation_id", op.ID)
	return c.JSON(http.StatusAccepted, map[string]any{"operation_id": op.ID, "state": op.State, "kind": op.Kind})
}

// drillBackup enqueues a restore drill of one backup now (docs/backups.md section 5): no
// body; 202 with the operation. A repeated Idempotency-Key answers the same operation.
func (s *Server) drillBackup(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	op, err := s.cfg.Backups.Manager.DrillBackup(c.Request().Context(), p.ID, c.Param("id"), requestKey(c))
	if err != nil {
		return backupProblem(err)
	}
	s.log.Info("drill requested", "project", p.Name, "backup", c.Param("id"), "operation_id", op.ID)
	return c.JSON(http.StatusAccepted, map[string]any{"operation_id": op.ID, "state": op.State, "kind": op.Kind})
}
