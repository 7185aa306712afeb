package deploy

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// Digests of the table test: the policy refuses any release whose reference holds mark.
var (
	mark   = "bad0bad0"
	marked = "sha256:" + strings.Repeat("bad0", 16)
	clean  = "sha256:" + strings.Repeat("0", 64)
	other  = "sha256:" + strings.Repeat("1", 64)
)

// env is a Deployer over the real embedded store, with a real policy engine (wazero), event log,
// secret store and release records.
type env struct {
	ctx      context.Context
	st       *store.Store
	cat      *services.Catalog
	eng      *policy.Engine
	ev       *events.Log
	sec      *secrets.Store
	rel      *registry.Releases
	rs       *rollout.Store
	dep      *Deployer
	moduleID string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(dir, "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	eng := policy.New(policy.Config{Store: st, Blobs: bs, Runtime: rt, Changelog: changelog.New(st, 1, nil)})
	if err := eng.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	ev := events.New(st, nil)
	if err := ev.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(dir, "keyring"), true)
	if err != nil {
		t.Fatal(err)
	}
	sec := secrets.NewStore(st, kr, nil)
	rel := registry.NewReleases(st, nil)
	rs := rollout.NewStore(st, cat, nil)
	e := &env{ctx: ctx, st: st, cat: cat, eng: eng, ev: ev, sec: sec, rel: rel, rs: rs}
	e.dep = New(Config{Catalog: cat, Runtime: rs, Bundles: bs, Secrets: sec, Policy: eng, Releases: rel, RegistryHost: "registry.test", Events: ev})
	m, err := eng.PutModule(ctx, strings.NewReader(string(wasmtest.BuildGo(t, "core/deploy/testdata/refuse-marked"))))
	if err != nil {
		t.Fatal(err)
	}
	e.moduleID = m.Digest
	return e
}

