package resources_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/resources"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/examples/provider-accounts/accounts"
	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/host/plugin"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type env struct {
	m     *resources.Manager
	q     *operations.Queue
	st    *store.Store
	sec   *secrets.Store
	clk   *clock
	state string // the hello provider's state directory
	users string // the accounts provider's state directory
	admit func(next, old *resources.Resource) error
}

func newEnv(t testing.TB) *env { t.Helper(); return newEnvWrapped(t, nil) }

// newEnvWrapped is newEnv with the hello provider served through wrap (nil: as it is).
func newEnvWrapped(t testing.TB, wrap func(*hello.Provider) provider.Provider) *env {
	t.Helper()
	st := storetest.Open(t)
	e := &env{st: st, clk: &clock{t: time.Now().UTC().Truncate(time.Millisecond)}, state: t.TempDir(), users: t.TempDir()}
	p, err := hello.New(e.state)
	if err != nil {
		t.Fatal(err)
	}
	desc, _ := p.Describe(context.Background())
	types := plugin.NewTypes()
	var served provider.Provider = p
	if wrap != nil {
		served = wrap(p)
	}
	if err := types.Add("hello", "", served, desc.Capabilities.ResourceTypes); err != nil {
		t.Fatal(err)
	}
	a, err := accounts.New(e.users)
	if err != nil {
		t.Fatal(err)
	}
	desc, _ = a.Describe(context.Background())
	if err := types.Add("accounts", "", a, desc.Capabilities.ResourceTypes); err != nil {
		t.Fatal(err)
	}
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keyring.json"), true)
	if err != nil {
		t.Fatal(err)
	}
	e.sec = secrets.NewStore(st, kr, e.clk.now)
	e.q = operations.NewQueue(st, operations.Config{Now: e.clk.now})
	e.m = resources.New(resources.Config{Store: st, Queue: e.q, Types: types, Secrets: e.sec, Now: e.clk.now, DriftInterval: time.Minute,
		Admit: func(_ context.Context, next, old *resources.Resource) error {
			if e.admit != nil {
				return e.admit(next, old)
			}
			return nil
		}})
	return e
}

func decl(name, spec string) resources.Declaration {
	return resources.Declaration{Type: hello.ResourceType, Name: name, Spec: json.RawMessage(spec)}
}

