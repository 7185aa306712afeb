package registry_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// followEnv is a registry under test with a service catalog, the project shop and a CI token
// of shop/web.
type followEnv struct {
	*env
	cat  *services.Catalog
	p    *services.Project
	ci   string
	ciID string
}

func newFollowEnv(t *testing.T) *followEnv {
	t.Helper()
	e := newEnv(t, blobs.S3Config{})
	cat := services.NewCatalog(e.st, nil)
	ctx := context.Background()
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	p, _, err := cat.EnsureProject(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	ci, ciID := e.tokenID(t, "shop", "web", identity.ScopeServiceDeploy)
	return &followEnv{env: e, cat: cat, p: p, ci: ci, ciID: ciID}
}

// catalogFollower is the follower berthd wires (core/server's tagFollower): the deployer's
// FollowTag, and the count of services that follow the tag.
func (f *followEnv) catalogFollower() registry.FollowerFunc {
	return func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		repoTag := req.Repository + ":" + req.Tag
		if _, err := deploy.New(deploy.Config{Catalog: f.cat, Runtime: rollout.NewStore(f.st, f.cat, nil)}).FollowTag(changelog.WithActor(ctx, req.Actor), repoTag, f.host+"/"+req.Repository+"@"+req.Digest); err != nil {
			return registry.FollowResult{}, err
		}
		return registry.FollowResult{Followers: f.followers(ctx, repoTag)}, nil
	}
}

func (f *followEnv) followers(ctx context.Context, repoTag string) int {
	svcs, err := f.cat.ListServices(ctx, f.p)
	if err != nil {
		return 0
	}
	n := 0
	for _, s := range svcs {
		if s.DeployOnPush && s.ImageTag == repoTag {
			n++
		}
	}
	return n
}

// startFollows starts a follow worker over the env's releases, wakes it for every push, and
// returns a function that stops it and waits until its Run returned (also run at cleanup).
func (f *followEnv) startFollows(t *testing.T, follower registry.Follower, retry operations.Policy) (stop func()) {
	t.Helper()
	w := registry.NewFollowWorker(registry.FollowWorkerConfig{Releases: f.rel, Follower: follower, Retry: retry})
	f.mu.Lock()
	f.follows = w
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			f.mu.Lock()
			if f.follows == w {
				f.follows = nil
			}
			f.mu.Unlock()
		})
	}
	t.Cleanup(stop)
	return stop
}

// images returns n random images and their digests.
func images(t *testing.T, n int) ([]v1.Image, []string) {
	t.Helper()
	imgs, digests := make([]v1.Image, n), make([]string, n)
	for i := range imgs {
		img, err := random.Image(256, 2)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		imgs[i], digests[i] = img, d.String()
	}
	return imgs, digests
}

// push writes img to shop/web:tag with the CI token, as crane push does; it fails the test
// unless the registry answered the manifest PUT 201.
func (f *followEnv) push(t *testing.T, tag string, img v1.Image) {
	t.Helper()
	if err := remote.Write(f.ref(t, "shop/web:"+tag), img, auth(f.ci)); err != nil {
		t.Fatalf("push shop/web:%s: %v", tag, err)
	}
}

// pushSettled pushes img to shop/web:tag with a worker of the catalog's follower running, and
// stops that worker once the push's follow settled: the starting point of a test that then
// runs a worker of its own.
func (f *followEnv) pushSettled(t *testing.T, tag string, img v1.Image) {
	t.Helper()
	stop := f.startFollows(t, f.catalogFollower(), fastRetry)
	defer stop()
	d, _ := img.Digest()
	f.push(t, tag, img)
	f.waitRelease(t, tag, "settled", func(r *registry.Release) bool {
		return r.Digest == d.String() && (r.Follow == nil || r.Follow.State != registry.FollowPending)
	})
}

func (f *followEnv) pinned(digest string) string { return f.host + "/shop/web@" + digest }