// project makes project name.
func (e *env) project(t *testing.T, name string) *services.Project {
	t.Helper()
	p, _, err := e.cat.EnsureProject(e.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// bind binds refuse-marked to service.apply of project p.
func (e *env) bind(t *testing.T, p *services.Project) {
	t.Helper()
	if _, err := e.eng.Bind(e.ctx, policy.Binding{Hook: "service.apply", ModuleDigest: e.moduleID, Project: p.Name, FailurePolicy: policy.Fail,
		Config: `{"mark":"` + mark + `"}`}); err != nil {
		t.Fatal(err)
	}
}

// put writes svc as service web of p (an edit, not a declaration: nothing is validated).
func (e *env) put(t *testing.T, p *services.Project, svc services.Service) *services.Service {
	t.Helper()
	res, err := e.dep.Apply(e.ctx, Change{Cause: CauseAPIPut, Project: p, Service: "web", MayTakeSecrets: true,
		Next: func(*services.Service) (*services.Service, error) { s := svc; return &s, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return res.Service
}

func image(p *services.Project, digest string) string {
	return "registry.test/" + p.Name + "/web@" + digest
}

// TestEveryCauseIsAdmitted: for each of the causes of a change to what a service runs, a
// bound service.apply policy that refuses a marked release refuses the change; the service is
// left as it was; the refusal is counted by cause and recorded as a deploy.refused event; and
// where no caller answers it (push, rollover, binding, automatic rollback) the service's verdict
// shows refused(policy: refuse-marked: ...). Before core/deploy, registry.push, secret.rollover,
// binding.publish, rollout.undo and rollout.auto_rollback wrote without asking the policy.
func TestEveryCauseIsAdmitted(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		cause Cause
		// setup writes the service before the policy is bound; change runs the cause.
		setup  func(t *testing.T, p *services.Project)
		change func(t *testing.T, p *services.Project) error
	}{
		{CauseAPIPut,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.Apply(e.ctx, Change{Cause: CauseAPIPut, Project: p, Service: "web",
					Spec: &client.ServiceSpec{Container: client.Container{Runtime: "containerd", Image: image(p, marked)}}})
				return err
			}},
		{CauseReleasePromote,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), Replicas: 1, Port: 8080})
				if err := e.rel.Record(e.ctx, registry.Push{Repository: p.Name + "/web", Reference: "v2", Digest: marked}); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, p *services.Project) error {
				img, err := e.dep.ReleaseImage(e.ctx, p.Name+"/web", "v2")
				if err != nil {
					t.Fatal(err)
				}
				_, err = e.dep.Promote(e.ctx, Change{Project: p, Service: "web"}, img)
				return err
			}},
		{CauseRegistryPush,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), ImageTag: p.Name + "/web:main", DeployOnPush: true, Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				out, err := e.dep.FollowTag(e.ctx, p.Name+"/web:main", image(p, marked))
				if len(out) != 0 {
					t.Errorf("FollowTag wrote %d services", len(out))
				}
				return err
			}},
		{CauseSecretRollover,
			func(t *testing.T, p *services.Project) {
				if _, _, err := e.sec.Put(e.ctx, p.ID, p.Name, "token", []byte("one"), "test"); err != nil {
					t.Fatal(err)
				}
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080,
					Secrets: map[string]secrets.Ref{"TOKEN": {Secret: "token"}}})
				if _, _, err := e.sec.Put(e.ctx, p.ID, p.Name, "token", []byte("two"), "test"); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.RollSecrets(e.ctx, p, "web")
				return err
			}},
		{CauseBindingPublish,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
				cur, err := e.cat.GetService(e.ctx, p, "web")
				if err != nil {
					t.Fatal(err)
				}
				next := *cur
				next.Bindings = append(next.Bindings, bindings.Spec{Name: "db", Kind: "postgres"})
				e.put(t, p, next)
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.PublishBinding(e.ctx, p, "web", "db", map[string]secrets.Ref{"DATABASE_URL": {Secret: "web-db", Version: 1}}, nil)
				return err
			}},
		{CauseRolloutUndo,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, other), Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.Undo(e.ctx, Change{Project: p, Service: "web"})
				return err
			}},
		{CauseAutoRollback,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, other), Replicas: 1, Port: 8080, AutoRollback: true})
			},
			func(t *testing.T, p *services.Project) error {
				cur, err := e.cat.GetService(e.ctx, p, "web")
				if err != nil {
					t.Fatal(err)
				}
				_, err = e.dep.RollBack(e.ctx, cur)
				return err
			}},
		{CauseRolloutRebalance,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 2, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.Rebalance(e.ctx, Change{Project: p, Service: "web"}, []services.RebalanceMove{{Replica: "1", From: "nod_a", To: "nod_b"}})
				return err
			}},
		{CauseRolloutPause,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.ControlRollout(e.ctx, Change{Project: p, Service: "web"}, services.RolloutPause)
				return err
			}},
		{CauseRolloutResume,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
				if _, err := e.dep.ControlRollout(e.ctx, Change{Project: p, Service: "web"}, services.RolloutPause); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.ControlRollout(e.ctx, Change{Project: p, Service: "web"}, services.RolloutResume)
				return err
			}},
		{CauseRolloutRestart,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.ControlRollout(e.ctx, Change{Project: p, Service: "web"}, services.RolloutRestart)
				return err
			}},
		{CauseJobControl,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Kind: services.KindJob, Runtime: "containerd", Image: image(p, marked), Replicas: 0,
					Job: &services.JobSettings{Schedule: "@hourly", Concurrency: services.ConcurrencyForbid}})
			},
			func(t *testing.T, p *services.Project) error {
				_, err := e.dep.SuspendJob(e.ctx, Change{Project: p, Service: "web"}, true)
				return err
			}},
		{CauseJobCommand,
			func(t *testing.T, p *services.Project) {
				e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, marked), Replicas: 1, Port: 8080})
			},
			func(t *testing.T, p *services.Project) error {
				_, _, err := e.dep.AdmitCommand(e.ctx, Change{Project: p, Service: "web"}, []string{"./migrate"})
				return err
			}},
	}
	for _, tc := range cases {
		t.Run(string(tc.cause), func(t *testing.T) {
			p := e.project(t, strings.NewReplacer(".", "-", "_", "-").Replace(string(tc.cause)))
			tc.setup(t, p)
			before, err := e.cat.GetService(e.ctx, p, "web")
			if err != nil {
				t.Fatal(err)
			}
			e.bind(t, p)

			err = tc.change(t, p)
			var de *policy.DeniedError
			if !errors.As(err, &de) {
				t.Fatalf("%s: err = %v, want a policy refusal", tc.cause, err)
			}
			after, err := e.cat.GetService(e.ctx, p, "web")
			if err != nil {
				t.Fatal(err)
			}
			if after.Revision != before.Revision || after.Image != before.Image || len(after.ResolvedSecrets) != len(before.ResolvedSecrets) ||
				after.RolloutPaused != before.RolloutPaused || after.RestartGeneration != before.RestartGeneration ||
				(after.Job != nil && before.Job != nil && after.Job.Suspended != before.Job.Suspended) ||
				after.ResolvedSecrets["TOKEN"] != before.ResolvedSecrets["TOKEN"] || len(after.Secrets) != len(before.Secrets) {
				t.Fatalf("%s: the service changed: revision %d -> %d, image %s -> %s, secrets %v -> %v", tc.cause,
					before.Revision, after.Revision, before.Image, after.Image, before.ResolvedSecrets, after.ResolvedSecrets)
			}
			if n := testutil.ToFloat64(e.dep.refusals.WithLabelValues(string(tc.cause))); n != 1 {
				t.Errorf("%s: berth_deploy_refusals_total = %v, want 1", tc.cause, n)
			}
			recs, err := e.ev.List(e.ctx, 0, TypeDeployRefused, 1000)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, r := range recs {
				if r.Event.Data["cause"] == string(tc.cause) && r.Event.ProjectID == p.ID {
					reason, _ := r.Event.Data["reason"].(string)
					found = found || strings.Contains(reason, "is marked refused")
				}
			}
			if !found {
				t.Errorf("%s: no deploy.refused event with the policy's reason", tc.cause)
			}
			// The verdict as GET .../services/{s} and GET .../rollout (berth rollout status) show it.
			views := rollout.Views{Store: e.rs, Catalog: e.cat}
			vd, err := views.VerdictOf(e.ctx, after)
			if err != nil {
				t.Fatal(err)
			}
			st, err := views.Rollout(e.ctx, after)
			if err != nil {
				t.Fatal(err)
			}
			refused := vd != nil && vd.State == string(slots.Refused)
			want := "refused(policy: refuse-marked: release " + image(p, marked) + " is marked refused)"
			if Unattended(tc.cause) {
				if !refused || vd.String() != want || st.Verdict.String() != want || st.Verdict.SpecRevision != st.SpecRevision {
					t.Errorf("%s: verdict %+v, rollout status verdict %+v (spec %d); want %s", tc.cause, vd, st.Verdict, st.SpecRevision, want)
				}
			} else if refused || st.Verdict.State == string(slots.Refused) {
				t.Errorf("%s: verdict %+v: an answered refusal is not the service's verdict", tc.cause, vd)
			}
			// An admitted write of the service ends what the refusal shows.
			fixed := e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), Replicas: 1, Port: 8080})
			if vd, err := views.VerdictOf(e.ctx, fixed); err != nil || vd == nil || vd.State == string(slots.Refused) {
				t.Errorf("%s: after an admitted write the verdict is %+v, %v", tc.cause, vd, err)
			}
		})
	}
}

