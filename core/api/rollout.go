package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// registerRollout adds the runtime spec, slot, rollout and node retirement routes
// (docs/reconciliation.md sections 1, 7, 10 and 11).
func (s *Server) registerRollout(v1 *echo.Group) {
	v1.GET("/projects/:project/services/:name/spec", s.getRuntimeSpec, s.auth(identity.ScopeServicesRead))
	v1.PUT("/projects/:project/services/:name/spec", s.putRuntimeSpec, s.auth(identity.ScopeServiceDeploy))
	v1.GET("/projects/:project/services/:name/workloads", s.serviceSlots, s.auth(identity.ScopeServicesRead))
	v1.GET("/projects/:project/services/:name/rollout", s.getRollout, s.auth(identity.ScopeServicesRead))
	v1.GET("/projects/:project/services/:name/placement", s.explainPlacement, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/services/:name/rollout/undo", s.rolloutUndo, s.auth(identity.ScopeServiceDeploy))
	v1.POST("/projects/:project/services/:name/rebalance", s.rebalance, s.auth(identity.ScopeServiceDeploy))
	for _, a := range []services.RolloutAction{services.RolloutPause, services.RolloutResume, services.RolloutRestart} {
		v1.POST("/projects/:project/services/:name/rollout/"+string(a), s.rolloutControl(a), s.auth(identity.ScopeServiceDeploy))
	}
	v1.POST("/nodes/:id/retire", s.retireNode, s.auth(identity.ScopeNodeRemove, reauth))
}

func (s *Server) views() rollout.Views {
	return rollout.Views{Store: s.runtime, Catalog: s.cfg.Catalog, Nodes: s.cfg.Nodes}
}

// explainPlacement answers where each replica of the service stands or would go, and why
// (docs/placement.md section 6).
func (s *Server) explainPlacement(c echo.Context) error {
	return serviceView(s, c, s.views().Placement)
}

// rebalance serves POST /api/v1/projects/{p}/services/{s}/rebalance (docs/placement.md section
// 7): the decider's moves that improve the service's spread, recorded on the service through
// the deployer (cause rollout.rebalance) and carried out by the rollout under its bounds. The
// optional body {"dry_run": bool, "expected_revision": int} asks only for the moves (nothing is
// written), or records them only while the service is at that revision. Moves that equal what
// the service already carries, or none over none pending, write nothing.
func (s *Server) rebalance(c echo.Context) error {
	var req client.RebalanceRequest
	p, svc, err := s.boundService(c, &req)
	if err != nil {
		return err
	}
	if req.ExpectedRevision != nil && *req.ExpectedRevision != svc.Revision {
		return serviceError(fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, svc.Name, svc.Revision, *req.ExpectedRevision))
	}
	ctx := c.Request().Context()
	plan, err := s.views().Rebalance(ctx, svc)
	if err != nil {
		return err
	}
	if req.DryRun || !plan.NeedsWrite() {
		out := plan.Result(svc)
		out.DryRun = req.DryRun
		return c.JSON(http.StatusOK, out)
	}
	// The moves were decided over this revision: record them only while it stands.
	ch := s.change(c, deploy.CauseRolloutRebalance, p, svc.Name, &svc.Revision)
	wctx, done := s.changeCtx(c)
	res, err := s.deployer.Rebalance(wctx, ch, plan.Recorded())
	done()
	s.policyWarnings(c, res.Warnings)
	if err != nil {
		return deployError(err)
	}
	written := res.Service
	s.log.Info("service rebalanced", "project", p.Name, "service", svc.Name, "service_id", svc.ID, "revision", written.Revision,
		"generation", written.Rebalance.Generation, "moves", len(plan.Moves), "spread_before", plan.Before.Domains, "spread_after", plan.After.Domains)
	if res.Changed() {
		s.awaitChange(c, "services", written.ID, written.LogOutbox)
	}
	out := plan.Result(written)
	out.Recorded = res.Changed()
	return c.JSON(http.StatusOK, out)
}

// revisionBody is the optional body {"expected_revision": int} of a change to a named
// service: the change is made only while the service is at that revision (nil: at any).
type revisionBody struct {
	ExpectedRevision *int64 `json:"expected_revision"`
}

// boundService binds the request's optional body into req, then reads the service of the
// request's :project and :name ([Server.namedService]).
func (s *Server) boundService(c echo.Context, req any) (*services.Project, *services.Service, error) {
	if err := s.bindOptional(c, req); err != nil {
		return nil, nil, err
	}
	return s.namedService(c)
}

// namedService reads the service of the request's :project and :name.
func (s *Server) namedService(c echo.Context) (*services.Project, *services.Service, error) {
	if err := checkName("service", c.Param("name")); err != nil {
		return nil, nil, err
	}
	p, err := s.project(c, false)
	if err != nil {
		return nil, nil, err
	}
	svc, err := s.cfg.Catalog.GetService(c.Request().Context(), p, c.Param("name"))
	if err != nil {
		return nil, nil, serviceError(err)
	}
	return p, svc, nil
}

