package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/sdk/client"
)

// SecretsConfig serves the secret routes (docs/api.md section 10).
type SecretsConfig struct {
	Store *secrets.Store
	// Rewrap starts the background re-wrap of a rotation [secrets.Store.StartRotation] began;
	// it must return at once. nil runs nothing (the next berthd start resumes it).
	Rewrap func()
}

// registerSecrets adds the secret routes when secrets are configured.
func (s *Server) registerSecrets(v1 *echo.Group) {
	if s.cfg.Secrets == nil {
		return
	}
	v1.GET("/projects/:project/secrets", s.listSecrets, s.auth(identity.ScopeSecretRead))
	v1.PUT("/projects/:project/secrets/:secret", s.putSecret, s.auth(identity.ScopeSecretWrite))
	v1.GET("/projects/:project/secrets/:secret", s.getSecret, s.auth(identity.ScopeSecretRead))
	v1.DELETE("/projects/:project/secrets/:secret", s.deleteSecret, s.auth(identity.ScopeSecretWrite))
	v1.GET("/projects/:project/secret-sets", s.listSecretSets, s.auth(identity.ScopeSecretRead))
	v1.PUT("/projects/:project/secret-sets/:set", s.putSecretSet, s.auth(identity.ScopeSecretWrite))
	v1.GET("/projects/:project/secret-sets/:set", s.getSecretSet, s.auth(identity.ScopeSecretRead))
	v1.DELETE("/projects/:project/secret-sets/:set", s.deleteSecretSet, s.auth(identity.ScopeSecretWrite))
	v1.GET("/secrets/keyring", s.keyringStatus, s.auth(identity.ScopeAdmin))
	v1.POST("/secrets/keyring/rotate", s.rotateKeyring, s.auth(identity.ScopeAdmin, reauth))
	if s.cfg.NodeOps != nil {
		v1.POST("/nodes/:id/secret-key/rotate", s.rotateNodeSecretKey, s.auth(identity.ScopeAdmin, reauth))
	}
}

// rotateNodeSecretKey asks the node over its session for a new X25519 key (secret_key_rotate,
// docs/node-protocol.md section 6.6), records it on the node with one conditional write, and
// hints a pass: the next desired state reseals every value of the node's workloads to the new
// key, which restarts them one node-local step at a time. The node keeps its previous key, so
// values sealed before the core learnt the new one still open.
func (s *Server) rotateNodeSecretKey(c echo.Context) error {
	var body struct{}
	if err := s.bindOptional(c, &body); err != nil {
		return err
	}
	ctx := c.Request().Context()
	id := c.Param("id")
	if err := s.knownNode(ctx, id); err != nil {
		return err
	}
	n, err := s.cfg.Nodes.Get(ctx, id)
	if err != nil {
		return err
	}
	res, err := s.cfg.NodeOps.Command(ctx, id, node.Command{Kind: node.CommandSecretKeyRotate})
	if err != nil {
		return nodeOpError(err)
	}
	if res.Status != "ok" {
		return nodeRefusal(res)
	}
	wctx, done := s.changeCtx(c)
	n, err = s.cfg.Nodes.SetBoxKey(wctx, id, n.BoxPublicKey, res.SecretKey)
	done()
	if err != nil {
		return err
	}
	s.log.Info("node secret key rotated", "node_id", id)
	s.awaitChange(c, "nodes", id, n.LogOutbox)
	s.cfg.Hinter.Hint("node.secret_key")
	return c.JSON(http.StatusOK, map[string]any{"node_id": id, "secret_key": res.SecretKey})
}

func (s *Server) secretStore() *secrets.Store { return s.cfg.Secrets.Store }

func checkSecretName(kind, name string) error {
	if !secrets.ValidName(name) {
		return problem(abierrors.InvalidName, fmt.Sprintf("%s name %q must be a DNS label: 1 to 63 characters of a-z, 0-9 and '-', not starting or ending with '-'", kind, name))
	}
	return nil
}

func author(c echo.Context) string {
	t, id := actorOf(principal(c))
	return t + ":" + id
}

