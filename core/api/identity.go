package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// scopeAuthenticated is an internal route scope: any authenticated user or machine token (not
// a node) may call the route, and its handler decides what the caller may do.
const scopeAuthenticated identity.Scope = "berth.internal:authenticated"

// registerIdentity adds login, logout, users and machine tokens (docs/api.md section "Identity").
func (s *Server) registerIdentity(v1 *echo.Group) {
	v1.POST("/login", s.login) // the password is the proof
	v1.POST("/logout", s.logout, s.auth(scopeAuthenticated))
	v1.GET("/whoami", s.whoami, s.auth(scopeAuthenticated))
	v1.GET("/users", s.listUsers, s.auth(identity.ScopeAdmin))
	v1.POST("/users", s.createUser, s.auth(identity.ScopeAdmin, reauth))
	v1.GET("/users/:user", s.getUser, s.auth(scopeAuthenticated))
	v1.POST("/users/:user/credential", s.changeCredential, s.auth(scopeAuthenticated, reauth))
	v1.PUT("/users/:user/roles", s.setRoles, s.auth(identity.ScopeAdmin, reauth))
	v1.GET("/tokens", s.listTokens, s.auth(identity.ScopeTokensWrite))
	v1.POST("/tokens", s.createToken, s.auth(identity.ScopeTokensWrite))
	v1.DELETE("/tokens/:token", s.revokeToken, s.auth(identity.ScopeTokensWrite))
	v1.POST("/tokens/:token/rotate", s.rotateToken, s.auth(identity.ScopeTokensWrite))
}

// identityError maps identity errors to problem codes; every credential failure is one generic 401.
func identityError(err error, notFound abierrors.Code) error {
	switch {
	case errors.Is(err, identity.ErrUnauthenticated):
		return problem(abierrors.Unauthenticated, "authentication failed")
	case errors.Is(err, identity.ErrHumanOnlyScope):
		return problem(abierrors.ScopeHumanOnly, "a machine token cannot hold node:enroll, node:remove or node:fence_ack")
	case errors.Is(err, identity.ErrPasswordPolicy):
		return problem(abierrors.PasswordPolicy, "a password must be 20 characters to 1024 bytes of UTF-8")
	case errors.Is(err, identity.ErrInvalid):
		msg, _ := strings.CutPrefix(err.Error(), "identity: ")
		msg, _ = strings.CutSuffix(msg, ": "+identity.ErrInvalid.Error())
		return problem(abierrors.ValidationFailed, msg)
	case errors.Is(err, identity.ErrExists):
		return problem(abierrors.AlreadyExists, "that name is taken")
	case errors.Is(err, store.ErrNotFound):
		return problem(notFound, "no such "+strings.TrimSuffix(strings.TrimSuffix(string(notFound), "_not_found"), "_"))
	case errors.Is(err, store.ErrConflict):
		return problem(abierrors.RevisionConflict, "the credential changed meanwhile; read it again")
	}
	return err
}

// owner is the user a caller acts as: a session's user, or the owner of a token.
func owner(p *identity.Principal) string {
	if p.Owner != "" {
		return p.Owner
	}
	return p.Name
}