// refusalError maps a named refusal of docs/reconciliation.md onto its problem code.
func refusalError(err error) error {
	var r *slots.Refusal
	if !errors.As(err, &r) {
		return err
	}
	code := abierrors.Code(strings.ReplaceAll(string(r.Reason), "-", "_"))
	if r.Reason == slots.ReasonServiceNotFound {
		code = abierrors.ServiceNotFound
	}
	msg := r.Detail // the code already names the reason
	if msg == "" {
		msg = string(r.Reason)
	}
	return problem(code, msg)
}

func toSpecDoc(svc *services.Service, d *rollout.SpecDoc) (client.RuntimeSpecDoc, error) {
	out := client.RuntimeSpecDoc{Service: svc.Project + "/" + svc.Name, Source: d.Source}
	raw, err := json.Marshal(d.Spec)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out.Spec); err != nil {
		return out, err
	}
	out.Spec.Revision = d.Revision
	return out, nil
}

// getRuntimeSpec serves GET /api/v1/projects/{p}/services/{s}/spec: the spec in force. A service
// whose derived spec the sweep has not stored yet answers it at revision 0.
func (s *Server) getRuntimeSpec(c echo.Context) error {
	_, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	if svc.Stateful() {
		return problem(abierrors.NotFound, "a stateful service is placed under its lease and has no runtime spec")
	}
	d, err := s.runtime.SpecInForce(c.Request().Context(), svc)
	if err != nil {
		return err
	}
	out, err := toSpecDoc(svc, d)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// putRuntimeSpec serves PUT /api/v1/projects/{p}/services/{s}/spec (docs/reconciliation.md
// section 1): one compare-and-set on the spec's revision; refusals by name.
func (s *Server) putRuntimeSpec(c echo.Context) error {
	var w client.SpecWrite
	if err := s.bind(c, &w); err != nil {
		return err
	}
	_, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	if svc.Stateful() {
		return problem(abierrors.ValidationFailed, "a stateful service is placed under its lease; runtime specs are for portable services")
	}
	raw, err := json.Marshal(w.Spec)
	if err != nil {
		return err
	}
	var sp slots.Spec
	if err := json.Unmarshal(raw, &sp); err != nil {
		return problem(abierrors.BadRequest, "spec: "+err.Error())
	}
	ctx := c.Request().Context()
	members, err := s.memberNodes(ctx)
	if err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	d, err := s.runtime.PutSpec(wctx, svc, slots.SpecWrite{Spec: sp, ExpectedRevision: w.ExpectedRevision}, members)
	done()
	if err != nil {
		return refusalError(err)
	}
	s.log.Info("runtime spec written", "project", svc.Project, "service", svc.Name, "revision", d.Revision)
	s.awaitChange(c, "runtime_specs", d.ServiceID, d.LogOutbox)
	out, err := toSpecDoc(svc, d)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// memberNodes returns the ids of enrolled nodes that are neither removed nor retiring.
func (s *Server) memberNodes(ctx context.Context) (map[string]bool, error) {
	ns, err := s.cfg.Nodes.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ns))
	for i := range ns {
		if ns[i].Member() {
			out[ns[i].ID] = true
		}
	}
	return out, nil
}

// serviceSlots serves GET /api/v1/projects/{p}/services/{s}/workloads (docs/reconciliation.md
// section 11): the service's slots in replica order, read from the stored rows only.
func (s *Server) serviceSlots(c echo.Context) error {
	return serviceView(s, c, func(ctx context.Context, svc *services.Service) (client.List[client.SlotView], error) {
		rows, err := s.views().Slots(ctx, svc)
		return client.List[client.SlotView]{Items: rows}, err
	})
}

