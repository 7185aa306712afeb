package registry_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
)

// TestCatalogListsWhatTheCredentialMayRead pushes repositories into two
// projects and lists /v2/_catalog with credentials of different reach: a
// global token sees every repository, a project token only its project's, a
// service-bound deploy token only its service's, and a credential that may
// read nothing is denied with a message that names what is missing
// (docs/registry.md section 3).
func TestCatalogListsWhatTheCredentialMayRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := newEnv(t, blobs.S3Config{})
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, repo := range []string{"shop/web", "shop/api", "other/db"} {
		project, service, _ := strings.Cut(repo, "/")
		if err := remote.Write(e.ref(t, repo+":v1"), img, auth(e.token(t, project, service, identity.ScopeServiceDeploy))); err != nil {
			t.Fatalf("push %s: %v", repo, err)
		}
	}
	reg, err := name.NewRegistry(e.host, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		tok  string
		want []string
	}{
		{"global read", e.token(t, "", "", identity.ScopeServicesRead), []string{"other/db", "shop/api", "shop/web"}},
		{"project read", e.token(t, "shop", "", identity.ScopeServicesRead), []string{"shop/api", "shop/web"}},
		{"service deploy", e.token(t, "shop", "web", identity.ScopeServiceDeploy), []string{"shop/web"}},
		{"project without images", e.token(t, "empty", "", identity.ScopeServicesRead), []string{}},
	} {
		got, err := remote.Catalog(ctx, reg, auth(c.tok))
		if err != nil {
			t.Fatalf("%s: catalog: %v", c.name, err)
		}
		if got == nil {
			got = []string{}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: catalog = %v, want %v", c.name, got, c.want)
		}
	}

	// Pages: n=1 walks the project's repositories one by one through Link.
	tok := e.bearer(t, e.token(t, "shop", "", identity.ScopeServicesRead), "registry:catalog:*")
	resp, body := do(t, http.MethodGet, e.srv.URL+"/v2/_catalog?n=1", tok, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `["shop/api"]`) ||
		resp.Header.Get("Link") != `</v2/_catalog?last=shop%2Fapi&n=1>; rel="next"` {
		t.Fatalf("first page: %s %s Link %q", resp.Status, body, resp.Header.Get("Link"))
	}
	resp, body = do(t, http.MethodGet, e.srv.URL+"/v2/_catalog?n=1&last=shop%2Fapi", tok, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `["shop/web"]`) || resp.Header.Get("Link") != "" {
		t.Fatalf("last page: %s %s Link %q", resp.Status, body, resp.Header.Get("Link"))
	}
	if resp, body := do(t, http.MethodGet, e.srv.URL+"/v2/_catalog?n=x", tok, nil); resp.StatusCode != http.StatusBadRequest || errCode(body) != "PAGINATION_NUMBER_INVALID" {
		t.Fatalf("bad n: %s %s", resp.Status, body)
	}

	// A credential that may read no project is denied, without a bare "*".
	_, err = remote.Catalog(ctx, reg, auth(e.token(t, "", "", identity.ScopeSecretRead)))
	if code(err) != "DENIED" || strings.Contains(err.Error(), "*") || !strings.Contains(err.Error(), "services:read") {
		t.Fatalf("catalog without services:read = %v", err)
	}
}