// TestConflictRetriedOnlyWithoutExpectedRevision: a write lost to a concurrent one runs the
// chain again on the new revision when the caller gave no expected revision, and is answered
// revision_conflict (the chain run once) when it did.
func TestConflictRetriedOnlyWithoutExpectedRevision(t *testing.T) {
	e := newEnv(t)
	p := e.project(t, "shop")
	for _, withExpected := range []bool{false, true} {
		cur := e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), Replicas: 1, Port: 8080})
		runs := 0
		ch := Change{Cause: CauseReleasePromote, Project: p, Service: "web",
			Next: func(c *services.Service) (*services.Service, error) {
				runs++
				if runs == 1 {
					// Another writer wins between this read and the write.
					other := *c
					other.Replicas, other.LogOutbox = c.Replicas+1, nil
					if _, _, err := e.cat.ApplyService(e.ctx, p, &other, &c.Revision); err != nil {
						t.Fatal(err)
					}
				}
				next := *c
				next.Image, next.LogOutbox = image(p, other), nil
				return &next, nil
			}}
		if withExpected {
			ch.ExpectedRevision = &cur.Revision
		}
		res, err := e.dep.Apply(e.ctx, ch)
		switch {
		case withExpected && (!errors.Is(err, services.ErrRevisionConflict) || runs != 1):
			t.Fatalf("with an expected revision: %v after %d runs, want a conflict after 1", err, runs)
		case !withExpected && (err != nil || runs != 2 || res.Service.Image != image(p, other) || res.Service.Replicas != cur.Replicas+1):
			t.Fatalf("without: %+v, %v after %d runs; want the image written over the concurrent change after 2", res.Service, err, runs)
		}
	}
}

// TestAdmitCommandNeedsSecretUse: a one-off command in the environment of a service that takes
// secrets could read them, so admitting it needs an actor that may take them; the policies are
// not asked before, and nothing is written either way.
func TestAdmitCommandNeedsSecretUse(t *testing.T) {
	e := newEnv(t)
	p := e.project(t, "cmd-secrets")
	if _, _, err := e.sec.Put(e.ctx, p.ID, p.Name, "token", []byte("one"), "test"); err != nil {
		t.Fatal(err)
	}
	before := e.put(t, p, services.Service{Runtime: "containerd", Image: image(p, clean), Replicas: 1, Port: 8080,
		Secrets: map[string]secrets.Ref{"TOKEN": {Secret: "token"}}})
	_, _, err := e.dep.AdmitCommand(e.ctx, Change{Project: p, Service: "web"}, []string{"env"})
	if abierrors.CodeOf(err) != abierrors.SecretUseForbidden {
		t.Fatalf("without secret:use: %v, want secret_use_forbidden", err)
	}
	svc, _, err := e.dep.AdmitCommand(e.ctx, Change{Project: p, Service: "web", MayTakeSecrets: true}, []string{"env"})
	if err != nil || svc.Revision != before.Revision || len(svc.Command) != 0 {
		t.Fatalf("with secret:use: %+v %v; want the stored service, unchanged", svc, err)
	}
}