// serviceView answers 200 with what view, a read-only runtime view, says of the service the
// request names.
func serviceView[T any](s *Server, c echo.Context, view func(context.Context, *services.Service) (T, error)) error {
	_, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	out, err := view(c.Request().Context(), svc)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// getRollout serves GET /api/v1/projects/{p}/services/{s}/rollout.
func (s *Server) getRollout(c echo.Context) error {
	return serviceView(s, c, s.views().Rollout)
}

// rolloutUndo serves POST /api/v1/projects/{p}/services/{s}/rollout/undo: the service returns to
// its previous release with one compare-and-set, and rolls slot by slot like any release change.
//
// The optional body {"dry_run": bool, "expected_revision": int} asks only for what the undo would
// change (nothing is written), or undoes only while the service is at that revision. Either way
// the answer is the service (as it is, or after the write) with "changes" listing the fields the
// undo changes or changed (docs/api.md section 4).
func (s *Server) rolloutUndo(c echo.Context) error {
	var req struct {
		DryRun           bool   `json:"dry_run"`
		ExpectedRevision *int64 `json:"expected_revision"`
	}
	p, svc, err := s.boundService(c, &req)
	if err != nil {
		return err
	}
	noPrevious := func() error {
		return problem(abierrors.NoPreviousRelease, fmt.Sprintf("service %s/%s never ran another release or configuration: nothing to go back to", p.Name, svc.Name))
	}
	changes, err := services.UndoChanges(svc)
	if errors.Is(err, services.ErrNoPreviousRelease) {
		return noPrevious()
	} else if err != nil {
		return err
	}
	if req.DryRun {
		if req.ExpectedRevision != nil && *req.ExpectedRevision != svc.Revision {
			return serviceError(fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, svc.Name, svc.Revision, *req.ExpectedRevision))
		}
		return c.JSON(http.StatusOK, client.UndoResult{Service: toAPIService(svc, 0), Changes: apiUndoChanges(changes), DryRun: true})
	}
	expected := req.ExpectedRevision
	if expected == nil {
		expected = &svc.Revision // the changes listed are those of the revision read
	}
	ch := s.change(c, deploy.CauseRolloutUndo, p, svc.Name, expected)
	if back := svc.Previous; back != nil && *expected == svc.Revision {
		// Going back may make the service take secrets again: the rule of any service write
		// (another expected revision is refused by the undo itself).
		if err := s.deployer.CheckSecretUse(ch, svc, back.Secrets, back.SecretSets); err != nil {
			return err
		}
	}
	wctx, done := s.changeCtx(c)
	res, err := s.deployer.Undo(wctx, ch)
	done()
	s.policyWarnings(c, res.Warnings)
	if errors.Is(err, services.ErrNoPreviousRelease) {
		return noPrevious()
	} else if err != nil {
		return deployError(err)
	}
	out := res.Service
	s.log.Info("rollout undone", "project", p.Name, "service", svc.Name, "service_id", svc.ID, "release", out.Release().Digest(), "revision", out.Revision)
	s.awaitChange(c, "services", out.ID, out.LogOutbox)
	return c.JSON(http.StatusOK, client.UndoResult{Service: toAPIService(out, 0), Changes: apiUndoChanges(changes)})
}

func apiUndoChanges(cs []services.UndoChange) []client.UndoChange {
	out := make([]client.UndoChange, len(cs))
	for i, c := range cs {
		out[i] = client.UndoChange(c)
	}
	return out
}

// retireNode serves POST /api/v1/nodes/{id}/retire (docs/reconciliation.md section 10).
func (s *Server) retireNode(c echo.Context) error {
	var req struct {
		Disposition string `json:"disposition"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	wctx, done := s.changeCtx(c)
	n, err := s.cfg.Nodes.Retire(wctx, c.Param("id"), req.Disposition)
	done()
	switch {
	case errors.Is(err, nodes.ErrNotFound):
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	case errors.Is(err, nodes.ErrBadDisposition):
		return problem(abierrors.ValidationFailed, "disposition must be withdrawn or lost")
	case errors.Is(err, nodes.ErrAlreadyRetired):
		return problem(abierrors.NodeAlreadyRetired, deploy.TrimSentinel(err))
	case errors.Is(err, nodes.ErrStillReporting):
		return problem(abierrors.NodeStillReporting, deploy.TrimSentinel(err))
	case err != nil:
		return err
	}
	s.log.Info("node retiring", "node_id", n.ID, "disposition", n.Retirement.Disposition)
	s.awaitChange(c, "nodes", n.ID, n.LogOutbox)
	s.cfg.Hinter.Hint("node.retiring")
	wait, count, err := s.views().RetirementWait(ctx, n)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, client.Retirement{NodeID: n.ID, Disposition: n.Retirement.Disposition, State: n.Retirement.State,
		Wait: wait, Slots: count, CreatedAt: n.Retirement.CreatedAt})
}

// rolloutControl serves POST /api/v1/projects/{p}/services/{s}/rollout/{pause,resume,restart}
// (docs/reconciliation.md section 5.2): a change of cause rollout.pause, rollout.resume or
// rollout.restart through the deployer (admitted by the service.apply policies, then one
// compare-and-set on the service, in the change log). The body may state expected_revision.
func (s *Server) rolloutControl(action services.RolloutAction) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req revisionBody
		p, svc, err := s.boundService(c, &req)
		if err != nil {
			return err
		}
		wctx, done := s.changeCtx(c)
		res, err := s.deployer.ControlRollout(wctx, s.change(c, "", p, svc.Name, req.ExpectedRevision), action)
		done()
		s.policyWarnings(c, res.Warnings)
		if err != nil {
			return deployError(err)
		}
		out := res.Service
		if res.Changed() {
			s.awaitChange(c, "services", out.ID, out.LogOutbox)
		}
		return c.JSON(http.StatusOK, client.RolloutControl{Service: toAPIService(out, 0), Changed: res.Changed()})
	}
}

// apiRollout converts a stored rollout block (nil: none) to the API's.
func apiRollout(r *slots.RolloutSpec) *client.RolloutSpec {
	if r == nil {
		return nil
	}
	bound := func(b *slots.Bound) *client.IntOrPercent {
		if b == nil {
			return nil
		}
		return &client.IntOrPercent{Value: b.Value, Percent: b.Percent}
	}
	return &client.RolloutSpec{MaxSurge: bound(r.MaxSurge), MaxUnavailable: bound(r.MaxUnavailable)}
}