func (f *followEnv) service(t *testing.T, name string) *services.Service {
	t.Helper()
	s, err := f.cat.GetService(context.Background(), f.p, name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *followEnv) apply(t *testing.T, s *services.Service) {
	t.Helper()
	if _, _, err := f.cat.ApplyService(context.Background(), f.p, s, nil); err != nil {
		t.Fatal(err)
	}
}

// waitRelease waits (30 s at most) until the release shop/web:tag satisfies ok, and returns it.
func (f *followEnv) worker() *registry.FollowWorker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.follows
}

func (f *followEnv) waitRelease(t *testing.T, tag, what string, ok func(*registry.Release) bool) *registry.Release {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last *registry.Release
	for time.Now().Before(deadline) {
		rel, err := f.rel.Get(context.Background(), "shop/web", tag)
		if err == nil && ok(rel) {
			return rel
		}
		last = rel
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("release shop/web:%s never %s; last %+v (follow %+v)", tag, what, last, followOf(last))
	return nil
}

func followOf(r *registry.Release) *registry.ReleaseFollow {
	if r == nil {
		return nil
	}
	return r.Follow
}

// settled is the condition "the follow of digest reached state" (nil state: no follow).
func settled(digest string, state registry.FollowState) func(*registry.Release) bool {
	return func(r *registry.Release) bool {
		if r.Digest != digest {
			return false
		}
		if state == "" {
			return r.Follow == nil
		}
		return r.Follow != nil && r.Follow.Digest == digest && r.Follow.State == state
	}
}

var fastRetry = operations.Policy{BaseDelay: 10 * time.Millisecond, MaxDelay: 40 * time.Millisecond}

// TestDeployOnPushFollowsTheTag: a real push that moves shop/web:main rolls the service with
// deploy_on_push (one compare-and-set, the pusher in its change-log entry) and shows followed on
// the release; the service without it keeps its digest; a repeat push or a push to a tag no
// service follows writes nothing and leaves no follow on the release.
func TestDeployOnPushFollowsTheTag(t *testing.T) {
	f := newFollowEnv(t)
	f.startFollows(t, f.catalogFollower(), fastRetry)
	imgs, digests := images(t, 3)
	f.push(t, "main", imgs[0])
	f.waitRelease(t, "main", "left no follow (nothing followed it yet)", settled(digests[0], ""))
	f.apply(t, &services.Service{Name: "web", Runtime: "containerd", Image: f.pinned(digests[0]), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
	f.apply(t, &services.Service{Name: "canary", Runtime: "containerd", Image: f.pinned(digests[0]), Replicas: 1, Port: 8080})

	f.push(t, "main", imgs[1])
	f.waitRelease(t, "main", "followed", settled(digests[1], registry.FollowFollowed))
	web := f.service(t, "web")
	if web.Image != f.pinned(digests[1]) || web.Revision != 2 {
		t.Fatalf("after the tag moved, web runs %s at revision %d; want %s at 2", web.Image, web.Revision, f.pinned(digests[1]))
	}
	if n := len(web.LogOutbox); n == 0 || web.LogOutbox[n-1].ActorID != f.ciID {
		t.Fatalf("the rollout's change-log entry is not the pusher's: %+v", web.LogOutbox)
	}
	if c := f.service(t, "canary"); c.Image != f.pinned(digests[0]) || c.Revision != 1 {
		t.Fatalf("a service without deploy_on_push moved: %s at revision %d", c.Image, c.Revision)
	}

	// The same digest again, and another tag, change nothing.
	f.push(t, "main", imgs[1])
	f.push(t, "next", imgs[2])
	f.waitRelease(t, "next", "settled with no follower", settled(digests[2], ""))
	if web := f.service(t, "web"); web.Image != f.pinned(digests[1]) || web.Revision != 2 {
		t.Fatalf("a repeat or an unrelated push rolled web: %s at revision %d", web.Image, web.Revision)
	}

	// Turning deploy_on_push off leaves later pushes recorded only.
	off := *f.service(t, "web")
	off.DeployOnPush, off.LogOutbox = false, nil
	if _, _, err := f.cat.ApplyService(context.Background(), f.p, &off, &off.Revision); err != nil {
		t.Fatal(err)
	}
	f.push(t, "main", imgs[2])
	f.waitRelease(t, "main", "settled with no follower", settled(digests[2], ""))
	if web := f.service(t, "web"); web.Image != f.pinned(digests[1]) || web.Revision != 3 {
		t.Fatalf("with deploy_on_push off, a push rolled web: %s at revision %d", web.Image, web.Revision)
	}
}

// TestPushAnswers201WhenTheFollowFails: a follow that keeps failing does not fail the push
// (before, the push hook answered 503 and the client retried a push that had happened); the
// release shows failed with the error after the attempts, and the tag names the pushed digest.
func TestPushAnswers201WhenTheFollowFails(t *testing.T) {
	f := newFollowEnv(t)
	var calls atomic.Int32
	f.startFollows(t, registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		calls.Add(1)
		return registry.FollowResult{}, errors.New("services store unreachable")
	}), operations.Policy{BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 3})
	imgs, digests := images(t, 1)
	f.push(t, "main", imgs[0])
	rel := f.waitRelease(t, "main", "failed", settled(digests[0], registry.FollowFailed))
	if rel.Follow.Attempts != 3 || calls.Load() != 3 || !strings.Contains(rel.Follow.Reason, "services store unreachable") {
		t.Fatalf("failed follow: %+v after %d calls; want 3 attempts with the error as the reason", rel.Follow, calls.Load())
	}
	got, err := remote.Head(f.ref(t, "shop/web:main"), auth(f.ci))
	if err != nil || got.Digest.String() != digests[0] {
		t.Fatalf("the tag names %v (%v), want %s", got, err, digests[0])
	}
}

// TestDeployOnPushRefusedByPolicy: a policy bound to service.apply refuses the change a push to
// a followed tag asks for. The push itself succeeds, the release shows refused with the policy's
// reason (not retried), and the service keeps its image and revision.
func TestDeployOnPushRefusedByPolicy(t *testing.T) {
	f := newFollowEnv(t)
	ctx := context.Background()
	blobStore, err := bundles.New(filepath.Join(t.TempDir(), "bundles"), f.st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	eng := policy.New(policy.Config{Store: f.st, Blobs: blobStore, Runtime: rt})
	if err := eng.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := eng.PutModule(ctx, strings.NewReader(string(wasmtest.Policy(wasmtest.PolicyOptions{Name: "hold-pushes",
		Answer: `{"decision":"deny","reasons":["pushed images wait for review"]}`}))))
	if err != nil {
		t.Fatal(err)
	}
	imgs, digests := images(t, 2)
	f.apply(t, &services.Service{Name: "web", Runtime: "containerd", Image: f.pinned(digests[0]), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
	f.pushSettled(t, "main", imgs[0])
	if _, err := eng.Bind(ctx, policy.Binding{Hook: abiwasm.HookServiceApply, ModuleDigest: m.Digest}); err != nil {
		t.Fatal(err)
	}

	// The follower asks service.apply for each service it would roll, as core/deploy does for
	// the cause registry.push, and answers the engine's refusal as *policy.DeniedError.
	var calls atomic.Int32
	admitted := registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		calls.Add(1)
		svcs, err := f.cat.ListServices(ctx, f.p)
		if err != nil {
			return registry.FollowResult{}, err
		}
		for i := range svcs {
			s := svcs[i]
			if !s.DeployOnPush || s.ImageTag != req.Repository+":"+req.Tag {
				continue
			}
			next := s
			next.Image = f.pinned(req.Digest)
			v, err := eng.Admit(ctx, f.p.Name, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply,
				Object: policy.Raw(policy.ServiceObject(&next)), OldObject: policy.Raw(policy.ServiceObject(&s))})
			if err != nil {
				return registry.FollowResult{}, err
			}
			if !v.Allowed {
				return registry.FollowResult{}, fmt.Errorf("follow %s with %s: %w", req.Tag, s.Name, &policy.DeniedError{Hook: abiwasm.HookServiceApply, Reasons: v.Reasons})
			}
		}
		return f.catalogFollower()(ctx, req)
	})
	f.startFollows(t, admitted, fastRetry)

	f.push(t, "main", imgs[1])
	rel := f.waitRelease(t, "main", "refused", settled(digests[1], registry.FollowRefused))
	if rel.Follow.Reason != "policy: pushed images wait for review" || rel.Follow.Attempts != 0 {
		t.Fatalf("refused follow: %+v; want the policy's reason and no retry", rel.Follow)
	}
	if web := f.service(t, "web"); web.Image != f.pinned(digests[0]) || web.Revision != 1 {
		t.Fatalf("a refused follow rolled web: %s at revision %d", web.Image, web.Revision)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("a refusal was tried %d times; it is final", n)
	}
}

// TestFollowRetriedAfterTransientFailure: a follow whose first two attempts fail is retried with
// backoff and completes; the release shows followed and the service runs the pushed digest.
func TestFollowRetriedAfterTransientFailure(t *testing.T) {
	f := newFollowEnv(t)
	imgs, digests := images(t, 2)
	f.apply(t, &services.Service{Name: "web", Runtime: "containerd", Image: f.pinned(digests[0]), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
	f.pushSettled(t, "main", imgs[0])
	var calls atomic.Int32
	follow := f.catalogFollower()
	f.startFollows(t, registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		if calls.Add(1) <= 2 {
			return registry.FollowResult{}, fmt.Errorf("follow %s: %w", req.Tag, services.ErrRevisionConflict)
		}
		return follow(ctx, req)
	}), fastRetry)

	f.push(t, "main", imgs[1])
	rel := f.waitRelease(t, "main", "followed", settled(digests[1], registry.FollowFollowed))
	if rel.Follow.Attempts != 2 || calls.Load() != 3 {
		t.Fatalf("follow %+v after %d calls; want followed after 2 failed attempts", rel.Follow, calls.Load())
	}
	if web := f.service(t, "web"); web.Image != f.pinned(digests[1]) || web.Revision != 2 {
		t.Fatalf("web runs %s at revision %d; want %s at 2", web.Image, web.Revision, f.pinned(digests[1]))
	}
}

// TestFollowCompletesAfterRestart: the worker is stopped while it follows a push (its follower
// blocks before writing anything, as a berthd killed between the manifest and the follow), and a
// second push of the tag is recorded meanwhile. A new worker over the same store reads the
// pending follow at start and completes it with the newest digest only: the older push never
// rolls the service, and a repeated wake-up writes nothing more.
func TestFollowCompletesAfterRestart(t *testing.T) {
	f := newFollowEnv(t)
	imgs, digests := images(t, 3)
	f.apply(t, &services.Service{Name: "web", Runtime: "containerd", Image: f.pinned(digests[0]), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
	f.pushSettled(t, "main", imgs[0])

	entered := make(chan string, 1)
	stop := f.startFollows(t, registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		select {
		case entered <- req.Digest:
		default:
		}
		<-ctx.Done()
		return registry.FollowResult{}, ctx.Err()
	}), fastRetry)
	f.push(t, "main", imgs[1])
	select {
	case d := <-entered:
		if d != digests[1] {
			t.Fatalf("the first worker follows %s, want %s", d, digests[1])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first worker never started the follow")
	}
	f.push(t, "main", imgs[2]) // recorded while the first follow hangs
	stop()
	rel, err := f.rel.Get(context.Background(), "shop/web", "main")
	if err != nil || rel.Follow == nil || rel.Follow.State != registry.FollowPending || rel.Follow.Digest != digests[2] {
		t.Fatalf("after the stop the release is %+v (follow %+v, %v); want the newest follow pending", rel, followOf(rel), err)
	}
	if web := f.service(t, "web"); web.Revision != 1 {
		t.Fatalf("web moved before any follow completed: %s at revision %d", web.Image, web.Revision)
	}

	var calls atomic.Int32
	follow := f.catalogFollower()
	f.startFollows(t, registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		calls.Add(1)
		if req.Tag == "main" && req.Digest != digests[2] {
			t.Errorf("the restarted worker follows %s, want only the newest %s", req.Digest, digests[2])
		}
		return follow(ctx, req)
	}), fastRetry)
	f.waitRelease(t, "main", "followed", settled(digests[2], registry.FollowFollowed))
	web := f.service(t, "web")
	if web.Image != f.pinned(digests[2]) || web.Revision != 2 {
		t.Fatalf("after the restart web runs %s at revision %d; want %s at 2", web.Image, web.Revision, f.pinned(digests[2]))
	}
	// Delivered again (another wake-up of a settled release): nothing runs, nothing changes.
	f.worker().Notify("shop/web", "main")
	f.push(t, "main", imgs[2])
	f.push(t, "other", imgs[0])
	f.waitRelease(t, "other", "settled with no follower", settled(digests[0], ""))
	if n := calls.Load(); n != 2 {
		t.Fatalf("the follower ran %d times; want 2 (main once, other once)", n)
	}
	if web := f.service(t, "web"); web.Revision != 2 {
		t.Fatalf("a repeated delivery wrote web again: revision %d", web.Revision)
	}
}

