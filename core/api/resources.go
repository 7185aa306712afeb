package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/resources"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	client "github.com/berthhq/berth/sdk/client"
)

// ResourcesConfig serves declared resources (resources.go, docs/resources.md section 5).
type ResourcesConfig struct {
	Manager *resources.Manager
	// Types lists the declared resource types of berthd's provider plugins.
	Types func() []plugin.TypeEntry
}

// registerResources adds the resource routes; without resources configured they are absent.
func (s *Server) registerResources(v1 *echo.Group) {
	if s.cfg.Resources == nil {
		return
	}
	v1.GET("/resource-types", s.listResourceTypes, s.auth(identity.ScopeResourceRead))
	v1.GET("/projects/:project/resources", s.listResources, s.auth(identity.ScopeResourceRead))
	v1.GET("/projects/:project/resources/:type/:name", s.getResource, s.auth(identity.ScopeResourceRead))
	v1.PUT("/projects/:project/resources/:type/:name", s.applyResource, s.auth(identity.ScopeResourceWrite))
	v1.POST("/projects/:project/resources/:type/:name/plan", s.planResource, s.auth(identity.ScopeResourceRead))
	v1.DELETE("/projects/:project/resources/:type/:name", s.deleteResource, s.auth(identity.ScopeResourceWrite))
}

func toAPIResource(r *resources.Resource) client.Resource {
	var outs map[string]client.ResourceOutput
	for k, ref := range r.Outputs {
		if outs == nil {
			outs = map[string]client.ResourceOutput{}
		}
		outs[k] = client.ResourceOutput{Secret: ref.Secret, Version: ref.Version}
	}
	return client.Resource{Outputs: outs, Type: r.Type, Name: r.Name, Project: r.Project, Spec: r.SpecJSON(), OnDrift: r.OnDrift,
		Generation: r.Generation, AppliedGeneration: r.AppliedGeneration, Applied: r.AppliedJSON(), Status: string(r.Status),
		Reason: r.Reason, Message: r.Message, OperationID: r.OperationID, Drifts: r.Drifts, ObservedAt: r.ObservedAt, UpdatedAt: r.UpdatedAt}
}

// listResourceTypes answers GET /resource-types.
func (s *Server) listResourceTypes(c echo.Context) error {
	out := client.List[client.ResourceType]{Items: []client.ResourceType{}}
	for _, e := range s.cfg.Resources.Types() {
		out.Items = append(out.Items, client.ResourceType{Name: e.Type.Name, Plugin: e.Plugin, Role: e.Role, Schema: e.Type.Schema,
			DriftIntervalSeconds: int(e.Type.DriftInterval.Seconds())})
	}
	return c.JSON(http.StatusOK, out)
}

// listResources answers GET /projects/{p}/resources.
func (s *Server) listResources(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	all, err := s.cfg.Resources.Manager.List(c.Request().Context(), p.ID)
	if err != nil {
		return err
	}
	out := client.List[client.Resource]{Items: []client.Resource{}}
	for i := range all {
		out.Items = append(out.Items, toAPIResource(&all[i]))
	}
	return c.JSON(http.StatusOK, out)
}

// resourceNotFound maps a missing resource to 404.
func resourceNotFound(c echo.Context, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return problem(abierrors.NotFound, fmt.Sprintf("no resource %s/%s in project %s", c.Param("type"), c.Param("name"), c.Param("project")))
	}
	return err
}

// getResource answers GET /projects/{p}/resources/{type}/{name}.
func (s *Server) getResource(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	r, err := s.cfg.Resources.Manager.GetInProject(c.Request().Context(), p.ID, c.Param("type"), c.Param("name"))
	if err != nil {
		return resourceNotFound(c, err)
	}
	return c.JSON(http.StatusOK, toAPIResource(r))
}

// declaration decodes the body of an apply or a plan.
func (s *Server) declaration(c echo.Context) (resources.Declaration, error) {
	var body client.ResourceApply
	if err := s.bind(c, &body); err != nil {
		return resources.Declaration{}, err
	}
	return resources.Declaration{Type: c.Param("type"), Name: c.Param("name"), Project: c.Param("project"), Spec: body.Spec, OnDrift: body.OnDrift}, nil
}

// applyResource answers PUT /projects/{p}/resources/{type}/{name}: 202 with the stored resource;
// 422 naming the field when the spec does not fit the type's schema (nothing stored).
func (s *Server) applyResource(c echo.Context) error {
	d, err := s.declaration(c)
	if err != nil {
		return err
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	r, err := s.cfg.Resources.Manager.Apply(c.Request().Context(), p.ID, p.Name, d)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, toAPIResource(r))
}

// planResource answers POST /projects/{p}/resources/{type}/{name}/plan: the provider's plan
// as a difference; it changes nothing.
func (s *Server) planResource(c echo.Context) error {
	d, err := s.declaration(c)
	if err != nil {
		return err
	}
	// A project that does not exist yet holds no resource: the plan is of a new one (the apply
	// creates the project, as it does for services).
	projectID, projectName := "", c.Param("project")
	p, err := s.project(c, false)
	switch {
	case err == nil:
		projectID, projectName = p.ID, p.Name
	case abierrors.CodeOf(err) != abierrors.ProjectNotFound:
		return err
	}
	pl, err := s.cfg.Resources.Manager.Plan(c.Request().Context(), projectID, projectName, d)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, client.ResourcePlan{Type: pl.Type, Name: pl.Name, Current: pl.Current, Planned: pl.Planned,
		Changes: pl.Changes, Diff: pl.Diff, Generation: pl.Generation})
}

// deleteResource answers DELETE /projects/{p}/resources/{type}/{name}[?purge=true]: 202.
func (s *Server) deleteResource(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	r, err := s.cfg.Resources.Manager.Delete(c.Request().Context(), p.ID, c.Param("type"), c.Param("name"), c.QueryParam("purge") == "true")
	if err != nil {
		return resourceNotFound(c, err)
	}
	return c.JSON(http.StatusAccepted, toAPIResource(r))
}
