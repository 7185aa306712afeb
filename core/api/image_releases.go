package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
)

// registerReleases adds the image release routes (docs/registry.md section
// 7) when the server has a registry.
func (s *Server) registerReleases(v1 *echo.Group) {
	if s.cfg.ImageReleases == nil {
		return
	}
	v1.POST("/projects/:project/services/:name/releases", s.reserveRelease, s.auth(identity.ScopeServiceDeploy))
	v1.GET("/projects/:project/services/:name/releases", s.listImageReleases, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/services/:name/releases/:tag/promote", s.promoteRelease, s.auth(identity.ScopeServiceDeploy))
}

// registryHost is the host part of the image references a promotion writes: Config.RegistryHost,
// else the host of PublicURL.
func (s *Server) registryHost() string {
	if s.cfg.RegistryHost != "" {
		return s.cfg.RegistryHost
	}
	if u, err := url.Parse(s.cfg.PublicURL); err == nil {
		return u.Host
	}
	return ""
}

// ManifestChecker reports whether the registry still holds a manifest; [registry.Registry]
// implements it ([registry.Registry.ManifestExists]).
type ManifestChecker = deploy.ManifestChecker

// promoteRelease serves POST .../services/{s}/releases/{tag}/promote (docs/registry.md section
// 8): the service's image becomes "<host>/<project>/<service>@<digest the tag names>", one
// compare-and-set at the revision read (or the body's expected_revision), and the ordinary
// rollout takes it from there. 200 with the service (changed false when it already ran that
// digest); 404 image_release_not_found (also for a release whose manifest retention removed);
// 409 release_not_pushed, service_not_container, revision_conflict.
func (s *Server) promoteRelease(c echo.Context) error {
	var req revisionBody
	p, svc, err := s.boundService(c, &req)
	if err != nil {
		return err
	}
	repo, tag := p.Name+"/"+svc.Name, c.Param("tag")
	image, err := s.deployer.ReleaseImage(c.Request().Context(), repo, tag)
	if err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	res, err := s.deployer.Promote(wctx, s.change(c, deploy.CauseReleasePromote, p, svc.Name, req.ExpectedRevision), image)
	done()
	s.policyWarnings(c, res.Warnings)
	switch {
	case errors.Is(err, services.ErrNotContainer):
		return problem(abierrors.ServiceNotContainer, fmt.Sprintf("service %s/%s does not run on containerd; only container services run images", p.Name, svc.Name))
	case err != nil:
		return deployError(err)
	case !res.Changed():
		return c.JSON(http.StatusOK, appliedService(res.Service, false))
	}
	out := res.Service
	s.log.Info("release promoted", "project", p.Name, "service", svc.Name, "tag", tag, "image", image, "revision", out.Revision)
	s.awaitChange(c, "services", out.ID, out.LogOutbox)
	return c.JSON(http.StatusOK, appliedService(out, true))
}

// releaseRequest is the body of POST .../releases.
type releaseRequest struct {
	Tag string `json:"tag"`
}

// reserveRelease reserves a tag of <project>/<service> for the caller.
// 201 with the release; 409 release_tag_reserved; 422 release_tag_invalid.
func (s *Server) reserveRelease(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	var req releaseRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	ctx, done := s.changeCtx(c)
	defer done()
	who := principal(c)
	a, _ := changelog.ActorFrom(ctx)
	rel, err := s.cfg.ImageReleases.Reserve(ctx, p.Name+"/"+c.Param("name"), req.Tag, who.ID, a.Type)
	switch {
	case errors.Is(err, registry.ErrTagReserved):
		return problem(abierrors.ReleaseTagReserved, "tag "+req.Tag+" is already reserved or pushed")
	case errors.Is(err, registry.ErrTagInvalid):
		return problem(abierrors.ReleaseTagInvalid, "a release tag is an OCI tag other than latest")
	case err != nil:
		return err
	}
	return c.JSON(http.StatusCreated, rel)
}

// listImageReleases lists the releases of <project>/<service>.
func (s *Server) listImageReleases(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	rels, err := s.cfg.ImageReleases.List(c.Request().Context(), p.Name+"/"+c.Param("name"))
	if err != nil {
		return err
	}
	if rels == nil {
		rels = []registry.Release{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": rels})
}
