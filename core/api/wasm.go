package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/sdk/client"
)

// RouteStatuser reports the route table in force (the reconciler).
type RouteStatuser interface{ RouteStatus() routes.Status }

// registerWasm adds the WebAssembly endpoints (docs/api.md section 6).
func (s *Server) registerWasm(v1 *echo.Group) {
	v1.GET("/routes", s.getRoutes, s.auth(identity.ScopeServicesRead))
	v1.POST("/modules", s.pushModule, s.auth(identity.ScopeAdmin))
	v1.GET("/modules", s.listModules, s.auth(identity.ScopeAdmin))
	v1.POST("/policy-bindings", s.bindPolicy, s.auth(identity.ScopeAdmin))
	v1.GET("/policy-bindings", s.listBindings, s.auth(identity.ScopeAdmin))
	v1.DELETE("/policy-bindings/:id", s.unbindPolicy, s.auth(identity.ScopeAdmin))
	v1.GET("/policy-decisions", s.listDecisions, s.auth(identity.ScopeAdmin))
	v1.GET("/policy-inputs/:sha256", s.recordedInput, s.auth(identity.ScopeAdmin))
}

// addReasons puts a policy denial's reasons into a problem body.
func addReasons(body map[string]any, err error) {
	var de *policy.DeniedError
	if errors.As(err, &de) {
		body["reasons"] = de.Reasons
	}
}

func (s *Server) getRoutes(c echo.Context) error {
	st := routes.Status{Compiler: "none"}
	if s.cfg.Routes != nil {
		st = s.cfg.Routes.RouteStatus()
	}
	var hosts []string
	for _, r := range st.Table.Routes {
		if r.TLSMode == certs.ModeACME || r.TLSMode == certs.ModeManual {
			hosts = append(hosts, r.Hostname)
		}
	}
	cs, err := s.certificateStatuses(c.Request().Context(), hosts)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, struct {
		routes.Status
		Certificates map[string]client.CertificateStatus `json:"certificates,omitempty"`
	}{st, cs})
}

func (s *Server) policyEngine() (*policy.Engine, error) {
	if s.cfg.Policy == nil {
		return nil, problem(abierrors.Unavailable, "policies are not enabled on this server")
	}
	return s.cfg.Policy, nil
}

func (s *Server) pushModule(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	if ct := c.Request().Header.Get("Content-Type"); ct != "application/wasm" && ct != "application/octet-stream" {
		return problem(abierrors.UnsupportedMedia, "a module is uploaded as application/wasm")
	}
	body := http.MaxBytesReader(c.Response(), c.Request().Body, e.MaxModuleBytes())
	m, err := e.PutModule(c.Request().Context(), body)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, bundles.ErrTooLarge):
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("module is larger than the limit of %d bytes", e.MaxModuleBytes()))
	case errors.Is(err, hostwasm.ErrBadModule), errors.Is(err, hostwasm.ErrTrap), errors.Is(err, hostwasm.ErrDeadline), errors.Is(err, hostwasm.ErrBadOutput):
		return abierrors.Wrap(abierrors.ModuleInvalid, err.Error(), nil)
	case err != nil:
		return err
	}
	s.log.Info("module pushed", "digest", m.Digest, "kind", m.Kind, "name", m.Name, "version", m.Version)
	return c.JSON(http.StatusCreated, m)
}

func (s *Server) listModules(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	ms, err := e.Modules(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ms})
}

// bindingRequest is the body of POST /policy-bindings.
type bindingRequest struct {
	Hook          abiwasm.Hook         `json:"hook"`
	Module        string               `json:"module"`
	Project       string               `json:"project"`
	FailurePolicy policy.FailurePolicy `json:"failure_policy"`
	Config        json.RawMessage      `json:"config"`
}

