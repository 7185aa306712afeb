package registry

import (
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/gorilla/mux"

	"github.com/berthhq/berth/core/identity"
	v2 "github.com/distribution/distribution/v3/registry/api/v2"
)

// Actions on a repository, as in the token scope grammar
// ("repository:shop/web:pull,push").
const (
	ActionPull   = "pull"
	ActionPush   = "push"
	ActionDelete = "delete"
)

// need is what one request needs: a resource ("repository:<name>",
// "registry:catalog", or "" for the base endpoint) and an action.
type need struct {
	resource string
	repo     string
	action   string
	route    string
	ref      string // the manifest reference (tag or digest) or blob digest, when the route has one
}

// invalidName reports a request under /v2/ naming a repository the router
// refuses (uppercase, "..", empty components) or one outside
// "<project>/<name>".
var looksLikeRepoPath = regexp.MustCompile(`^/v2/(.+)/(manifests|blobs|tags)(/.*)?$`)

// classify works out what r needs. ok is false when the path names no
// registry route; badName is set when it names a repository that is not
// valid.
func classify(router *mux.Router, r *http.Request) (n need, ok, badName bool) {
	var m mux.RouteMatch
	if !router.Match(r, &m) || m.Route == nil {
		// A method the route does not take still matches its path.
		if m.MatchErr == mux.ErrMethodMismatch {
			return need{}, false, false
		}
		if looksLikeRepoPath.MatchString(r.URL.Path) {
			return need{}, false, true
		}
		return need{}, false, false
	}
	n.route = m.Route.GetName()
	switch n.route {
	case v2.RouteNameBase:
		return n, true, false
	case v2.RouteNameCatalog:
		n.resource, n.action = catalogResource, "*"
		return n, true, false
	}
	name := m.Vars["name"]
	if !validRepo(name) {
		return need{}, false, true
	}
	n.repo, n.resource = name, "repository:"+name
	n.ref = m.Vars["reference"]
	if n.ref == "" {
		n.ref = m.Vars["digest"]
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		n.action = ActionPull
	case http.MethodDelete:
		n.action = ActionDelete
		if n.route == v2.RouteNameBlobUpload || n.route == v2.RouteNameBlobUploadChunk {
			n.action = ActionPush // cancelling one's own upload
		}
	default:
		n.action = ActionPush
	}
	return n, true, false
}

// validRepo reports whether name is "<project>/<rest>" in the registry's
// name grammar: lower case, at most 255 bytes, at least two components.
func validRepo(name string) bool {
	if len(name) > 255 || !strings.Contains(name, "/") {
		return false
	}
	return repoRE.MatchString(name)
}

// repoRE is the OCI distribution name grammar, path components only (no
// registry host), at least two of them.
var repoRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+$`)

// splitRepo returns the project and the rest of a repository name.
func splitRepo(name string) (project, rest string) {
	project, rest, _ = strings.Cut(name, "/")
	return project, rest
}

// grantFor returns the actions p may take on repo, out of want. Pull needs
// services:read, push service:deploy, delete services:write, each in the
// repository's project (and, for a service-bound token, on the service the
// repository is named after).
func grantFor(p *identity.Principal, repo string, want []string) []string {
	project, rest := splitRepo(repo)
	service, _, _ := strings.Cut(rest, "/")
	var out []string
	for _, a := range want {
		var s identity.Scope
		switch a {
		case ActionPull:
			s = identity.ScopeServicesRead
		case ActionPush:
			s = identity.ScopeServiceDeploy
		case ActionDelete:
			s = identity.ScopeServicesWrite
		default:
			continue
		}
		if p.Allows(s, project, service, false) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// tagRE is the OCI tag grammar.
var tagRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