// TestOlderFollowLandingLastIsCaughtUp: two workers (two berthd replicas on one store) follow
// two pushes of one tag; the older follow's service write lands after the newer one was
// followed and settled. The worker that wrote the older digest loses its outcome write, sees
// that the tag was followed at a newer digest, and follows that digest again, so the service
// ends on the newest push.
func TestOlderFollowLandingLastIsCaughtUp(t *testing.T) {
	f := newFollowEnv(t)
	imgs, digests := images(t, 3)
	f.apply(t, &services.Service{Name: "web", Runtime: "containerd", Image: f.pinned(digests[0]), ImageTag: "shop/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
	f.pushSettled(t, "main", imgs[0])

	follow := f.catalogFollower()
	entered, gate := make(chan struct{}), make(chan struct{})
	var slowCalls atomic.Int32
	f.startFollows(t, registry.FollowerFunc(func(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
		if slowCalls.Add(1) == 1 {
			close(entered)
			select {
			case <-gate:
			case <-ctx.Done():
				return registry.FollowResult{}, ctx.Err()
			}
		}
		return follow(ctx, req)
	}), fastRetry)
	f.push(t, "main", imgs[1])
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first worker never started the follow")
	}

	// The second replica records and follows the newer push while the first one hangs.
	f.startFollows(t, follow, fastRetry)
	f.push(t, "main", imgs[2])
	f.waitRelease(t, "main", "followed at the newer digest", settled(digests[2], registry.FollowFollowed))
	if web := f.service(t, "web"); web.Image != f.pinned(digests[2]) {
		t.Fatalf("the second worker left web at %s", web.Image)
	}

	close(gate) // the older follow now writes digest 1 over digest 2
	deadline := time.Now().Add(30 * time.Second)
	for {
		web := f.service(t, "web")
		if web.Image == f.pinned(digests[2]) && slowCalls.Load() >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("web runs %s at revision %d after the older follow landed (%d calls of the first worker); want %s", web.Image, web.Revision, slowCalls.Load(), f.pinned(digests[2]))
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.waitRelease(t, "main", "still followed at the newer digest", settled(digests[2], registry.FollowFollowed))
}
