package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
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

// resolveFollowedTag resolves the image of a deploy_on_push service ("[host/]<project>/<repo>:<tag>",
// validated by splitTagRef) to the image reference it runs ("<host>/<project>/<repo>@<digest>")
// and the "<project>/<repo>:<tag>" it follows. Errors: 422 validation_failed for a repository of
// another project or another registry, 404 image_release_not_found, 409 release_not_pushed.
func (s *Server) resolveFollowedTag(ctx context.Context, p *services.Project, ref string) (image, repoTag string, err error) {
	name, tag, _ := splitTagRef(ref)
	repo := strings.TrimPrefix(name, s.registryHost()+"/")
	if !strings.HasPrefix(repo, p.Name+"/") {
		return "", "", problem(abierrors.ValidationFailed, fmt.Sprintf("deploy_on_push follows a repository of project %s in Berth's registry (%s/%s/...), not %s", p.Name, s.registryHost(), p.Name, name))
	}
	digest, err := s.pushedDigest(ctx, repo, tag)
	if err != nil {
		return "", "", err
	}
	return s.registryHost() + "/" + repo + "@" + digest, repo + ":" + tag, nil
}

// ManifestChecker reports whether the registry still holds a manifest; [registry.Registry]
// implements it ([registry.Registry.ManifestExists]).
type ManifestChecker interface {
	ManifestExists(ctx context.Context, repo, digest string) (bool, error)
}

// pushedDigest returns the digest repo:tag names, once the registry (Config.Manifests) confirms
// it still holds that manifest. Errors: 404 image_release_not_found for a tag never pushed and for
// a release whose manifest registry retention removed (docs/registry.md section 10); 409
// release_not_pushed; a storage failure.
func (s *Server) pushedDigest(ctx context.Context, repo, tag string) (string, error) {
	rel, err := s.cfg.ImageReleases.Get(ctx, repo, tag)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", problem(abierrors.ImageReleaseNotFound, fmt.Sprintf("repository %s has no tag %q", repo, tag))
	case err != nil:
		return "", err
	case rel.Digest == "":
		return "", problem(abierrors.ReleaseNotPushed, fmt.Sprintf("tag %q of %s is reserved but nothing was pushed to it yet", tag, repo))
	}
	if s.cfg.Manifests != nil {
		ok, err := s.cfg.Manifests.ManifestExists(ctx, repo, rel.Digest)
		if err != nil {
			return "", fmt.Errorf("check release %s:%s: %w", repo, tag, err)
		}
		if !ok {
			return "", problem(abierrors.ImageReleaseNotFound, fmt.Sprintf("release %q of %s names %s, which registry retention removed; push that image to the tag again to promote it", tag, repo, rel.Digest))
		}
	}
	return rel.Digest, nil
}

// promoteRelease serves POST .../services/{s}/releases/{tag}/promote (docs/registry.md section
// 8): the service's image becomes "<host>/<project>/<service>@<digest the tag names>", one
// compare-and-set at the revision read (or the body's expected_revision), and the ordinary
// rollout takes it from there. 200 with the service (changed false when it already ran that
// digest); 404 image_release_not_found (also for a release whose manifest retention removed);
// 409 release_not_pushed, service_not_container, revision_conflict.
func (s *Server) promoteRelease(c echo.Context) error {
	var req struct {
		ExpectedRevision *int64 `json:"expected_revision"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	p, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	repo, tag := p.Name+"/"+svc.Name, c.Param("tag")
	digest, err := s.pushedDigest(ctx, repo, tag)
	if err != nil {
		return err
	}
	image := s.registryHost() + "/" + repo + "@" + digest
	next := *svc
	next.Image = image
	if err := s.admitService(c, p, &next); err != nil {
		return err
	}
	expected := req.ExpectedRevision
	if expected == nil {
		expected = &svc.Revision // the admission above judged the revision read
	}
	wctx, done := s.changeCtx(c)
	out, outcome, err := s.cfg.Catalog.SetImage(wctx, p, svc.Name, image, expected)
	done()
	switch {
	case errors.Is(err, services.ErrNotContainer):
		return problem(abierrors.ServiceNotContainer, fmt.Sprintf("service %s/%s does not run on containerd; only container services run images", p.Name, svc.Name))
	case err != nil:
		return serviceError(err)
	case outcome == services.PutUnchanged:
		return c.JSON(http.StatusOK, appliedService(out, false))
	}
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
