package registry_test

import (
	"context"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
)

// TestDeployOnPushFollowsTheTag: a real push that moves shop/web:main rolls the service with
// deploy_on_push (one compare-and-set, the pusher in its change-log entry), leaves the one
// without it on its digest, and a repeat push or a push to another tag writes nothing.
func TestDeployOnPushFollowsTheTag(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, blobs.S3Config{})
	cat := services.NewCatalog(e.st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	p, _, err := cat.EnsureProject(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	dep := deploy.New(deploy.Config{Catalog: cat})
	e.mu.Lock()
	e.follow = registry.DeployOnPush(e.host, func(ctx context.Context, repoTag, image string) error {
		_, err := dep.FollowTag(ctx, repoTag, image)
		return err
	})
	e.mu.Unlock()
	ci, ciID := e.tokenID(t, "shop", "web", identity.ScopeServiceDeploy)
	imgs := make([]v1.Image, 3)
	digests := make([]string, 3)
	for i := range imgs {
		imgs[i], _ = random.Image(256, 2)
		d, _ := imgs[i].Digest()
		digests[i] = d.String()
	}
	push := func(tag string, img v1.Image) {
		t.Helper()
		if err := remote.Write(e.ref(t, "shop/web:"+tag), img, auth(ci)); err != nil {
			t.Fatalf("push %s: %v", tag, err)
		}
	}
	push("main", imgs[0])
	pinned := func(i int) string { return e.host + "/shop/web@" + digests[i] }
	for _, s := range []*services.Service{
		{Name: "web", Runtime: "containerd", Image: pinned(0), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080},
		{Name: "canary", Runtime: "containerd", Image: pinned(0), Replicas: 1, Port: 8080},
	} {
		if _, _, err := cat.ApplyService(ctx, p, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) *services.Service {
		t.Helper()
		s, err := cat.GetService(ctx, p, name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	push("main", imgs[1])
	web := get("web")
	if web.Image != pinned(1) || web.Revision != 2 {
		t.Fatalf("after the tag moved, web runs %s at revision %d; want %s at 2", web.Image, web.Revision, pinned(1))
	}
	if n := len(web.LogOutbox); n == 0 || web.LogOutbox[n-1].ActorID != ciID {
		t.Fatalf("the rollout's change-log entry is not the pusher's: %+v", web.LogOutbox)
	}
	if c := get("canary"); c.Image != pinned(0) || c.Revision != 1 {
		t.Fatalf("a service without deploy_on_push moved: %s at revision %d", c.Image, c.Revision)
	}
	rel, err := e.rel.Get(ctx, "shop/web", "main")
	if err != nil || rel.Digest != digests[1] {
		t.Fatalf("the push was not recorded: %+v %v", rel, err)
	}

	// The same digest again, and another tag, change nothing.
	push("main", imgs[1])
	push("next", imgs[2])
	if web := get("web"); web.Image != pinned(1) || web.Revision != 2 {
		t.Fatalf("a repeat or an unrelated push rolled web: %s at revision %d", web.Image, web.Revision)
	}

	// Turning deploy_on_push off leaves later pushes recorded only.
	off := *get("web")
	off.DeployOnPush, off.LogOutbox = false, nil
	if _, _, err := cat.ApplyService(ctx, p, &off, &off.Revision); err != nil {
		t.Fatal(err)
	}
	push("main", imgs[2])
	if web := get("web"); web.Image != pinned(1) || web.Revision != 3 {
		t.Fatalf("with deploy_on_push off, a push rolled web: %s at revision %d", web.Image, web.Revision)
	}
	if rel, _ := e.rel.Get(ctx, "shop/web", "main"); rel.Digest != digests[2] {
		t.Fatalf("with deploy_on_push off, the push was not recorded: %+v", rel)
	}
}