func (s *Server) login(c echo.Context) error {
	var req struct {
		Name       string `json:"name"`
		Password   string `json:"password"`
		TTLSeconds int64  `json:"ttl_seconds"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int64(identity.MaxSessionTTL/time.Second) {
		return problem(abierrors.ValidationFailed, "ttl_seconds must be between 60 and 604800 (7 days)")
	}
	if wait := s.logins.allow(loginSource(c.Request())); wait > 0 {
		return throttled(c, abierrors.LoginRateLimited, "too many login attempts from this address; retry after Retry-After", wait)
	}
	sess, err := s.cfg.Tokens.Login(c.Request().Context(), req.Name, req.Password, time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		if t := loginThrottled(c, err); t != nil {
			return t
		}
		return identityError(err, abierrors.UserNotFound)
	}
	s.log.Info("login", "user", sess.User, "generation", sess.Generation)
	return c.JSON(http.StatusOK, sess)
}

func (s *Server) logout(c echo.Context) error {
	if err := s.cfg.Tokens.Logout(c.Request().Context(), bearer(c)); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) whoami(c echo.Context) error {
	p := principal(c)
	return c.JSON(http.StatusOK, map[string]any{"kind": p.Kind, "id": p.ID, "name": p.Name, "owner": p.Owner,
		"scopes": p.Scopes, "project": p.Project, "service": p.Service, "auth_at": p.AuthAt})
}

func (s *Server) listUsers(c echo.Context) error {
	users, err := s.cfg.Tokens.ListUsers(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"users": users})
}

func (s *Server) createUser(c echo.Context) error {
	var req struct {
		Name     string           `json:"name"`
		Kind     identity.Kind    `json:"kind"`
		Roles    []identity.Role  `json:"roles"`
		Grants   []identity.Grant `json:"grants"`
		Password string           `json:"password"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.Kind == "" {
		req.Kind = identity.KindHuman
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	u, err := s.cfg.Tokens.CreateUser(ctx, identity.NewUserRequest{
		Name: req.Name, Kind: req.Kind, Roles: req.Roles, Grants: req.Grants, Password: req.Password})
	if err != nil {
		return identityError(err, abierrors.UserNotFound)
	}
	s.awaitIdentity(c, u.Change)
	return c.JSON(http.StatusCreated, u)
}

func (s *Server) getUser(c echo.Context) error {
	p := principal(c)
	name := c.Param("user")
	if !p.Has(identity.ScopeAdmin) && owner(p) != name {
		return problem(abierrors.Forbidden, "reading another user needs scope admin")
	}
	u, err := s.cfg.Tokens.GetUser(c.Request().Context(), name)
	if err != nil {
		return identityError(err, abierrors.UserNotFound)
	}
	return c.JSON(http.StatusOK, u)
}

// changeCredential serves POST /users/{user}/credential: {"op": "rotate_password" |
// "revoke_password" | "revoke_sessions", "expected_generation": N, "password": "..."}. A human
// changes their own credential, an admin anyone's; both within 5 minutes of a login.
func (s *Server) changeCredential(c echo.Context) error {
	p := principal(c)
	name := c.Param("user")
	if !p.Has(identity.ScopeAdmin) && !(p.Kind == identity.KindHuman && owner(p) == name) {
		return problem(abierrors.Forbidden, "changing a credential needs scope admin, or a session of that user")
	}
	var req struct {
		Op                 identity.CredentialOp `json:"op"`
		ExpectedGeneration int64                 `json:"expected_generation"`
		Password           string                `json:"password"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	u, err := s.cfg.Tokens.ChangeCredential(ctx, name, req.ExpectedGeneration, req.Op, req.Password)
	if err != nil {
		return identityError(err, abierrors.UserNotFound)
	}
	s.awaitIdentity(c, u.Change)
	return c.JSON(http.StatusOK, u)
}

// setRoles serves PUT /users/{user}/roles: {"roles": [...], "grants": [{"project", "role"}]}
// replaces the user's roles and grants; they hold from the user's next request.
func (s *Server) setRoles(c echo.Context) error {
	var req struct {
		Roles  []identity.Role  `json:"roles"`
		Grants []identity.Grant `json:"grants"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	for _, g := range req.Grants {
		if err := checkName("project", g.Project); err != nil {
			return err
		}
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	u, err := s.cfg.Tokens.SetRoles(ctx, c.Param("user"), req.Roles, req.Grants)
	if err != nil {
		return identityError(err, abierrors.UserNotFound)
	}
	s.awaitIdentity(c, u.Change)
	return c.JSON(http.StatusOK, u)
}

func (s *Server) listTokens(c echo.Context) error {
	p := principal(c)
	who := ""
	if !p.Has(identity.ScopeAdmin) {
		who = owner(p)
	}
	toks, err := s.cfg.Tokens.ListMachineTokens(c.Request().Context(), who)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": toks})
}

// createToken serves POST /tokens: {"name", "scopes", "project", "service", "expires_in_seconds",
// "owner"}. The caller must hold every scope it hands out within the same bounds; a token for
// another owner needs admin and a recent login.
func (s *Server) createToken(c echo.Context) error {
	p := principal(c)
	var req struct {
		Name             string           `json:"name"`
		Scopes           []identity.Scope `json:"scopes"`
		Project          string           `json:"project"`
		Service          string           `json:"service"`
		ExpiresInSeconds int64            `json:"expires_in_seconds"`
		Owner            string           `json:"owner"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.ExpiresInSeconds < 0 || req.ExpiresInSeconds > int64(identity.MaxMachineTokenTTL/time.Second) {
		return problem(abierrors.ValidationFailed, "expires_in_seconds must be between 1 and 31536000 (one year)")
	}
	if req.Project != "" {
		if err := checkName("project", req.Project); err != nil {
			return err
		}
	}
	if req.Service != "" {
		if err := checkName("service", req.Service); err != nil {
			return err
		}
	}
	for _, sc := range req.Scopes {
		if identity.HumanOnly(sc) {
			return problem(abierrors.ScopeHumanOnly, fmt.Sprintf("a machine token cannot hold %s", sc))
		}
	}
	if req.Owner == "" {
		req.Owner = owner(p)
	}
	if req.Owner != owner(p) {
		if !p.Has(identity.ScopeAdmin) {
			return problem(abierrors.Forbidden, "a token for another owner needs scope admin")
		}
		if !s.cfg.Tokens.Fresh(p) {
			return problem(abierrors.ReauthenticationRequired, "log in again: this needs a login within the last 5 minutes")
		}
		if _, err := s.cfg.Tokens.GetUser(c.Request().Context(), req.Owner); err != nil {
			return identityError(err, abierrors.UserNotFound)
		}
	}
	for _, sc := range req.Scopes {
		if identity.Known(sc) && !p.Covers(sc, req.Project, req.Service) {
			return problem(abierrors.Forbidden, fmt.Sprintf("granting scope %s needs the caller to hold it within the same project and service bounds", sc))
		}
	}
	// A machine token hands out nothing that outlives it.
	if p.Kind == identity.KindMachine && p.ExpiresAt != nil {
		ttl := time.Duration(req.ExpiresInSeconds) * time.Second
		if ttl == 0 {
			ttl = identity.DefaultMachineTokenTTL
		}
		if s.cfg.Tokens.Now().Add(ttl).After(*p.ExpiresAt) {
			return problem(abierrors.ValidationFailed, "a token cannot outlive the machine token that creates it")
		}
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	tok, info, err := s.cfg.Tokens.CreateMachine(ctx, identity.MachineTokenRequest{
		Name: req.Name, Owner: req.Owner, Scopes: req.Scopes, Project: req.Project, Service: req.Service,
		TTL: time.Duration(req.ExpiresInSeconds) * time.Second})
	if err != nil {
		return identityError(err, abierrors.TokenNotFound)
	}
	s.awaitIdentity(c, info.Change)
	return c.JSON(http.StatusCreated, map[string]any{"token": tok, "info": info})
}

// tokenAllowed loads the named token and checks the caller may rotate it (rotate) or revoke
// it, with every right creating that token would take (docs/api.md section 9.3): the caller
// is an admin or the token's owner; another owner's token takes a login within 5 minutes; the
// caller holds every scope of the token within its project and service bounds (so a machine
// token never manages one holding human-only scopes); and a machine token rotates nothing that
// outlives it.
func (s *Server) tokenAllowed(c echo.Context, rotate bool) (identity.MachineToken, error) {
	p := principal(c)
	info, err := s.cfg.Tokens.MachineTokenInfo(c.Request().Context(), c.Param("token"))
	if err != nil {
		return info, identityError(err, abierrors.TokenNotFound)
	}
	if !p.Has(identity.ScopeAdmin) && (info.Owner == "" || info.Owner != owner(p)) {
		// The same answer as an unknown name: no hint which tokens exist.
		return info, problem(abierrors.TokenNotFound, "no such token")
	}
	if info.Owner != owner(p) && !s.cfg.Tokens.Fresh(p) {
		return info, problem(abierrors.ReauthenticationRequired, "log in again: this needs a login within the last 5 minutes")
	}
	verb := "revoking"
	if rotate {
		verb = "rotating"
	}
	if sc, ok := p.CoversToken(info); !ok {
		return info, problem(abierrors.Forbidden, fmt.Sprintf("%s token %s needs the caller to hold scope %s within the token's project and service bounds", verb, info.Name, sc))
	}
	if rotate && p.Kind == identity.KindMachine && p.ExpiresAt != nil && (info.ExpiresAt == nil || info.ExpiresAt.After(*p.ExpiresAt)) {
		return info, problem(abierrors.ValidationFailed, "a machine token cannot rotate a token that outlives it")
	}
	return info, nil
}

func (s *Server) revokeToken(c echo.Context) error {
	info, err := s.tokenAllowed(c, false)
	if err != nil {
		return err
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	ch, err := s.cfg.Tokens.RevokeMachine(ctx, info.Name)
	// A revoke that cut the token off but failed to free its name still recorded its change.
	s.awaitIdentity(c, ch)
	if err != nil {
		return identityError(err, abierrors.TokenNotFound)
	}
	return c.NoContent(http.StatusNoContent)
}

// rotateToken serves POST /tokens/{name}/rotate. The new secret is answered once; for the
// bootstrap token it is also written to this berthd's DATA/admin-token, whose path the answer
// names as admin_token_file (absent when the file was not rewritten).
func (s *Server) rotateToken(c echo.Context) error {
	info, err := s.tokenAllowed(c, true)
	if err != nil {
		return err
	}
	ctx, cancel := s.changeCtx(c)
	defer cancel()
	tok, next, err := s.cfg.Tokens.RotateMachine(ctx, info.Name)
	if err != nil {
		return identityError(err, abierrors.TokenNotFound)
	}
	s.awaitIdentity(c, next.Change)
	out := map[string]any{"token": tok, "info": next}
	if info.Name == identity.BootstrapTokenName {
		// The rotation is done and its secret is answered whatever happens to the file: failing
		// here would leave nobody holding the new admin secret.
		path, err := s.cfg.Tokens.RewriteAdminFile(context.WithoutCancel(ctx), tok)
		if err != nil {
			s.log.Error("bootstrap token rotated, but its file was not rewritten; only the answer holds the new secret", "err", err)
		}
		if path != "" {
			out["admin_token_file"] = path
		}
	}
	return c.JSON(http.StatusOK, out)
}

// credentialQueryKeys are query parameters that would carry a credential in a URL.
var credentialQueryKeys = []string{"token", "access_token", "bearer", "password", "api_key", "apikey", "auth"}

// refuseCredentialsInURL refuses, before routing to any handler, a request whose URL query
// carries a bearer (by parameter name or by a Berth bearer prefix in any value) or a password:
// URLs end up in logs and histories.
func refuseCredentialsInURL(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if strings.HasPrefix(c.Request().URL.Path, "/api/runner/") {
			return next(c) // the runner transport answers its own way (docs/runner-protocol.md)
		}
		for k, vs := range c.Request().URL.Query() {
			if slices.Contains(credentialQueryKeys, strings.ToLower(k)) {
				return problem(abierrors.CredentialInURL, "credentials go in the Authorization header, never in the URL")
			}
			for _, v := range vs {
				for _, pre := range []string{identity.PrefixToken, identity.PrefixSession, identity.PrefixNode, identity.PrefixJoin, identity.PrefixRunner} {
					if strings.Contains(v, pre) {
						return problem(abierrors.CredentialInURL, "credentials go in the Authorization header, never in the URL")
					}
				}
			}
		}
		return next(c)
	}
}

// actorOf names who made a change, for the change log: "user:<name>" for a human session,
// "token:<name>" for a machine or admin token, the node id for a node.
func actorOf(p *identity.Principal) (actorType, actorID string) {
	switch {
	case p == nil:
		return "system", "berthd"
	case p.Kind == identity.KindNode:
		return string(p.Kind), p.ID
	case p.Kind == identity.KindHuman && p.Owner != "":
		return string(p.Kind), "user:" + p.Owner
	case p.Name != "":
		return string(p.Kind), "token:" + p.Name
	}
	return string(p.Kind), p.ID
}

// awaitIdentity hands the change an identity write left in the outbox of
// the document it wrote (users, machine tokens or their names) to the change
// log, as [Server.awaitChange] does; a zero ch (no actor) hands over nothing.
func (s *Server) awaitIdentity(c echo.Context, ch identity.Change) {
	s.awaitChange(c, ch.Collection, ch.ID, ch.Outbox)
}

// streamRecheck is how often a long-lived answer (a followed log) checks its bearer again.
const streamRecheck = time.Second

// bearerStillValid reports whether the request's bearer still holds what its route needs, for
// answers that outlive one check: a token revoked or rotated, a session whose generation moved,
// or a bearer whose scopes (its owner's roles included) no longer cover the route ends the
// stream at the next recheck. A store failure keeps the stream (it is no proof of revocation).
func (s *Server) bearerStillValid(c echo.Context) bool {
	tok := bearer(c)
	if strings.HasPrefix(tok, identity.PrefixNode) {
		return true
	}
	need, _ := c.Get(authNeedKey).(authNeed)
	_, err := s.authorize(c, tok, need)
	return err == nil || abierrors.CodeOf(err) == abierrors.Unavailable
}

// idempotencyKey is the request's Idempotency-Key for the change log, when it is a plausible
// one (1 to 255 printable ASCII characters); anything else is left off the entry.
func idempotencyKey(c echo.Context) string {
	k := c.Request().Header.Get("Idempotency-Key")
	if len(k) == 0 || len(k) > 255 {
		return ""
	}
	for _, r := range k {
		if r < 0x21 || r > 0x7e {
			return ""
		}
	}
	return k
}
