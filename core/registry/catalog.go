package registry

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"

	"github.com/berthhq/berth/core/identity"
)

// mayListCatalog reports whether p may read the repositories of at least one
// project, so that /v2/_catalog has something to show it (docs/registry.md
// section 3): services:read everywhere, in its bound project, or through a
// per-project grant.
func mayListCatalog(p *identity.Principal) bool {
	if p == nil {
		return false
	}
	if p.Has(identity.ScopeServicesRead) {
		return true
	}
	if p.Project != "" {
		return p.Allows(identity.ScopeServicesRead, p.Project, p.Service, false)
	}
	for project := range p.Grants {
		if p.Allows(identity.ScopeServicesRead, project, "", false) {
			return true
		}
	}
	return false
}

// serveCatalog answers GET /v2/_catalog for a principal that may read only
// some projects: the repositories it may pull from, in lexical order, paged
// like distribution's own catalog (n at most CatalogMaxEntries, last, and a
// Link header naming the next page). Errors: 400 PAGINATION_NUMBER_INVALID
// for a bad n; 503 UNAVAILABLE when the storage cannot be listed.
func (r *Registry) serveCatalog(w http.ResponseWriter, req *http.Request, p *identity.Principal) {
	q := req.URL.Query()
	n := CatalogMaxEntries
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			serveError(w, http.StatusBadRequest, errcode.ErrorCodePaginationNumberInvalid.WithMessage("n must be a number from 0 to "+strconv.Itoa(CatalogMaxEntries)))
			return
		}
		n = min(v, CatalogMaxEntries)
	}
	last := q.Get("last")
	enum, ok := r.ns.(distribution.RepositoryEnumerator)
	if !ok {
		r.log.Error("registry: the storage cannot list repositories")
		serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
		return
	}
	var repos []string
	err := enum.Enumerate(req.Context(), func(repo string) error {
		if repo > last && len(grantFor(p, repo, []string{ActionPull})) > 0 {
			repos = append(repos, repo)
		}
		return nil
	})
	if err != nil && !isPathNotFound(err) { // an empty registry has no repositories directory yet
		r.log.Error("registry: list repositories", "err", err)
		serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
		return
	}
	slices.Sort(repos)
	if len(repos) > n {
		repos = repos[:n]
		if n > 0 {
			next := url.URL{Path: "/v2/_catalog", RawQuery: url.Values{"n": {strconv.Itoa(n)}, "last": {repos[n-1]}}.Encode()}
			w.Header().Set("Link", fmt.Sprintf("<%s>; rel=\"next\"", next.String()))
		}
	}
	if repos == nil {
		repos = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Repositories []string `json:"repositories"`
	}{repos})
}

// catalogResource is the token scope resource of /v2/_catalog.
const catalogResource = "registry:catalog"
