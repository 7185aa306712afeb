package resources_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/resources"
	"github.com/berthhq/berth/examples/provider-accounts/accounts"
	"github.com/berthhq/berth/examples/provider-hello/hello"
)

// storeHolds reports the collections of the store whose documents hold s.
func (e *env) storeHolds(t *testing.T, s string) []string {
	t.Helper()
	var found []string
	for _, coll := range []string{resources.Collection, operations.Collection, operations.ArchiveCollection, operations.KeysCollection} {
		var docs []map[string]any
		if err := e.st.All(context.Background(), coll, &docs); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(docs)
		if strings.Contains(string(raw), s) {
			found = append(found, coll)
		}
	}
	return found
}

// TestSecretReferences: a spec's "secret:NAME" is refused at apply when the secret is missing
// (naming field and secret), opened only for the provider, masked in the applied state, the
// plan and the drift difference, and never stored; the same value reads as no drift, a new
// version of the secret reads as drift.
func TestSecretReferences(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const value = "zq9-leak-mark"

	_, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"secret:greeting"}`))
	if abierrors.CodeOf(err) != abierrors.ValidationFailed || !strings.Contains(err.Error(), "spec/message") || !strings.Contains(err.Error(), "secret greeting") {
		t.Fatalf("a missing secret: %v", err)
	}
	for _, bad := range []string{`{"message":"secret:other/greeting"}`, `{"message":"secret:"}`} {
		if _, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", bad)); abierrors.CodeOf(err) != abierrors.ValidationFailed || !strings.Contains(err.Error(), "spec/message") {
			t.Fatalf("%s: %v", bad, err)
		}
	}
	if _, _, err := e.sec.Put(ctx, "prj_a", "a", "greeting", []byte(value), "test"); err != nil {
		t.Fatal(err)
	}
	pl, err := e.m.Plan(ctx, "prj_a", "a", decl("w1", `{"message":"secret:greeting"}`))
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := json.Marshal(pl); strings.Contains(string(raw), value) || strings.Join(pl.Diff, "|") != `+ message: "secret:greeting"` {
		t.Fatalf("plan: %s", raw)
	}
	if _, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"secret:greeting"}`)); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	r := e.get(t, "w1")
	if r.Status != resources.StatusReady || r.Spec != `{"message":"secret:greeting"}` || r.Applied != `{"message":"secret:greeting"}` {
		t.Fatalf("applied: %+v", r)
	}
	if got := e.file(t, "w1"); got != `{"message":"`+value+`"}` {
		t.Fatalf("the provider received %s", got)
	}
	// Read back the same: no drift.
	e.clk.add(2 * time.Minute)
	if n, err := e.m.DriftPass(ctx); err != nil || n != 1 {
		t.Fatalf("drift pass: %d %v", n, err)
	}
	if r = e.get(t, "w1"); r.Status != resources.StatusReady {
		t.Fatalf("the secret's own value read as drift: %+v", r)
	}
	// A new version of the secret: what the provider holds differs from it, shown masked.
	if _, _, err := e.sec.Put(ctx, "prj_a", "a", "greeting", []byte(value+"-v2"), "test"); err != nil {
		t.Fatal(err)
	}
	e.clk.add(2 * time.Minute)
	if _, err := e.m.DriftPass(ctx); err != nil {
		t.Fatal(err)
	}
	if r = e.get(t, "w1"); r.Status != resources.StatusDrifted || !strings.Contains(r.Reason, `"secret:greeting" -> "secret:greeting (differs, hmac-sha256:`) {
		t.Fatalf("after a new version: %+v", r)
	}
	// Applying again sends the new value; loud makes the provider's state differ from the
	// value, masked all the same and stable across reads.
	if _, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"secret:greeting","loud":true}`)); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	if got := e.file(t, "w1"); got != `{"message":"`+strings.ToUpper(value+"-v2")+`","loud":true}` {
		t.Fatalf("the provider received %s", got)
	}
	e.clk.add(2 * time.Minute)
	if _, err := e.m.DriftPass(ctx); err != nil {
		t.Fatal(err)
	}
	if r = e.get(t, "w1"); r.Status != resources.StatusReady || !strings.Contains(r.Applied, "secret:greeting (differs") {
		t.Fatalf("loud: %+v", r)
	}
	for _, v := range []string{value, strings.ToUpper(value)} {
		if where := e.storeHolds(t, v); len(where) > 0 {
			t.Fatalf("the store holds a secret value in %v", where)
		}
	}
}

// TestOutputsPublishedAsSecrets: an Apply's outputs become versions of project secrets named
// res-<type>-<name>-<key>, a replayed or unchanged apply adds no version, and the outputs'
// values are stored only sealed.
func TestOutputsPublishedAsSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, _, err := e.sec.Put(ctx, "prj_a", "a", "alice-pw", []byte("pw-mark-1"), "test"); err != nil {
		t.Fatal(err)
	}
	d := resources.Declaration{Type: accounts.ResourceType, Name: "alice", Spec: json.RawMessage(`{"login":"alice","password":"secret:alice-pw"}`)}
	if _, err := e.m.Apply(ctx, "prj_a", "a", d); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	r, err := e.m.Get(ctx, accounts.ResourceType, "alice")
	if err != nil {
		t.Fatal(err)
	}
	name := resources.OutputSecretName(accounts.ResourceType, "alice", "TOKEN")
	if name != "res-accounts-user-alice-token" || r.Status != resources.StatusReady || r.Outputs["TOKEN"].Secret != name || r.Outputs["TOKEN"].Version != 1 {
		t.Fatalf("outputs: %+v", r)
	}
	token := accounts.Token(accounts.User{Login: "alice", Password: "pw-mark-1"})
	sec, v, err := e.sec.Resolve(ctx, "prj_a", name, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := e.sec.Open(sec, v); string(got) != token {
		t.Fatalf("published %q, want the token", got)
	}
	// A new password: a new generation, a new token, a new version.
	if _, _, err := e.sec.Put(ctx, "prj_a", "a", "alice-pw", []byte("pw-mark-2"), "test"); err != nil {
		t.Fatal(err)
	}
	d.Spec = json.RawMessage(`{"groups":["ops"],"login":"alice","password":"secret:alice-pw"}`)
	if _, err := e.m.Apply(ctx, "prj_a", "a", d); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	if r, _ = e.m.Get(ctx, accounts.ResourceType, "alice"); r.Outputs["TOKEN"].Version != 2 {
		t.Fatalf("after a new password: %+v", r)
	}
	raw, _ := os.ReadFile(filepath.Join(e.users, "users", "alice.json"))
	if !strings.Contains(string(raw), "pw-mark-2") {
		t.Fatalf("the provider holds %s", raw)
	}
	for _, v := range []string{"pw-mark-1", "pw-mark-2", token, accounts.Token(accounts.User{Login: "alice", Password: "pw-mark-2"})} {
		if where := e.storeHolds(t, v); len(where) > 0 {
			t.Fatalf("the store holds a secret value in %v", where)
		}
	}
}

// leaky is the hello provider with an Apply that fails quoting what it was asked to store, the
// way a careless provider's error might.
type leaky struct{ *hello.Provider }

func (l leaky) Apply(_ context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return nil, abierrors.New(abierrors.Unavailable, "cannot store "+string(req.Planned.Attributes))
}

// TestProviderErrorsAreMasked: a provider's error quoting a secret value is recorded (the
// resource's message, the operation's last error, the failure event) with the value masked.
func TestProviderErrorsAreMasked(t *testing.T) {
	t.Parallel()
	e := newEnvWrapped(t, func(p *hello.Provider) provider.Provider { return leaky{p} })
	ctx := context.Background()
	const value = "zq9-error-mark"
	if _, _, err := e.sec.Put(ctx, "prj_a", "a", "greeting", []byte(value), "test"); err != nil {
		t.Fatal(err)
	}
	r, err := e.m.Apply(ctx, "prj_a", "a", decl("w1", `{"message":"secret:greeting"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Work(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r = e.get(t, "w1")
	op, err := e.q.Get(ctx, r.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != resources.StatusFailed || !strings.Contains(r.Message, `cannot store {"message":"secret:greeting"}`) || !strings.Contains(op.LastError, "secret:greeting") {
		t.Fatalf("failure as recorded: %+v, operation error %q", r, op.LastError)
	}
	if where := e.storeHolds(t, value); len(where) > 0 {
		t.Fatalf("the store holds a secret value in %v", where)
	}
}
