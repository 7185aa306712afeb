package api

import (
	"context"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
)

// recordPush notes digest as pushed to repo:tag, as the registry's push hook does.
func (f *fixture) recordPush(repo, tag, digest string) {
	f.t.Helper()
	if err := f.api.cfg.ImageReleases.Record(context.Background(), registry.Push{Repository: repo, Reference: tag, Digest: digest, Actor: "tok_ci", ActorKind: identity.KindMachine}); err != nil {
		f.t.Fatal(err)
	}
}

// TestPromoteReleaseRollsTheServiceToTheTagsDigest: a promotion pins the service's image to the
// digest the tag names under the revision read, answers the new revision, and refuses tags
// never pushed, process services and stale revisions with their codes.
func TestPromoteReleaseRollsTheServiceToTheTagsDigest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d0, d1 := "sha256:"+strings.Repeat("0a", 32), "sha256:"+strings.Repeat("1b", 32)
	svc := "/api/v1/projects/shop/services/web"
	code, out := f.json("PUT", svc, map[string]any{"runtime": "containerd", "image": "127.0.0.1:1/shop/web@" + d0})
	if code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	f.recordPush("shop/web", "v1", d1)
	if code, out := f.json("POST", svc+"/releases", map[string]any{"tag": "v2"}); code != 201 {
		t.Fatalf("reserve v2: %d %v", code, out)
	}

	code, out = f.json("POST", svc+"/releases/v1/promote", nil)
	want := "127.0.0.1:1/shop/web@" + d1
	if code != 200 || out["image"] != want || out["revision"] != float64(2) || out["changed"] != true {
		t.Fatalf("promote v1: %d %v; want image %s at revision 2", code, out, want)
	}
	code, out = f.json("GET", svc, nil)
	if code != 200 || out["image"] != want {
		t.Fatalf("read back: %d %v", code, out)
	}
	// Promoting the release the service runs writes nothing.
	if code, out := f.json("POST", svc+"/releases/v1/promote", nil); code != 200 || out["revision"] != float64(2) || out["changed"] != false {
		t.Fatalf("promote v1 again: %d %v", code, out)
	}
	for _, tc := range []struct {
		path string
		body any
		code int
		want string
	}{
		{svc + "/releases/v9/promote", nil, 404, "image_release_not_found"},
		{svc + "/releases/v2/promote", nil, 409, "release_not_pushed"},
		{svc + "/releases/v1/promote", map[string]any{"expected_revision": 1}, 409, "revision_conflict"},
		{"/api/v1/projects/shop/services/nope/releases/v1/promote", nil, 404, "service_not_found"},
	} {
		if code, out := f.json("POST", tc.path, tc.body); code != tc.code || out["code"] != tc.want {
			t.Errorf("POST %s %v: %d %v; want %d %s", tc.path, tc.body, code, out, tc.code, tc.want)
		}
	}
	if code, out := f.json("GET", svc, nil); code != 200 || out["revision"] != float64(2) || out["image"] != want {
		t.Fatalf("a refused promotion changed the service: %d %v", code, out)
	}

	// A process service runs no image.
	f.pushApp()
	if code, out := f.json("PUT", "/api/v1/projects/default/services/api", map[string]any{"bundle": "app", "command": []string{"./app"}}); code/100 != 2 {
		t.Fatalf("process service: %d %v", code, out)
	}
	f.recordPush("default/api", "v1", d1)
	if code, out := f.json("POST", "/api/v1/projects/default/services/api/releases/v1/promote", nil); code != 409 || out["code"] != "service_not_container" {
		t.Fatalf("promote a process service: %d %v", code, out)
	}
}

// TestApplyDeployOnPushResolvesTheTag: a deploy_on_push service names a tag of its project's
// repository; the apply stores the digest the tag names (the desired state always carries a
// digest) and the tag it follows, and refuses tags never pushed, other projects' repositories
// and a digest in place of the tag.
func TestApplyDeployOnPushResolvesTheTag(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d1 := "sha256:" + strings.Repeat("1b", 32)
	f.recordPush("shop/web", "main", d1)
	svc := "/api/v1/projects/shop/services/web"
	for _, image := range []string{"shop/web:main", "127.0.0.1:1/shop/web:main"} {
		code, out := f.json("PUT", svc, map[string]any{"runtime": "containerd", "image": image, "deploy_on_push": true})
		if code/100 != 2 || out["image"] != "127.0.0.1:1/shop/web@"+d1 || out["image_tag"] != "shop/web:main" || out["deploy_on_push"] != true || out["revision"] != float64(1) {
			t.Fatalf("apply image %s: %d %v", image, code, out)
		}
	}
	for _, tc := range []struct {
		image string
		code  int
		want  string
	}{
		{"shop/web:next", 404, "image_release_not_found"},
		{"other/web:main", 422, "validation_failed"},
		{"elsewhere.example/shop/web:main", 422, "validation_failed"},
		{"127.0.0.1:1/shop/web@" + d1, 422, "validation_failed"},
	} {
		if code, out := f.json("PUT", svc, map[string]any{"runtime": "containerd", "image": tc.image, "deploy_on_push": true}); code != tc.code || out["code"] != tc.want {
			t.Errorf("apply image %s: %d %v; want %d %s", tc.image, code, out, tc.code, tc.want)
		}
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/services/api", map[string]any{"bundle": "app", "command": []string{"./app"}, "deploy_on_push": true}); code != 422 {
		t.Errorf("deploy_on_push on a process service: %d %v", code, out)
	}
}