func (s *Server) bindPolicy(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	var req bindingRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.Project != "" && !services.ValidName(req.Project) {
		return problem(abierrors.InvalidName, fmt.Sprintf("project %q must be a DNS label", req.Project))
	}
	digest, err := resolveModule(c.Request().Context(), e, req.Module)
	if err != nil {
		return err
	}
	b := policy.Binding{Hook: req.Hook, ModuleDigest: digest, Project: req.Project, FailurePolicy: req.FailurePolicy}
	if len(req.Config) > 0 && string(req.Config) != "null" {
		b.Config = string(req.Config)
	}
	probe := b // as recorded: an id, the module's name and a time added
	probe.ID, probe.Module, probe.CreatedAt = strings.Repeat("x", 64), strings.Repeat("x", 256), time.Now().UTC()
	if err := refuseLargeChange(policy.BindingEntityType, probe); err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	out, err := e.Bind(wctx, b)
	done()
	switch {
	case errors.Is(err, policy.ErrModuleNotFound):
		return problem(abierrors.ModuleNotFound, fmt.Sprintf("no module with digest %q; push it with 'berth module push'", digest))
	case errors.Is(err, policy.ErrInvalidBinding):
		return problem(abierrors.ValidationFailed, deploy.TrimSentinel(err))
	case err != nil:
		return err
	}
	s.log.Info("module bound", "binding_id", out.ID, "hook", out.Hook, "module", out.Module, "project", out.Project, "failure_policy", out.FailurePolicy)
	s.awaitChange(c, policy.BindingsCollection, out.ID, out.LogOutbox)
	for _, r := range out.ReplacedLog {
		s.awaitRemoval(c, policy.BindingsCollection, r.ID, r.RemoveOn, r.LogOutbox)
	}
	if out.Hook == abiwasm.HookRoutesCompile {
		s.cfg.Hinter.Hint("routes.compile.bound")
	}
	return c.JSON(http.StatusCreated, out)
}

// minDigestPrefix is the fewest hex digits a digest prefix in a binding request may have.
const minDigestPrefix = 12

// resolveModule turns the module of a binding request into a full digest (docs/wasm-abi.md
// section 5.4): a full "sha256:<64 hex>" is kept as is (Bind checks it exists); a prefix of at
// least 12 hex digits, with or without "sha256:", or a module's name must match exactly one
// pushed module. No match is module_not_found naming what was searched, several are
// module_ambiguous listing them, and a shorter prefix is validation_failed. It reads every
// module, a small collection.
func resolveModule(ctx context.Context, e *policy.Engine, ref string) (string, error) {
	hex := strings.TrimPrefix(ref, "sha256:")
	isHex := hex != "" && strings.Trim(hex, "0123456789abcdef") == ""
	if isHex && len(hex) == 64 {
		return "sha256:" + hex, nil
	}
	if strings.HasPrefix(ref, "sha256:") && (!isHex || len(hex) < minDigestPrefix) {
		return "", problem(abierrors.ValidationFailed, fmt.Sprintf("module %q: a digest prefix needs at least %d lower-case hex digits after \"sha256:\"", ref, minDigestPrefix))
	}
	ms, err := e.Modules(ctx)
	if err != nil {
		return "", err
	}
	var byDigest, byName []policy.Module
	for _, m := range ms {
		if isHex && len(hex) >= minDigestPrefix && strings.HasPrefix(m.Digest, "sha256:"+hex) {
			byDigest = append(byDigest, m)
		}
		if m.Name == ref {
			byName = append(byName, m)
		}
	}
	found, what := byDigest, fmt.Sprintf("digest prefix %q", "sha256:"+hex)
	if len(found) == 0 {
		found, what = byName, fmt.Sprintf("name %q", ref)
	}
	switch {
	case len(found) == 1:
		return found[0].Digest, nil
	case len(found) > 1:
		var cands []string
		for _, m := range found {
			cands = append(cands, fmt.Sprintf("%s (%s %s)", m.Digest, m.Name, m.Version))
		}
		return "", problem(abierrors.ModuleAmbiguous, fmt.Sprintf("module %s matches %d pushed modules: %s; name one by its full digest", what, len(found), strings.Join(cands, ", ")))
	}
	searched := fmt.Sprintf("name %q", ref)
	if isHex && len(hex) >= minDigestPrefix {
		searched = fmt.Sprintf("digest prefix %q or name %q", "sha256:"+hex, ref)
	}
	return "", problem(abierrors.ModuleNotFound, fmt.Sprintf("no pushed module has the %s (searched %d modules; 'berth module list --no-trunc' shows their digests); push it with 'berth module push'", searched, len(ms)))
}

