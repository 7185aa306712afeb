package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
)

// registerReleases adds the image release routes (docs/registry.md section
// 7) when the server has a registry.
func (s *Server) registerReleases(v1 *echo.Group) {
	if s.cfg.ImageReleases == nil {
		return
	}
	v1.POST("/projects/:project/services/:name/releases", s.reserveRelease, s.auth(identity.ScopeServiceDeploy))
	v1.GET("/projects/:project/services/:name/releases", s.listImageReleases, s.auth(identity.ScopeServicesRead))
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
