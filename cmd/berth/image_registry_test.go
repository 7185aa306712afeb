package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthhq/berth/nodeplugins/containerd/ociimage"
	"github.com/berthhq/berth/sdk/client"
)

// TestImagePushAndLsAgainstTheRegistry: `image push SRC NAME:TAG` pushes an OCI layout tar
// (keeping its digest) and a docker save tarball to the registry on the server's host, over
// the pinned certificate with the token as the password; `image ls` lists the repositories
// and a repository's tags with their digests; a wrong pin is refused.
func TestImagePushAndLsAgainstTheRegistry(t *testing.T) {
	t.Parallel()
	reg := registry.New()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p, ok := r.BasicAuth(); !ok || p != "brt_ci" {
			w.Header().Set("WWW-Authenticate", `Basic realm="berth"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_ci"
	c.env["BERTH_FINGERPRINT"] = client.Fingerprint(srv.Certificate().Raw)
	c.env["BERTH_PROJECT"] = "shop"

	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	layoutTar := filepath.Join(t.TempDir(), "layout.tar")
	want, err := ociimage.WriteArchive(img, layoutTar)
	if err != nil {
		t.Fatal(err)
	}
	if out := c.ok("", "image", "push", layoutTar, "web:v1"); out != "pushed "+host+"/shop/web:v1@"+want+"\n" {
		t.Fatalf("image push of a layout: %q; want the layout's digest %s", out, want)
	}
	opts := []remote.Option{remote.WithTransport(srv.Client().Transport), remote.WithAuth(&authn.Basic{Username: "x", Password: "brt_ci"})}
	tag, _ := name.NewTag(host + "/shop/web:v1")
	if d, err := remote.Head(tag, opts...); err != nil || d.Digest.String() != want {
		t.Fatalf("the registry's shop/web:v1 = %v, %v; want %s", d, err, want)
	}
	other, _ := random.Image(512, 1)
	dockerTar := filepath.Join(t.TempDir(), "docker.tar")
	if err := tarball.WriteToFile(dockerTar, tag, other); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("", "image", "push", dockerTar, "shop/api:main"); !strings.HasPrefix(out, "pushed "+host+"/shop/api:main@sha256:") {
		t.Fatalf("image push of a docker tarball: %q", out)
	}
	if out := c.ok("", "image", "ls"); out != "REPOSITORY\nshop/api\nshop/web\n" {
		t.Errorf("image ls: %q", out)
	}
	if out := c.ok("", "image", "ls", "web"); out != "TAG   DIGEST\nv1    "+want+"\n" {
		t.Errorf("image ls web: %q", out)
	}
	c.env["BERTH_FINGERPRINT"] = "sha256:" + strings.Repeat("00", 32)
	if _, errOut, code := c.run("", "image", "push", layoutTar, "web:v2"); code == 0 || !strings.Contains(errOut, "fingerprint") {
		t.Errorf("image push with a wrong pin: exit %d, %q", code, errOut)
	}
}