// uses returns, per secret name and per set name, which services of project p reference it.
func (s *Server) uses(ctx context.Context, p *services.Project) (bySecret, bySet map[string][]client.SecretUse, err error) {
	svcs, err := s.cfg.Catalog.ListServices(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	sets := map[string]*secrets.Set{}
	bySecret, bySet = map[string][]client.SecretUse{}, map[string][]client.SecretUse{}
	for i := range svcs {
		svc := &svcs[i]
		direct := map[string][]string{}
		for _, key := range slices.Sorted(maps.Keys(svc.Secrets)) {
			r := svc.Secrets[key]
			direct[r.Secret] = append(direct[r.Secret], key)
		}
		if svc.TLS.Secret != "" && len(direct[svc.TLS.Secret]) == 0 {
			direct[svc.TLS.Secret] = []string{} // the tls block's certificate (docs/certificates.md section 1)
		}
		for _, name := range slices.Sorted(maps.Keys(direct)) {
			bySecret[name] = append(bySecret[name], client.SecretUse{Service: svc.Name, Keys: direct[name]})
		}
		for _, setName := range svc.SecretSets {
			bySet[setName] = append(bySet[setName], client.SecretUse{Service: svc.Name, Keys: []string{}})
			set, ok := sets[setName]
			if !ok {
				set, err = s.secretStore().GetSet(ctx, p.ID, setName)
				if errors.Is(err, secrets.ErrSetNotFound) {
					sets[setName] = nil
					continue
				} else if err != nil {
					return nil, nil, err
				}
				sets[setName] = set
			}
			if set == nil {
				continue
			}
			via := map[string][]string{}
			for _, key := range slices.Sorted(maps.Keys(set.Secrets)) {
				via[set.Secrets[key].Secret] = append(via[set.Secrets[key].Secret], key)
			}
			for _, name := range slices.Sorted(maps.Keys(via)) {
				bySecret[name] = append(bySecret[name], client.SecretUse{Service: svc.Name, Keys: via[name], Via: setName})
			}
		}
	}
	return bySecret, bySet, nil
}

func toAPISecret(sec *secrets.Secret, used []client.SecretUse) client.Secret {
	out := client.Secret{Project: sec.Project, Name: sec.Name, Revision: sec.Revision, CreatedAt: sec.CreatedAt, UpdatedAt: sec.UpdatedAt,
		Versions: []client.SecretVersion{}, UsedBy: used}
	if out.UsedBy == nil {
		out.UsedBy = []client.SecretUse{}
	}
	if cur := sec.Current(); cur != nil {
		out.Current = cur.Version
	}
	for _, v := range sec.Versions {
		out.Versions = append(out.Versions, client.SecretVersion{Version: v.Version, CreatedAt: v.CreatedAt, Author: v.Author, Digest: v.Digest})
	}
	return out
}

func toAPISet(set *secrets.Set, used []client.SecretUse) client.SecretSet {
	out := client.SecretSet{Project: set.Project, Name: set.Name, Revision: set.Revision, CreatedAt: set.CreatedAt, UpdatedAt: set.UpdatedAt,
		Secrets: map[string]client.SecretRef{}, UsedBy: used}
	if out.UsedBy == nil {
		out.UsedBy = []client.SecretUse{}
	}
	for k, r := range set.Secrets {
		out.Secrets[k] = client.SecretRef(r)
	}
	return out
}

// putSecret writes a new version (docs/api.md section 10.1). The body is {"value": "text"} or
// {"value_base64": "..."} (any bytes); the value is never logged, and the answer (the one an
// Idempotency-Key record keeps) carries only names, versions and digests.
func (s *Server) putSecret(c echo.Context) error {
	name := c.Param("secret")
	if err := checkName("project", c.Param("project")); err != nil {
		return err
	}
	if err := checkSecretName("secret", name); err != nil {
		return err
	}
	var req struct {
		Value       json.RawMessage `json:"value"`
		ValueBase64 *string         `json:"value_base64"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	value, err := secretWriteValue(req.Value, req.ValueBase64)
	if err != nil {
		return err
	}
	defer clear(value)
	if len(value) > secrets.MaxValueBytes {
		return problem(abierrors.SecretTooLarge, fmt.Sprintf("a secret value is at most %d bytes", secrets.MaxValueBytes))
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	if !node.EnvSafe(value) {
		if err := s.checkNoEnvUsers(c.Request().Context(), p, name); err != nil {
			return err
		}
	}
	wctx, done := s.changeCtx(c)
	sec, ver, err := s.secretStore().Put(wctx, p.ID, p.Name, name, value, author(c))
	done()
	if err != nil {
		return deploy.SecretError(err)
	}
	s.log.Info("secret version written", "project", p.Name, "secret", name, "version", ver.Version)
	s.awaitChange(c, secrets.Collection, sec.ID, sec.LogOutbox)
	s.cfg.Hinter.Hint("secret.written")
	s.rollSecretUsers(c, p, name, "")
	bySecret, _, err := s.uses(c.Request().Context(), p)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if len(sec.Versions) == 1 {
		status = http.StatusCreated
	}
	return c.JSON(status, toAPISecret(sec, bySecret[name]))
}

func (s *Server) getSecret(c echo.Context) error {
	name := c.Param("secret")
	if err := checkSecretName("secret", name); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	sec, err := s.secretStore().Get(ctx, p.ID, name)
	if err != nil {
		return deploy.SecretError(err)
	}
	bySecret, _, err := s.uses(ctx, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toAPISecret(sec, bySecret[name]))
}

func (s *Server) listSecrets(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	list, err := s.secretStore().List(ctx, p.ID)
	if err != nil {
		return err
	}
	bySecret, _, err := s.uses(ctx, p)
	if err != nil {
		return err
	}
	out := client.List[client.Secret]{Items: []client.Secret{}}
	for i := range list {
		out.Items = append(out.Items, toAPISecret(&list[i], bySecret[list[i].Name]))
	}
	return c.JSON(http.StatusOK, out)
}

func expectedRevision(c echo.Context) (*int64, error) {
	v := c.QueryParam("expected_revision")
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return nil, problem(abierrors.BadRequest, "expected_revision must be a non-negative integer")
	}
	return &n, nil
}

func inUse(kind, name string, used []client.SecretUse) error {
	names := []string{}
	for _, u := range used {
		if !slices.Contains(names, u.Service) {
			names = append(names, u.Service)
		}
	}
	return problem(abierrors.SecretInUse, fmt.Sprintf("%s %s is used by services %s; change them first", kind, name, strings.Join(names, ", ")))
}

// deleteSecret deletes a secret that no service references (directly or through a set): 409
// secret_in_use naming the services otherwise. The check and the delete are two reads and one
// write: an apply racing the delete can still reference it, and is then refused at its next
// delivery (the secret is gone) rather than run with a value.
func (s *Server) deleteSecret(c echo.Context) error {
	name := c.Param("secret")
	if err := checkSecretName("secret", name); err != nil {
		return err
	}
	expected, err := expectedRevision(c)
	if err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	bySecret, _, err := s.uses(c.Request().Context(), p)
	if err != nil {
		return err
	}
	if used := bySecret[name]; len(used) > 0 {
		return inUse("secret", name, used)
	}
	wctx, done := s.changeCtx(c)
	sec, err := s.secretStore().Delete(wctx, p.ID, name, expected)
	done()
	if err != nil {
		return deploy.SecretError(err)
	}
	s.log.Info("secret deleted", "project", p.Name, "secret", name)
	s.awaitChange(c, secrets.Collection, sec.ID, sec.LogOutbox)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) putSecretSet(c echo.Context) error {
	name := c.Param("set")
	if err := checkName("project", c.Param("project")); err != nil {
		return err
	}
	if err := checkSecretName("secret set", name); err != nil {
		return err
	}
	var spec client.SecretSetSpec
	if err := s.bind(c, &spec); err != nil {
		return err
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	refs := map[string]secrets.Ref{}
	for k, r := range spec.Secrets {
		refs[k] = secrets.Ref(r)
	}
	if err := s.deployer.CheckEnvValues(c.Request().Context(), p.ID, refs); err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	set, created, err := s.secretStore().PutSet(wctx, p.ID, p.Name, name, refs, spec.ExpectedRevision)
	done()
	if err != nil {
		return deploy.SecretRefError(err)
	}
	if len(set.LogOutbox) > 0 {
		s.log.Info("secret set written", "project", p.Name, "set", name, "revision", set.Revision)
		s.awaitChange(c, secrets.SetsCollection, set.ID, set.LogOutbox)
		s.cfg.Hinter.Hint("secret_set.written")
		s.rollSecretUsers(c, p, "", name)
	}
	_, bySet, err := s.uses(c.Request().Context(), p)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, toAPISet(set, bySet[name]))
}

func (s *Server) getSecretSet(c echo.Context) error {
	name := c.Param("set")
	if err := checkSecretName("secret set", name); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	set, err := s.secretStore().GetSet(ctx, p.ID, name)
	if err != nil {
		return deploy.SecretError(err)
	}
	_, bySet, err := s.uses(ctx, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toAPISet(set, bySet[name]))
}

func (s *Server) listSecretSets(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	list, err := s.secretStore().ListSets(ctx, p.ID)
	if err != nil {
		return err
	}
	_, bySet, err := s.uses(ctx, p)
	if err != nil {
		return err
	}
	out := client.List[client.SecretSet]{Items: []client.SecretSet{}}
	for i := range list {
		out.Items = append(out.Items, toAPISet(&list[i], bySet[list[i].Name]))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) deleteSecretSet(c echo.Context) error {
	name := c.Param("set")
	if err := checkSecretName("secret set", name); err != nil {
		return err
	}
	expected, err := expectedRevision(c)
	if err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	_, bySet, err := s.uses(c.Request().Context(), p)
	if err != nil {
		return err
	}
	if used := bySet[name]; len(used) > 0 {
		return inUse("secret set", name, used)
	}
	wctx, done := s.changeCtx(c)
	set, err := s.secretStore().DeleteSet(wctx, p.ID, name, expected)
	done()
	if err != nil {
		return deploy.SecretError(err)
	}
	s.log.Info("secret set deleted", "project", p.Name, "set", name)
	s.awaitChange(c, secrets.SetsCollection, set.ID, set.LogOutbox)
	return c.NoContent(http.StatusNoContent)
}

// keyringStatus checks the keyring file again and reports its KEKs (how many versions each
// wraps) and the latest rotation (docs/api.md section 10.3).
func (s *Server) keyringStatus(c echo.Context) error {
	out, err := s.keyringReport(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) keyringReport(ctx context.Context) (*client.KeyringStatus, error) {
	st := s.secretStore()
	kr := st.Keyring()
	out := &client.KeyringStatus{Path: kr.Path(), OK: true, ActiveKEK: kr.ActiveKEK(), KEKs: []client.KEKStatus{}}
	if err := kr.Check(); err != nil {
		out.OK, out.Problem = false, err.Error()
	}
	counts, err := st.WrappedBy(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range kr.KEKs() {
		out.KEKs = append(out.KEKs, client.KEKStatus{ID: k.ID, CreatedAt: k.CreatedAt, Active: k.Active, Wraps: counts[k.ID]})
	}
	r, err := st.RotationStatus(ctx)
	if err != nil {
		return nil, err
	}
	if r != nil {
		out.Rotation = &client.KeyringRotation{State: r.State, TargetKEK: r.TargetKEK, RetireOld: r.RetireOld, Secrets: r.Secrets,
			Rewrapped: r.Rewrapped, Retired: r.Retired, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt}
	}
	return out, nil
}

// rotateKeyring adds a KEK, makes it active and starts the background re-wrap: 202 with the
// keyring's status; 409 keyring_rotation_running while the previous one runs.
func (s *Server) rotateKeyring(c echo.Context) error {
	var req struct {
		RetireOld bool `json:"retire_old"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	r, err := s.secretStore().StartRotation(ctx, req.RetireOld)
	if err != nil {
		return deploy.SecretError(err)
	}
	s.log.Info("keyring rotation started", "kek_id", r.TargetKEK, "retire_old", r.RetireOld)
	if s.cfg.Secrets.Rewrap != nil {
		s.cfg.Secrets.Rewrap()
	}
	out, err := s.keyringReport(ctx)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, out)
}

// rollSecretUsers rolls every service of p that receives secret (or, with a set name, set) to
// the versions it resolves to now (secret.rollover, core/deploy), so a new version of an
// unpinned reference rolls out like any change of what the service runs; a service whose
// versions did not move is not written. The secret write is durable already: a failure or a
// policy's refusal here (recorded by the deployer) is logged, and the services stay on what
// they run until their next apply or the secret's next version.
func (s *Server) rollSecretUsers(c echo.Context, p *services.Project, secret, set string) {
	ctx := c.Request().Context()
	bySecret, bySet, err := s.uses(ctx, p)
	if err != nil {
		s.log.Warn("services using a changed secret not updated", "project", p.Name, "err", err)
		return
	}
	users := bySecret[secret]
	if set != "" {
		users = bySet[set]
	}
	done := map[string]bool{}
	for _, u := range users {
		if done[u.Service] {
			continue
		}
		done[u.Service] = true
		wctx, doneCtx := s.changeCtx(c)
		res, err := s.deployer.RollSecrets(wctx, p, u.Service)
		doneCtx()
		if err != nil {
			s.log.Warn("service keeps its secret versions", "project", p.Name, "service", u.Service, "err", err)
			continue
		}
		if !res.Changed() {
			continue
		}
		out := res.Service
		s.log.Info("service rolls to new secret versions", "project", p.Name, "service", u.Service, "revision", out.Revision)
		s.awaitChange(c, "services", out.ID, out.LogOutbox)
	}
}

// secretWriteValue returns the bytes a secret write carries: value, a JSON string of UTF-8 text, or
// value_base64, standard padded base64 of any bytes; exactly one of them. encoding/json would
// replace bytes that are not UTF-8, and lone surrogate escapes, with U+FFFD without a word, so
// value is checked in its raw JSON and refused (422 naming it) rather than stored changed.
func secretWriteValue(text json.RawMessage, b64 *string) ([]byte, error) {
	hasText := len(text) > 0 && string(text) != "null"
	switch {
	case hasText && b64 != nil:
		return nil, problem(abierrors.ValidationFailed, "give value (UTF-8 text) or value_base64 (any bytes), not both")
	case b64 != nil:
		v, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return nil, problem(abierrors.ValidationFailed, "value_base64 is not standard padded base64 (RFC 4648 section 4)")
		}
		return v, nil
	case !hasText:
		return nil, problem(abierrors.ValidationFailed, "value (UTF-8 text) or value_base64 (any bytes) is required")
	case text[0] != '"':
		return nil, problem(abierrors.BadRequest, "value must be a JSON string")
	}
	v, ok := exactJSONString(text)
	if !ok {
		return nil, problem(abierrors.ValidationFailed, "value must be UTF-8 text (no other bytes, no lone surrogate escapes); send bytes as value_base64")
	}
	return v, nil
}

