package api

import (
	"context"
	"crypto/rand"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/registry"
)

// TestPromoteRefusesAReleaseRetentionRemoved pushes four releases of shop/web to a real
// registry, runs the service on the first and promotes the second (so the first is what the
// service ran before), and runs a retention pass that keeps one release by count and none by
// age. The pass keeps the current and the previous release's manifests (what rollout undo and
// an automatic rollback return to) and the newest, and removes the third's tag and manifest;
// promoting that third release is then refused 404 image_release_not_found, with the service
// unchanged, while promoting the kept first one still works. Before, the pass dropped the
// previous release, and the promotion answered 200 and pointed the service at a manifest no
// node could pull.
func TestPromoteRefusesAReleaseRetentionRemoved(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := newFixture(t)
	rel := f.api.cfg.ImageReleases
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	reg, err := registry.New(ctx, registry.Config{RootDir: t.TempDir(), Key: key, Tokens: f.api.cfg.Tokens,
		Authorize: rel.CheckPush, OnPush: rel.Record, TagDigest: rel.TagDigest})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	t.Cleanup(srv.Close)
	f.api.cfg.Manifests = reg
	host := strings.TrimPrefix(srv.URL, "http://")

	digests := map[string]string{}
	for _, tag := range []string{"v1", "v2", "v3", "v4"} {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(host+"/shop/web:"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: "berth", Password: f.admin})); err != nil {
			t.Fatalf("push %s: %v", tag, err)
		}
		d, _ := img.Digest()
		digests[tag] = d.String()
	}
	svc := "/api/v1/projects/shop/services/web"
	image := func(tag string) string { return "127.0.0.1:1/shop/web@" + digests[tag] }
	if code, out := f.json("PUT", svc, map[string]any{"runtime": "containerd", "image": image("v1")}); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	if code, out := f.json("POST", svc+"/releases/v2/promote", nil); code != 200 || out["image"] != image("v2") {
		t.Fatalf("promote v2: %d %v", code, out)
	}

	gc := registry.NewCollector(reg, rel, f.api.cfg.Catalog.ImagesInUse, registry.GCPolicy{
		KeepReleases: 1, ReleaseMinAge: -1, ManifestGrace: -1, BlobGrace: -1, MinUptime: -1})
	rep, err := gc.Collect(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	var gone []string
	for _, it := range rep.Deletions {
		gone = append(gone, it.Kind+" "+it.Tag+" "+it.Digest)
	}
	slices.Sort(gone)
	want := []string{"manifest  " + digests["v3"], "tag v3 " + digests["v3"]}
	if !slices.Equal(gone, want) || len(rep.Failures) > 0 {
		t.Fatalf("retention deleted %q (failures %q); want %q: the current (v2), previous (v1) and newest (v4) releases stay", gone, rep.Failures, want)
	}

	code, out := f.json("POST", svc+"/releases/v3/promote", nil)
	if code != 404 || out["code"] != "image_release_not_found" || !strings.Contains(out["detail"].(string), "retention") {
		t.Fatalf("promote the pruned v3: %d %v; want 404 image_release_not_found naming retention", code, out)
	}
	if code, out := f.json("GET", svc, nil); code != 200 || out["image"] != image("v2") || out["revision"] != float64(2) {
		t.Fatalf("the refused promotion changed the service: %d %v", code, out)
	}
	if code, out := f.json("POST", svc+"/releases/v1/promote", nil); code != 200 || out["image"] != image("v1") {
		t.Fatalf("promote the kept previous release v1: %d %v", code, out)
	}
}
