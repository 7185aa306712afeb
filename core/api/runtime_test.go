package api

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

// runtimeFunc adapts a function to RuntimeProvider (tests that tamper with the capsule).
type runtimeFunc func(ctx context.Context, op operations.Operation, p placement.Placement) ([]byte, error)

func (f runtimeFunc) Runtime(ctx context.Context, op operations.Operation, p placement.Placement) ([]byte, error) {
	return f(ctx, op, p)
}

var _ RuntimeProvider = runtimeFunc(nil)

const secretValue = "s3cr3t-database-url"

// providerProject pushes a bundle, declares a service whose environment holds a value that must
// never leave the runtime call, registers runner "prov-1" with an endpoint and places the project
// with provider placement on it. It returns the runner client, the node credential and the claimed
// reconcile operation.
func providerProject(t *testing.T, f *orchFixture) (*runner.Client, string, abirunner.Operation) {
	t.Helper()
	ctx := context.Background()
	b, err := f.admin.PushBundle(ctx, "shop", "web", bytes.NewReader(tarGz(t, &tar.Header{Name: "app", Mode: 0o755, Typeflag: tar.TypeReg})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ApplyService(ctx, "shop", "web", client.ServiceSpec{Bundle: b.Digest, Command: []string{"./app"}, Port: 8080,
		Env: map[string]string{"DATABASE_URL": secretValue}, Domains: []string{"shop.example.test"}}); err != nil {
		t.Fatal(err)
	}
	rc := f.runnerClient(t)
	reg, err := rc.Register(ctx, f.enrollment(t, "prov-1", "r1"), "prov-1", abirunner.Declaration{Region: "r1", Capacity: 4, Endpoint: "https://prov-1.internal"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "web", Provider: ptrTo(true),
		NodeRequirements: &client.NodeRequirements{Endpoint: true}})
	if err != nil || p.NodeID != "prov-1" || !p.Provider {
		t.Fatalf("provider placement = %+v, %v", p, err)
	}
	ops, err := rc.Claim(ctx, "prov-1", reg.Credential, 1)
	if err != nil || len(ops) != 1 {
		t.Fatalf("claim = %+v, %v", ops, err)
	}
	return rc, reg.Credential, ops[0]
}

func lease(op abirunner.Operation) abirunner.Lease {
	return abirunner.Lease{NodeID: "prov-1", OperationID: op.ID, LeaseToken: op.LeaseToken, Fence: op.Fence}
}

// TestRuntimeTransfer: a provider placement's reconcile operation selects the runtime call; the
// capsule binds the release to the project's environment, placement intent and ingress identity;
// it travels only in the private, no-store body under the same lease checks as the artifact, within
// its own ceiling; and none of it reaches operation JSON or the durable completion result.
func TestRuntimeTransfer(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc, cred, op := providerProject(t, f)
	var payload abirunner.ReconcilePayload
	if err := json.Unmarshal(op.Payload, &payload); err != nil || payload.Protocol != abirunner.RuntimeProtocol {
		t.Fatalf("canonical payload %s does not select the runtime call", op.Payload)
	}
	if strings.Contains(string(op.Payload), secretValue) {
		t.Fatal("a runtime value is in the operation payload")
	}
	// The raw answer: private, non-sniffable, exact length, digest header, nothing in the URL.
	body, _ := json.Marshal(abirunner.RuntimeRequest{Lease: lease(op)})
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+abirunner.Prefix+abirunner.PathRuntime, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusOK || h.Get("Content-Type") != abirunner.RuntimeMediaType || h.Get("Cache-Control") != "private, no-store" ||
		h.Get("X-Content-Type-Options") != "nosniff" || h.Get(abirunner.HeaderDigest) == "" || resp.ContentLength != int64(len(raw)) {
		t.Fatalf("runtime answer %d %v", resp.StatusCode, h)
	}
	for k, vs := range h {
		for _, v := range vs {
			if strings.Contains(v, secretValue) {
				t.Fatalf("a runtime value is in header %s", k)
			}
		}
	}
	// The verified, bound capsule, through the agent's task.
	var capsule *abirunner.RuntimeCapsule
	var rtErr error
	done := make(chan struct{})
	agentCreds := &runner.MemoryCredentials{}
	if err := agentCreds.Save(ctx, runner.Credential{NodeID: "prov-1", Token: cred}); err != nil {
		t.Fatal(err)
	}
	// The first lease is completed by hand; the next generation is claimed by an agent.
	if err := rc.Complete(ctx, cred, lease(op), json.RawMessage(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	agent, err := runner.Open(ctx, runner.AgentConfig{Client: rc, NodeID: "prov-1", Credentials: agentCreds, PollInterval: 10 * time.Millisecond,
		Declaration: abirunner.Declaration{Region: "r1", Capacity: 4, Endpoint: "https://prov-1.internal"},
		Execute: func(ctx context.Context, task *runner.Task) (json.RawMessage, error) {
			defer close(done)
			capsule, rtErr = task.Runtime(ctx)
			return json.RawMessage(`{"services":1}`), rtErr
		}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "web", State: "stopped"})
	if err != nil {
		t.Fatal(err)
	}
	<-done
	if err := agent.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if rtErr != nil {
		t.Fatalf("task runtime: %v", rtErr)
	}
	if capsule.Generation != p.Generation || capsule.Release != p.Release || capsule.ProjectID != p.ProjectID || capsule.State != "stopped" ||
		len(capsule.Services) != 1 || capsule.Services[0].Env["DATABASE_URL"] != secretValue || capsule.Services[0].Secrets == nil ||
		capsule.Placement.NodeID != "prov-1" || len(capsule.Ingress.Routes) != 1 || capsule.Ingress.Routes[0].Domain != "shop.example.test" {
		t.Fatalf("capsule = %+v", capsule)
	}
	ops, err := f.admin.ListOperations(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	all, _ := json.Marshal(ops)
	if strings.Contains(string(all), secretValue) {
		t.Fatalf("a runtime value reached the operation JSON or a completion result: %s", all)
	}
	// A settled lease gets nothing.
	if _, err := rc.Runtime(ctx, cred, lease(op)); !errors.Is(err, runner.ErrLeaseLost) {
		t.Fatalf("runtime of a settled operation: %v, want ErrLeaseLost", err)
	}
}

// TestRuntimeRefusals: the runtime call is refused for an operation that does not select it, for a
// generation that is no longer current, above its ceiling, and a capsule bound to anything but the
// operation is refused by the runner before the execute function sees it.
func TestRuntimeRefusals(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc, cred, op := providerProject(t, f)
	// Ceiling.
	f.orch.RuntimeMaxBytes = 16
	if _, err := rc.Runtime(ctx, cred, lease(op)); !isProblem(err, "body_too_large") {
		t.Fatalf("over the ceiling: %v", err)
	}
	f.orch.RuntimeMaxBytes = 0
	// A client ceiling of its own.
	small, _ := runner.NewClient(runner.ClientConfig{BaseURL: f.srv.URL, MaxRuntimeBytes: 16})
	if _, err := small.Runtime(ctx, cred, lease(op)); !errors.Is(err, runner.ErrRuntime) {
		t.Fatalf("over the client's ceiling: %v, want ErrRuntime", err)
	}
	// A capsule bound to another generation never reaches the execute function's caller.
	f.orch.Runtime = runtimeFunc(tamperedCapsule)
	if _, err := runner.NewTaskForTest(rc, "prov-1", cred, op).Runtime(ctx); !errors.Is(err, runner.ErrRuntime) {
		t.Fatalf("capsule bound to another generation: %v, want ErrRuntime", err)
	}
	f.orch.Runtime = nil
	// A new generation makes the leased one stale for the runtime call.
	if _, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "web", State: "stopped"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Runtime(ctx, cred, lease(op)); !isProblem(err, "revision_conflict") {
		t.Fatalf("runtime of a superseded generation: %v", err)
	}
	// An operation that does not select the runtime call (a caller's own operation).
	if _, _, err := f.admin.EnqueueOperation(ctx, "shop", "k1", client.OperationRequest{Kind: "reconcile", TargetNode: "prov-1",
		Payload: json.RawMessage(`{"generation":1,"release":"x","state":"running","protocol":"berth-runtime/1"}`)}); !client.IsCode(err, "validation_failed") {
		t.Fatalf("caller-made runtime reconcile: %v, want validation_failed", err)
	}
	own, _, err := f.admin.EnqueueOperation(ctx, "shop", "k2", client.OperationRequest{Kind: "backup", TargetNode: "prov-1"})
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	claimed, err := rc.Claim(ctx, "prov-1", cred, abirunner.MaxClaim)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.ID != own.ID {
			continue
		}
		if _, err := rc.Runtime(ctx, cred, abirunner.Lease{NodeID: "prov-1", OperationID: c.ID, LeaseToken: c.LeaseToken, Fence: c.Fence}); !isProblem(err, "validation_failed") {
			t.Fatalf("runtime of a backup operation: %v", err)
		}
		return
	}
	t.Fatalf("the backup operation was not claimed: %+v", claimed)
}

func isProblem(err error, code string) bool {
	var p *runner.Problem
	return errors.As(err, &p) && p.Code == code
}

// tamperedCapsule is a well-formed capsule bound to the generation after the operation's.
func tamperedCapsule(_ context.Context, o operations.Operation, _ placement.Placement) ([]byte, error) {
	var rp placement.ReconcilePayload
	_ = json.Unmarshal(o.PayloadJSON(), &rp)
	return json.Marshal(abirunner.RuntimeCapsule{Version: 1, ProjectID: o.ProjectID, OperationID: o.ID, Fence: o.Fence,
		Generation: rp.Generation + 1, Release: rp.Release, State: string(rp.State), Services: []abirunner.RuntimeService{}})
}

// TestProviderLifecycleOperations: rollback and delete carry only the exact current generation,
// callers cannot enqueue them or inject a confirmation, the runner derives the confirmation after
// validating the lease, and no artifact, runtime or observation is served for them.
func TestProviderLifecycleOperations(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc, cred, op := providerProject(t, f)
	if err := rc.Complete(ctx, cred, lease(op), nil); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"rollback", "delete"} {
		if _, _, err := f.admin.EnqueueOperation(ctx, "shop", "x-"+kind, client.OperationRequest{Kind: kind,
			Payload: json.RawMessage(`{"generation":1,"confirmation":"delete everything"}`)}); !client.IsCode(err, "validation_failed") {
			t.Fatalf("caller-made %s: %v, want validation_failed", kind, err)
		}
	}
	rb, err := f.admin.RollbackPlacement(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if rb.Kind != "rollback" || string(rb.Payload) != `{"generation":1}` || rb.TargetNode != "prov-1" {
		t.Fatalf("rollback operation = %+v (payload %s)", rb, rb.Payload)
	}
	again, err := f.admin.RollbackPlacement(ctx, "shop")
	if err != nil || again.ID != rb.ID {
		t.Fatalf("a repeated rollback of the same generation: %+v, %v; want the same operation", again, err)
	}
	claimed, err := rc.Claim(ctx, "prov-1", cred, 1)
	if err != nil || len(claimed) != 1 || claimed[0].ID != rb.ID {
		t.Fatalf("claim = %+v, %v", claimed, err)
	}
	l := abirunner.Lease{NodeID: "prov-1", OperationID: rb.ID, LeaseToken: claimed[0].LeaseToken, Fence: claimed[0].Fence}
	if _, err := rc.Artifact(ctx, cred, l); !isProblem(err, "bundle_not_found") {
		t.Fatalf("artifact of a rollback: %v", err)
	}
	if _, err := rc.Runtime(ctx, cred, l); !isProblem(err, "validation_failed") {
		t.Fatalf("runtime of a rollback: %v", err)
	}
	if err := rc.Observe(ctx, cred, abirunner.ObserveRequest{Lease: l, Generation: 1, Release: "x", State: "running"}); !isProblem(err, "validation_failed") {
		t.Fatalf("observation of a rollback: %v", err)
	}
	task := runner.NewTaskForTest(rc, "prov-1", cred, claimed[0])
	confirm, err := task.Confirmation(ctx)
	if err != nil || confirm != "rollback "+claimed[0].ProjectID+" 1" {
		t.Fatalf("confirmation = %q, %v", confirm, err)
	}
	if _, err := task.Runtime(ctx); !errors.Is(err, runner.ErrLifecycle) {
		t.Fatalf("task runtime of a rollback: %v", err)
	}
	if err := rc.Complete(ctx, cred, l, nil); err != nil {
		t.Fatal(err)
	}
	// After the lease is settled the confirmation is no longer derived.
	if _, err := task.Confirmation(ctx); !errors.Is(err, runner.ErrLeaseLost) {
		t.Fatalf("confirmation after settlement: %v, want ErrLeaseLost", err)
	}
}

// TestLegacyRegistrationSecret: off by default; when configured, the shared secret registers and
// rotates any named node, a wrong value is refused generically, and weak or token-shaped secrets
// are refused at configuration.
func TestLegacyRegistrationSecret(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc := f.runnerClient(t)
	secret := strings.Repeat("k", 40)
	decl := abirunner.Declaration{Region: "r1", Capacity: 1}
	if _, err := rc.Register(ctx, secret, "legacy-1", decl); !errors.Is(err, runner.ErrUnauthenticated) {
		t.Fatalf("legacy secret while off: %v, want ErrUnauthenticated", err)
	}
	for _, weak := range []string{"short", "brt_" + strings.Repeat("a", 40)} {
		if _, err := runners.NewLegacySecret(weak); !errors.Is(err, runners.ErrLegacySecretWeak) {
			t.Fatalf("weak secret %q: %v", weak, err)
		}
	}
	ls, err := runners.NewLegacySecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	f.orch.LegacyRegistration = ls
	first, err := rc.Register(ctx, secret, "legacy-1", decl)
	if err != nil {
		t.Fatal(err)
	}
	second, err := rc.Register(ctx, secret, "legacy-1", decl) // rotates the named node
	if err != nil || second.Credential == first.Credential {
		t.Fatalf("rotation = %v", err)
	}
	if _, err := rc.Heartbeat(ctx, first.Credential, abirunner.HeartbeatRequest{NodeID: "legacy-1"}); !errors.Is(err, runner.ErrUnauthenticated) {
		t.Fatalf("rotated credential: %v, want ErrUnauthenticated", err)
	}
	if _, err := rc.Register(ctx, secret+"x", "legacy-2", decl); !errors.Is(err, runner.ErrUnauthenticated) {
		t.Fatalf("wrong secret: %v, want ErrUnauthenticated", err)
	}
	// One-time enrollment keeps working beside it.
	if _, err := rc.Register(ctx, f.enrollment(t, "enrolled-1", "r1"), "enrolled-1", decl); err != nil {
		t.Fatal(err)
	}
}

// TestProjectDeleteWorkflow: under the project lease, the placement is held, a provider's delete
// operation runs first (202 until it settles), the project's operations are revoked, the placement
// removed and the fence sequence removed last; each step is idempotent and another worker's lease
// answers PROJECT_BUSY.
func TestProjectDeleteWorkflow(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc, cred, op := providerProject(t, f)
	if err := rc.Complete(ctx, cred, lease(op), nil); err != nil {
		t.Fatal(err)
	}
	pending, _, err := f.admin.EnqueueOperation(ctx, "shop", "backup-1", client.OperationRequest{Kind: "backup"})
	if err != nil {
		t.Fatal(err)
	}
	other := leases.NewManager(f.st, leases.Config{Owner: "brd_other", Now: f.clock.Now})
	l, err := other.Acquire(ctx, leases.Key(op.ProjectID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.DeletePlacement(ctx, "shop"); !client.IsCode(err, "PROJECT_BUSY") {
		t.Fatalf("delete during another worker's lease: %v, want PROJECT_BUSY", err)
	}
	if err := other.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	d, err := f.admin.DeletePlacement(ctx, "shop")
	if err != nil || d.Status != "waiting_for_provider" || d.ProviderOperation == "" {
		t.Fatalf("first delete = %+v, %v; want waiting for the provider", d, err)
	}
	// Held: no new generation.
	if _, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "web"}); !client.IsCode(err, "revision_conflict") {
		t.Fatalf("deploy while deleting: %v", err)
	}
	if d2, err := f.admin.DeletePlacement(ctx, "shop"); err != nil || d2.ProviderOperation != d.ProviderOperation {
		t.Fatalf("repeated delete = %+v, %v", d2, err)
	}
	claimed, err := rc.Claim(ctx, "prov-1", cred, abirunner.MaxClaim)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.ID != d.ProviderOperation {
			continue
		}
		confirm, err := runner.NewTaskForTest(rc, "prov-1", cred, c).Confirmation(ctx)
		if err != nil || confirm != "delete "+c.ProjectID {
			t.Fatalf("confirmation = %q, %v", confirm, err)
		}
		if err := rc.Complete(ctx, cred, abirunner.Lease{NodeID: "prov-1", OperationID: c.ID, LeaseToken: c.LeaseToken, Fence: c.Fence}, nil); err != nil {
			t.Fatal(err)
		}
	}
	d, err = f.admin.DeletePlacement(ctx, "shop")
	if err != nil || d.Status != "deleted" || d.ProviderState != "succeeded" {
		t.Fatalf("delete after the provider = %+v, %v", d, err)
	}
	if _, err := f.admin.GetPlacement(ctx, "shop"); !client.IsCode(err, "not_found") {
		t.Fatalf("placement after delete: %v", err)
	}
	got, err := f.admin.GetOperation(ctx, pending.ID)
	if err != nil || got.State != "failed" || got.LastError != "revoked" {
		t.Fatalf("pending operation after delete = %+v, %v; want revoked", got, err)
	}
	if err := store.FindByID(ctx, f.st.Collection(store.SequencesCollection), operations.FenceSequence(op.ProjectID), &struct{}{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fence sequence after delete: %v, want removed", err)
	}
	rs, _ := f.admin.ListRunners(ctx)
	if len(rs) != 1 || rs[0].Reserved != 0 {
		t.Fatalf("runners after delete = %+v; want the reservation released", rs)
	}
	if d, err = f.admin.DeletePlacement(ctx, "shop"); err != nil || d.Status != "deleted" {
		t.Fatalf("delete of a deleted placement = %+v, %v", d, err)
	}
}

// recordingProvider is a runner.Provider that records what it is given.
type recordingProvider struct {
	reconciles chan runner.ReconcileRequest
	lifecycles chan runner.LifecycleRequest
}

func (p *recordingProvider) Reconcile(_ context.Context, req runner.ReconcileRequest) (json.RawMessage, error) {
	p.reconciles <- req
	return json.RawMessage(`{"reconciled":true}`), nil
}

func (p *recordingProvider) Rollback(_ context.Context, req runner.LifecycleRequest) error {
	p.lifecycles <- req
	return nil
}

func (p *recordingProvider) Delete(_ context.Context, req runner.LifecycleRequest) error {
	p.lifecycles <- req
	return nil
}

var _ runner.Provider = (*recordingProvider)(nil)

// TestProviderExecute: the provider adapter hands a provider the verified artifact and the bound
// runtime for a reconcile, reports the observation, derives the confirmation of rollback and delete,
// and drives the delete workflow to its end.
func TestProviderExecute(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	rc, cred, op := providerProject(t, f)
	if err := rc.Fail(ctx, cred, lease(op), "handed to the agent", true); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second) // past the retry delay
	creds := &runner.MemoryCredentials{}
	if err := creds.Save(ctx, runner.Credential{NodeID: "prov-1", Token: cred}); err != nil {
		t.Fatal(err)
	}
	prov := &recordingProvider{reconciles: make(chan runner.ReconcileRequest, 4), lifecycles: make(chan runner.LifecycleRequest, 4)}
	agent, err := runner.Open(ctx, runner.AgentConfig{Client: rc, NodeID: "prov-1", Credentials: creds, PollInterval: 10 * time.Millisecond,
		Declaration: abirunner.Declaration{Region: "r1", Capacity: 4, Endpoint: "https://prov-1.internal"}, Execute: runner.ProviderExecute(prov)})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close(ctx)
	rec := <-prov.reconciles
	if rec.Artifact == nil || rec.Artifact.Digest != rec.Release || rec.Runtime == nil || rec.Runtime.Generation != 1 ||
		rec.Runtime.Services[0].Env["DATABASE_URL"] != secretValue || rec.Fence <= op.Fence {
		t.Fatalf("reconcile request = %+v", rec)
	}
	if _, err := f.admin.RollbackPlacement(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	if lc := <-prov.lifecycles; lc.Confirmation != "rollback "+op.ProjectID+" 1" || lc.Generation != 1 {
		t.Fatalf("rollback request = %+v", lc)
	}
	d, err := f.admin.DeletePlacement(ctx, "shop")
	if err != nil || d.Status != "waiting_for_provider" {
		t.Fatalf("delete = %+v, %v", d, err)
	}
	if lc := <-prov.lifecycles; lc.Confirmation != "delete "+op.ProjectID {
		t.Fatalf("delete request = %+v", lc)
	}
	for i := 0; ; i++ {
		got, err := f.admin.GetOperation(ctx, d.ProviderOperation)
		if err == nil && got.State == "succeeded" {
			break
		}
		if i == 500 {
			t.Fatalf("the provider's delete operation did not settle: %+v, %v", got, err)
		}
		time.Sleep(10 * time.Millisecond) // the agent settles asynchronously; bounded
	}
	if d, err = f.admin.DeletePlacement(ctx, "shop"); err != nil || d.Status != "deleted" || d.ProviderState != "succeeded" {
		t.Fatalf("delete after the provider = %+v, %v", d, err)
	}
	p, _ := f.admin.ListOperations(ctx, "shop")
	for _, o := range p {
		if strings.Contains(string(o.Result), secretValue) {
			t.Fatalf("a runtime value in the result of %s", o.ID)
		}
	}
}