// exactJSONString decodes raw, one well-formed JSON string, and reports whether the result is
// exactly what raw spells: raw is UTF-8 and every U+FFFD decoded stands in raw, literally or as
// the escape \ufffd (any other one replaced a lone surrogate).
func exactJSONString(raw []byte) ([]byte, bool) {
	if !utf8.Valid(raw) {
		return nil, false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, false
	}
	body, spelt := raw[1:len(raw)-1], 0
	for i := 0; i < len(body); {
		switch {
		case body[i] == '\\' && body[i+1] == 'u':
			if strings.EqualFold(string(body[i+2:i+6]), "fffd") {
				spelt++
			}
			i += 6
		case body[i] == '\\':
			i += 2
		default:
			r, n := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError {
				spelt++ // raw is valid UTF-8: a literal U+FFFD
			}
			i += n
		}
	}
	if strings.Count(s, "\uFFFD") != spelt {
		return nil, false
	}
	return []byte(s), true
}

// checkNoEnvUsers refuses (422 validation_failed naming the service and key) a new version of
// secret name that an environment variable cannot carry ([node.EnvSafe]) while a service of p
// takes its current version as one, directly or through an attached set: the new version would
// roll out to it and the workload could not start. Pinned references do not move and are not
// counted.
func (s *Server) checkNoEnvUsers(ctx context.Context, p *services.Project, name string) error {
	svcs, err := s.cfg.Catalog.ListServices(ctx, p)
	if err != nil {
		return err
	}
	takes := func(r secrets.Ref) bool {
		return r.Secret == name && r.Version == 0 && (r.As == "" || r.As == secrets.AsEnv)
	}
	for i := range svcs {
		svc := &svcs[i]
		for _, k := range slices.Sorted(maps.Keys(svc.Secrets)) {
			if takes(svc.Secrets[k]) {
				return notForEnv(name, svc.Name, k, "")
			}
		}
		for _, setName := range svc.SecretSets {
			set, err := s.secretStore().GetSet(ctx, p.ID, setName)
			if errors.Is(err, secrets.ErrSetNotFound) {
				continue
			} else if err != nil {
				return err
			}
			for _, k := range slices.Sorted(maps.Keys(set.Secrets)) {
				if takes(set.Secrets[k]) {
					return notForEnv(name, svc.Name, k, setName)
				}
			}
		}
	}
	return nil
}

func notForEnv(secret, service, key, set string) error {
	via := ""
	if set != "" {
		via = " through secret set " + set
	}
	return problem(abierrors.ValidationFailed, fmt.Sprintf("value: it holds a NUL byte or bytes that are not UTF-8, and service %s takes secret %s as environment variable %s%s, which cannot carry them; deliver it there as a file (as: file) or pin a version first", service, secret, key, via))
}
