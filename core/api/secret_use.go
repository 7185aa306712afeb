package api

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
)

// checkSecretUse enforces the rule of docs/api.md section 10.2: a service write may make
// service name of p take a secret it does not take now (a reference that is new or changed in
// key, secret, version or delivery, a set not attached now, another tls.secret) only when the
// caller holds secret:use on the service; references the stored service already has stay
// allowed, so a deploy token rolls new releases of a service the operator gave secrets. It is
// asked before any value is opened or any existence is answered. Without secret:use, a write
// that keeps references is pinned to the revision they were compared with: it returns the
// expected revision to write under (expected itself when the caller holds secret:use or the
// write references nothing). Errors: 403 secret_use_forbidden naming the first secret or set
// taken anew; 409 revision_conflict for an expected revision other than the one read.
func (s *Server) checkSecretUse(c echo.Context, p *services.Project, name string, refs map[string]secrets.Ref, sets []string, tlsSecret string, expected *int64) (*int64, error) {
	if len(refs) == 0 && len(sets) == 0 && tlsSecret == "" {
		return expected, nil
	}
	who := principal(c)
	if who.Allows(identity.ScopeSecretUse, p.Name, name, false) {
		return expected, nil
	}
	cur, err := s.cfg.Catalog.GetService(c.Request().Context(), p, name)
	if errors.Is(err, services.ErrServiceNotFound) {
		cur = &services.Service{}
	} else if err != nil {
		return nil, err
	}
	forbidden := func(what string) error {
		return problem(abierrors.SecretUseForbidden, fmt.Sprintf("service %s/%s does not take %s yet, and making it take a secret needs secret:use on it; this token may keep the references the service has", p.Name, name, what))
	}
	for _, k := range slices.Sorted(maps.Keys(refs)) {
		if had, ok := cur.Secrets[k]; !ok || !sameRef(had, refs[k]) {
			return nil, forbidden(fmt.Sprintf("secret %s as %s", refs[k].Secret, k))
		}
	}
	for _, set := range sets {
		if !slices.Contains(cur.SecretSets, set) {
			return nil, forbidden("secret set " + set)
		}
	}
	if tlsSecret != "" && tlsSecret != cur.TLS.Secret {
		return nil, forbidden("secret " + tlsSecret + " as tls.secret")
	}
	if expected != nil && *expected != cur.Revision {
		return nil, serviceError(fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, name, cur.Revision, *expected))
	}
	rev := cur.Revision
	return &rev, nil
}

// sameRef reports whether a and b take the same secret version the same way ("" is env).
func sameRef(a, b secrets.Ref) bool {
	if a.As == "" {
		a.As = secrets.AsEnv
	}
	if b.As == "" {
		b.As = secrets.AsEnv
	}
	return a == b
}

// specRefs returns the references a service spec states itself.
func specRefs(spec *serviceSpec) map[string]secrets.Ref {
	if len(spec.Secrets) == 0 {
		return nil
	}
	out := make(map[string]secrets.Ref, len(spec.Secrets))
	for k, r := range spec.Secrets {
		out[k] = secrets.Ref(r)
	}
	return out
}