func (s *Server) listBindings(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	bs, err := e.Bindings(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": bs})
}

func (s *Server) unbindPolicy(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	gone, err := e.Unbind(wctx, c.Param("id"))
	done()
	if errors.Is(err, policy.ErrBindingNotFound) {
		return problem(abierrors.BindingNotFound, fmt.Sprintf("no binding %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	s.log.Info("module unbound", "binding_id", gone.ID, "hook", gone.Hook, "module", gone.Module)
	s.awaitRemoval(c, policy.BindingsCollection, gone.ID, gone.RemoveOn, gone.LogOutbox)
	if gone.Hook == abiwasm.HookRoutesCompile {
		s.cfg.Hinter.Hint("routes.compile.unbound")
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) listDecisions(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	limit := int64(50)
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > 1000 {
			return problem(abierrors.BadRequest, "limit must be between 1 and 1000")
		}
		limit = n
	}
	ds, err := e.Decisions(c.Request().Context(), limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ds})
}

// recordedInput answers GET /policy-inputs/{sha256}: the exact input of a
// recent decision on this berthd (docs/wasm-abi.md section 8), or 404
// input_not_recorded.
func (s *Server) recordedInput(c echo.Context) error {
	e, err := s.policyEngine()
	if err != nil {
		return err
	}
	sum := c.Param("sha256")
	if len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
		return problem(abierrors.BadRequest, "the digest is 64 lower-case hex digits (a decision's input_sha256)")
	}
	raw, err := e.RecordedInput(sum)
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, raw)
}

// admit runs the bindings of hook for project and turns a denial into
// policy_denied with the reasons. Warnings go to the Berth-Policy-Warning
// header. Without an engine everything is allowed.
func (s *Server) admit(c echo.Context, project string, in abiwasm.PolicyInput) error {
	if s.cfg.Policy == nil {
		return nil
	}
	if p := principal(c); p != nil && in.Actor.Kind == "" {
		in.Actor = abiwasm.Actor{Kind: "token", ID: p.ID}
		if p.Kind == identity.KindNode {
			in.Actor.Kind = "node"
		}
	}
	v, err := s.cfg.Policy.Admit(c.Request().Context(), project, in)
	if err != nil {
		return err
	}
	for _, w := range v.Warnings {
		c.Response().Header().Add("Berth-Policy-Warning", w)
	}
	if v.Allowed {
		return nil
	}
	reasons := v.UniqueReasons()
	de := &policy.DeniedError{Hook: in.Hook, Reasons: reasons}
	return &abierrors.Error{Code: abierrors.PolicyDenied, Message: de.Error(), Err: de}
}

// admitDelete runs service.delete for the stored service name of project p;
// a missing service is left for the delete to report.
func (s *Server) admitDelete(c echo.Context, p *services.Project, name string) error {
	if s.cfg.Policy == nil {
		return nil
	}
	svc, err := s.cfg.Catalog.GetService(c.Request().Context(), p, name)
	if errors.Is(err, services.ErrServiceNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	return s.admit(c, p.Name, abiwasm.PolicyInput{
		Hook: abiwasm.HookServiceDelete, Project: &abiwasm.Project{Name: p.Name},
		Object: policy.Raw(nil), OldObject: policy.Raw(policy.ServiceObject(svc)),
	})
}

// enrollAdmitter returns nodes.EnrollRequest.Admit: first (the relay check), then the node.enroll
// policy hook when policies are configured.
func (s *Server) enrollAdmitter(c echo.Context, first func(ctx context.Context, n *nodes.Node) error) func(ctx context.Context, n *nodes.Node) error {
	return func(ctx context.Context, n *nodes.Node) error {
		if err := first(ctx, n); err != nil {
			return err
		}
		if s.cfg.Policy == nil {
			return nil
		}
		return s.admit(c, "", abiwasm.PolicyInput{
			Hook: abiwasm.HookNodeEnroll, Actor: abiwasm.Actor{Kind: "join_token"},
			Object: policy.Raw(policy.NodeObject(n)), OldObject: policy.Raw(nil),
		})
	}
}