// work runs the queue until it is empty (bounded).
func (e *env) work(t *testing.T) {
	t.Helper()
	for range 20 {
		n, err := e.m.Work(context.Background(), 16)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	t.Fatal("the queue did not empty in 20 rounds")
}

func (e *env) get(t *testing.T, name string) *resources.Resource {
	t.Helper()
	r, err := e.m.Get(context.Background(), hello.ResourceType, name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (e *env) file(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.state, "greetings", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestApplyPlanDriftDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	// A new resource: plan shows every field added; nothing is stored.
	pl, err := e.m.Plan(ctx, "prj_a", "a", decl("w1", `{"message":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !pl.Changes || strings.Join(pl.Diff, "|") != `+ message: "hi"` {
		t.Fatalf("plan of a new resource: %+v", pl)
	}
	if _, err := e.m.Get(ctx, hello.ResourceType, "w1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("plan stored something: %v", err)
	}

	r, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Generation != 1 || r.Status != resources.StatusProgressing || r.OperationID == "" {
		t.Fatalf("after apply: %+v", r)
	}
	e.work(t)
	if r = e.get(t, "w1"); r.Status != resources.StatusReady || r.AppliedGeneration != 1 {
		t.Fatalf("after work: %+v", r)
	}
	if got := e.file(t, "w1"); got != `{"message":"hi"}` {
		t.Fatalf("provider state %s", got)
	}
	// The same declaration again is no new generation.
	if r, _ = e.m.Apply(ctx, "prj_a", "a", decl("w1", `{ "message": "hi" }`)); r.Generation != 1 {
		t.Fatalf("unchanged apply rolled generation %d", r.Generation)
	}

	// A change: the plan shows it, the apply rolls generation 2 under its own key.
	if pl, err = e.m.Plan(ctx, "prj_a", "a", decl("w1", `{"message":"hey","loud":true}`)); err != nil {
		t.Fatal(err)
	}
	if want := `+ loud: true|~ message: "hi" -> "HEY"`; strings.Join(pl.Diff, "|") != want {
		t.Fatalf("diff %q, want %q", pl.Diff, want)
	}
	r, _ = e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"hey","loud":true}`))
	e.work(t)
	op, err := e.q.Get(ctx, r.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	if r = e.get(t, "w1"); r.Generation != 2 || r.Status != resources.StatusReady || op.IdempotencyKey != resources.OpKey(resources.KindApply, hello.ResourceType, "w1", 2) {
		t.Fatalf("generation 2: %+v, key %s", r, op.IdempotencyKey)
	}

	// Changed behind Berth's back: the drift pass reports it and changes nothing (on_drift report).
	if err := os.WriteFile(filepath.Join(e.state, "greetings", "w1.json"), []byte(`{"message":"TAMPERED","loud":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.m.DriftPass(ctx); n != 0 {
		t.Fatalf("a resource read before its interval: %d reads", n)
	}
	e.clk.add(2 * time.Minute)
	if n, err := e.m.DriftPass(ctx); err != nil || n != 1 {
		t.Fatalf("drift pass: %d, %v", n, err)
	}
	if r = e.get(t, "w1"); r.Status != resources.StatusDrifted || !strings.Contains(r.Reason, `~ message: "HEY" -> "TAMPERED"`) {
		t.Fatalf("after tampering: %+v", r)
	}
	e.work(t)
	if got := e.file(t, "w1"); !strings.Contains(got, "TAMPERED") {
		t.Fatalf("on_drift report changed the resource: %s", got)
	}

	// With on_drift: reconcile (itself a new generation) the spec is put back.
	d := decl("w1", `{"message":"hey","loud":true}`)
	d.OnDrift = resources.OnDriftReconcile
	if _, err := e.m.Apply(ctx, "prj_a", "a", d); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	if got := e.file(t, "w1"); got != `{"message":"HEY","loud":true}` {
		t.Fatalf("reconcile apply: %s", got)
	}
	_ = os.WriteFile(filepath.Join(e.state, "greetings", "w1.json"), []byte(`{"message":"AGAIN"}`), 0o600)
	e.clk.add(2 * time.Minute)
	if _, err := e.m.DriftPass(ctx); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	if r = e.get(t, "w1"); r.Status != resources.StatusReady || r.Drifts != 2 || e.file(t, "w1") != `{"message":"HEY","loud":true}` {
		t.Fatalf("after reconcile: %+v, file %s", r, e.file(t, "w1"))
	}

	// Delete removes it from the provider and from the store.
	if _, err := e.m.Delete(ctx, "prj_a", hello.ResourceType, "w1", false); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	if _, err := e.m.Get(ctx, hello.ResourceType, "w1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.state, "greetings", "w1.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("provider still has it: %v", err)
	}
}

func TestApplyRefusesBeforeStoring(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []struct {
		d    resources.Declaration
		want string
	}{
		{decl("w2", `{"message":"hi","loud":"yes"}`), "spec/loud"},
		{decl("w2", `{"message":"hi","colour":"red"}`), "spec: "},
		{decl("w2", `["not an object"]`), "spec: must be a JSON object"},
		{decl("W 2", `{"message":"hi"}`), "name: "},
		{resources.Declaration{Type: "acme.widget", Name: "w2", Spec: json.RawMessage(`{}`)}, `type: no provider plugin`},
	} {
		_, err := e.m.Apply(ctx, "prj_a", "a", c.d)
		if abierrors.CodeOf(err) != abierrors.ValidationFailed || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: got %v, want validation_failed naming %q", c.d.Name, c.d.Spec, err, c.want)
		}
	}
	e.admit = func(next, _ *resources.Resource) error {
		if strings.Contains(next.Spec, "forbidden") {
			return abierrors.New(abierrors.PolicyDenied, "no forbidden greetings")
		}
		return nil
	}
	if _, err := e.m.Apply(ctx, "prj_a", "a", decl("w2", `{"message":"forbidden"}`)); abierrors.CodeOf(err) != abierrors.PolicyDenied {
		t.Fatalf("admission: %v", err)
	}
	if _, err := e.m.Get(ctx, hello.ResourceType, "w2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused resource was stored: %v", err)
	}
	if all, _ := e.m.List(ctx, ""); len(all) != 0 {
		t.Fatalf("stored %d resources", len(all))
	}
	// A name is its type's: another project cannot take it.
	if _, err := e.m.Apply(ctx, "prj_a", "a", decl("w3", `{"message":"mine"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Apply(ctx, "prj_b", "b", decl("w3", `{"message":"theirs"}`)); abierrors.CodeOf(err) != abierrors.Conflict {
		t.Fatalf("another project's name: %v", err)
	}
}

var _ provider.Provider = (*hello.Provider)(nil)
