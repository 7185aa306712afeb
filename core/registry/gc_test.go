package registry_test

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/registry"
)

// testClock is a settable clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// TestGCKeepsWhatIsUsedAndCollectsTheRest pushes five releases of shop/web a
// day apart and two untagged images, then, a month later, runs the
// retention: what a service runs (the oldest release), the three newest
// releases, and an untagged image a client just found present stay; the
// fourth release's tag and manifest go in a first pass, the forgotten
// untagged manifest with them, and their blobs in a second pass; a dry run
// before each deletes nothing and lists the same thing. Young content keeps
// everything, and a registry up for less than its minimum uptime no blob.
func TestGCKeepsWhatIsUsedAndCollectsTheRest(t *testing.T) {
	for name, s3 := range backends(t) {
		t.Run(name, func(t *testing.T) { testGC(t, s3) })
	}
}

func testGC(t *testing.T, s3 blobs.S3Config) {
	ctx := context.Background()
	t0 := time.Now().UTC()
	clk := &testClock{t: t0}
	e := newEnvAt(t, s3, clk.Now)
	tok := e.token(t, "shop", "", identity.ScopeServiceDeploy, identity.ScopeServicesRead)
	imgs := map[string]v1.Image{}
	digests := map[string]string{}
	push := func(label, ref string) {
		t.Helper()
		img, err := random.Image(512, 2)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		imgs[label], digests[label] = img, d.String()
		if ref == "" {
			ref = "shop/web@" + d.String()
		}
		if err := remote.Write(e.ref(t, ref), img, auth(tok)); err != nil {
			t.Fatalf("push %s: %v", ref, err)
		}
	}
	for i, tag := range []string{"v1", "v2", "v3", "v4", "v5"} {
		clk.Set(t0.Add(time.Duration(i) * 24 * time.Hour))
		push(tag, "shop/web:"+tag)
	}
	push("orphan", "")
	push("found", "")
	running := e.host + "/shop/web@" + digests["v1"]
	gc := registry.NewCollector(e.reg, e.rel, func(context.Context) ([]string, error) { return []string{running}, nil }, registry.GCPolicy{})

	// Everything is young (and, for a registry that has served for less than
	// its minimum uptime, no blob is judged): nothing goes.
	clk.Set(t0.Add(4*24*time.Hour + 10*time.Minute))
	young := registry.NewCollector(e.reg, e.rel, func(context.Context) ([]string, error) { return []string{running}, nil },
		registry.GCPolicy{MinUptime: 30 * 24 * time.Hour})
	rep, err := young.Collect(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Deletions) != 0 || !strings.Contains(rep.BlobsSkipped, "less than") {
		t.Fatalf("pass over young content = %+v; want no deletion and blobs skipped for uptime", rep)
	}

	// A month later, a client finds the "found" image present (and would
	// push a manifest naming it next): it stays.
	clk.Set(t0.Add(30 * 24 * time.Hour))
	if _, err := remote.Head(e.ref(t, "shop/web@"+digests["found"]), auth(tok)); err != nil {
		t.Fatal(err)
	}
	wantFirst := []string{"manifest shop/web " + digests["orphan"], "manifest shop/web " + digests["v2"], "tag shop/web:v2 " + digests["v2"]}
	sort.Strings(wantFirst)
	for _, dry := range []bool{true, false} {
		rep, err = gc.Collect(ctx, dry)
		if err != nil {
			t.Fatal(err)
		}
		if got := items(rep); strings.Join(got, "\n") != strings.Join(wantFirst, "\n") || !rep.Remaining || len(rep.Failures) > 0 {
			t.Fatalf("first pass (dry run %v): %q, remaining %v, failures %v; want %q", dry, got, rep.Remaining, rep.Failures, wantFirst)
		}
		_, err := remote.Head(e.ref(t, "shop/web:v2"), auth(tok))
		if gone := err != nil; gone == dry {
			t.Fatalf("after the first pass (dry run %v) shop/web:v2 answers %v", dry, err)
		}
	}
	for _, label := range []string{"v2", "orphan"} {
		if _, err := remote.Head(e.ref(t, "shop/web@"+digests[label]), auth(tok)); err == nil {
			t.Errorf("manifest of %s still served after the first pass", label)
		}
	}

	// The second pass collects the blobs only those two manifests held.
	var wantBlobs []string
	for _, label := range []string{"v2", "orphan"} {
		for _, d := range blobDigests(t, imgs[label]) {
			wantBlobs = append(wantBlobs, "blob "+d)
		}
	}
	sort.Strings(wantBlobs)
	for _, dry := range []bool{true, false} {
		rep, err = gc.Collect(ctx, dry)
		if err != nil {
			t.Fatal(err)
		}
		if got := items(rep); strings.Join(got, "\n") != strings.Join(wantBlobs, "\n") || rep.Remaining {
			t.Fatalf("second pass (dry run %v): %q (remaining %v, skipped %q); want %q", dry, got, rep.Remaining, rep.BlobsSkipped, wantBlobs)
		}
	}
	rep, err = gc.Collect(ctx, false)
	if err != nil || len(rep.Deletions) != 0 {
		t.Fatalf("third pass: %+v %v; want nothing left to delete", rep, err)
	}
	// What was kept is whole: every layer of it still reads.
	for _, label := range []string{"v1", "v3", "v4", "v5", "found"} {
		img, err := remote.Image(e.ref(t, "shop/web@"+digests[label]), auth(tok))
		if err != nil {
			t.Fatalf("pull %s after the passes: %v", label, err)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("layer of %s after the passes: %v", label, err)
			}
			_ = rc.Close()
		}
	}
}

// items lists a report's deletions as "kind repo[:tag] digest", sorted.
func items(rep *registry.GCReport) []string {
	out := []string{}
	for _, it := range rep.Deletions {
		switch it.Kind {
		case "tag":
			out = append(out, "tag "+it.Repository+":"+it.Tag+" "+it.Digest)
		case "manifest":
			out = append(out, "manifest "+it.Repository+" "+it.Digest)
		default:
			out = append(out, it.Kind+" "+it.Digest)
		}
	}
	sort.Strings(out)
	return out
}

// blobDigests returns the digests of img's config and layers.
func blobDigests(t *testing.T, img v1.Image) []string {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{m.Config.Digest.String()}
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}
