package api

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/clocktest"
	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

// Environment of a runner child process started by TestRunnerKilledMidOperation.
const (
	envRunnerChild = "BERTH_TEST_RUNNER_CHILD" // "run" or "replay"
	envRunnerURL   = "BERTH_TEST_RUNNER_URL"
	envRunnerDir   = "BERTH_TEST_RUNNER_DIR"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envRunnerChild); mode != "" {
		os.Exit(runnerChild(mode, os.Getenv(envRunnerURL), os.Getenv(envRunnerDir)))
	}
	os.Exit(m.Run())
}

// runnerChild is a runner process. "run": enroll with $BERTH_RUNNER_REGISTRATION_TOKEN, keep the
// credential in DIR/credentials.json, and on the first operation save its lease to DIR/lease.json,
// print "started <fence>" and block until killed. "replay": complete the saved lease with the
// saved credential and print "lease_lost" or "completed".
func runnerChild(mode, url, dir string) int {
	ctx := context.Background()
	c, err := runner.NewClient(runner.ClientConfig{BaseURL: url})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	creds := runner.NewFileCredentials(filepath.Join(dir, "credentials.json"))
	if mode == "replay" {
		cred, err := creds.Load(ctx)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		raw, err := securefile.ReadFile(filepath.Join(dir, "lease.json"))
		var l abirunner.Lease
		if err == nil {
			err = json.Unmarshal(raw, &l)
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		switch err := c.Complete(ctx, cred.Token, l, json.RawMessage(`{"by":"a"}`)); {
		case errors.Is(err, runner.ErrLeaseLost):
			fmt.Println("lease_lost")
		case err != nil:
			fmt.Println("error", err)
		default:
			fmt.Println("completed")
		}
		return 0
	}
	_, err = runner.Open(ctx, runner.AgentConfig{Client: c, NodeID: "node-a", Declaration: abirunner.Declaration{Region: "r1", Capacity: 2},
		RegistrationToken: os.Getenv(abirunner.EnvRegistrationToken), Credentials: creds, PollInterval: 20 * time.Millisecond,
		Execute: func(ctx context.Context, t *runner.Task) (json.RawMessage, error) {
			raw, _ := json.Marshal(t.Lease())
			if err := securefile.WriteFile(filepath.Join(dir, "lease.json"), raw); err != nil {
				return nil, err
			}
			fmt.Println("started", t.Operation.Fence)
			<-ctx.Done()
			return nil, ctx.Err()
		}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	select {}
}

type orchFixture struct {
	st     *store.Store
	srv    *httptest.Server
	admin  *client.Client
	orch   *Orchestration
	clock  *clocktest.Clock
	bundle *bundles.Store
}

// newOrchFixture serves the API with orchestration on a real embedded store over loopback HTTP.
func newOrchFixture(t *testing.T, transport bool, leaseTTL time.Duration) *orchFixture {
	t.Helper()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	ctx := context.Background()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	clk := clocktest.New(time.Now().UTC())
	tokens := testTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(dir, "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	reg := runners.NewRegistry(st, runners.Config{Now: clk.Now})
	ops := operations.NewQueue(st, operations.Config{Now: clk.Now, Policy: operations.Policy{LeaseTTL: leaseTTL}})
	if err := ops.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	orch := &Orchestration{Leases: leases.NewManager(st, leases.Config{Owner: "brd_test", Now: clk.Now}), Runners: reg,
		Operations: ops, Placement: placement.NewService(st, reg, ops), Transport: transport}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	s := New(Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Catalog: cat, Nodes: nodes.NewRegistry(st, nil), Bundles: bs, Tokens: tokens, Hinter: nopHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Orchestration: orch})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	ac, err := client.New(srv.URL, client.WithToken(admin))
	if err != nil {
		t.Fatal(err)
	}
	return &orchFixture{st: st, srv: srv, admin: ac, orch: orch, clock: clk, bundle: bs}
}

func (f *orchFixture) runnerClient(t *testing.T) *runner.Client {
	t.Helper()
	c, err := runner.NewClient(runner.ClientConfig{BaseURL: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *orchFixture) enrollment(t *testing.T, node, region string) string {
	t.Helper()
	e, err := f.admin.CreateRunnerEnrollment(context.Background(), client.RunnerEnrollmentRequest{NodeID: node, Region: region})
	if err != nil {
		t.Fatal(err)
	}
	return e.Token
}

// TestRunnerTransportEndToEnd: an admin enrollment token, a runner agent enrolling over the
// transport, a placement that becomes a reconcile operation on that runner, the verified artifact,
// the generation-checked observation and the completion, then the lease refused once settled.
func TestRunnerTransportEndToEnd(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	gz := tarGz(t, &tar.Header{Name: "app", Mode: 0o755, Typeflag: tar.TypeReg})
	b, err := f.admin.PushBundle(ctx, "shop", "web", bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	tok := f.enrollment(t, "west-1", "us-west")
	rc := f.runnerClient(t)
	if _, err := rc.Register(ctx, tok, "west-2", abirunner.Declaration{Region: "us-west", Capacity: 1}); !errors.Is(err, runner.ErrUnauthenticated) {
		t.Fatalf("token bound to another node: %v, want ErrUnauthenticated", err)
	}
	type seen struct {
		art *runner.Artifact
		err error
		l   abirunner.Lease
	}
	got := make(chan seen, 1)
	creds := &runner.MemoryCredentials{}
	agent, err := runner.Open(ctx, runner.AgentConfig{Client: rc, NodeID: "west-1", RegistrationToken: tok, Credentials: creds,
		Declaration:  abirunner.Declaration{Region: "us-west", Capacity: 4, Labels: map[string]string{"isolation": "docker"}},
		PollInterval: 10 * time.Millisecond,
		Execute: func(ctx context.Context, task *runner.Task) (json.RawMessage, error) {
			var p abirunner.ReconcilePayload
			if err := json.Unmarshal(task.Operation.Payload, &p); err != nil {
				return nil, err
			}
			art, err := task.Artifact(ctx)
			if err == nil {
				err = task.Observe(ctx, p.Generation, p.Release, p.State)
			}
			got <- seen{art, err, task.Lease()}
			return json.RawMessage(`{"ok":true}`), err
		}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "web", CapacityUnits: ptrTo(2),
		NodeRequirements: &client.NodeRequirements{Labels: map[string]string{"isolation": "docker"}}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != "assigned" || p.NodeID != "west-1" || p.Release != b.Digest {
		t.Fatalf("placement = %+v", p)
	}
	s := <-got
	if s.err != nil {
		t.Fatalf("artifact or observe: %v", s.err)
	}
	if s.art.Digest != b.Digest || !bytes.Equal(s.art.Bytes, gz) {
		t.Fatalf("artifact digest %s, want %s", s.art.Digest, b.Digest)
	}
	if err := agent.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ops, err := f.admin.ListOperations(ctx, "shop")
	if err != nil || len(ops) != 1 || ops[0].State != "succeeded" || ops[0].Fence != 1 {
		t.Fatalf("operations = %+v, %v", ops, err)
	}
	cred, _ := creds.Load(ctx)
	if _, err := rc.Artifact(ctx, cred.Token, s.l); !errors.Is(err, runner.ErrLeaseLost) {
		t.Fatalf("artifact of a settled operation: %v, want ErrLeaseLost", err)
	}
	if p, _ = f.admin.GetPlacement(ctx, "shop"); p.Observed == nil {
		t.Fatal("observation not recorded")
	}
	rs, err := f.admin.ListRunners(ctx)
	if err != nil || len(rs) != 1 || !rs[0].Draining || rs[0].Reserved != 2 {
		t.Fatalf("runners after Close = %+v, %v (want draining, 2 units reserved)", rs, err)
	}
	// A draining node cannot claim.
	if _, err := rc.Claim(ctx, "west-1", cred.Token, 1); !errors.Is(err, runner.ErrDraining) {
		t.Fatalf("claim while draining: %v", err)
	}
	// The transport's answers are private and non-sniffable; bearers never in URLs.
	resp, err := http.Post(f.srv.URL+abirunner.Prefix+abirunner.PathClaim+"?token="+cred.Token, "application/json", strings.NewReader(`{"node_id":"west-1","max":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Cache-Control") != "private, no-store" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("bearer in the query: %d %v", resp.StatusCode, resp.Header)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestRunnerTransportOff: without the transport, every path under the prefix answers 404.
func TestRunnerTransportOff(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, false, 30*time.Second)
	for _, p := range []string{abirunner.PathRegister, abirunner.PathClaim, abirunner.PathArtifact, "/anything"} {
		resp, err := http.Post(f.srv.URL+abirunner.Prefix+p, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", p, resp.StatusCode)
		}
	}
	if _, err := runner.NewClient(runner.ClientConfig{BaseURL: "http://deploy.example.com"}); err == nil {
		t.Error("the client accepted plain http outside loopback")
	}
}

// TestOperationIdempotencyKey: duplicate API requests with one Idempotency-Key create one
// operation and replay its answer; the same key with another body is refused.
func TestOperationIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, false, 30*time.Second)
	ctx := context.Background()
	req := client.OperationRequest{Kind: "backup", Payload: json.RawMessage(`{"target":"s3"}`)}
	first, replayed, err := f.admin.EnqueueOperation(ctx, "shop", "key-1", req)
	if err != nil || replayed {
		t.Fatalf("first = %+v, replayed %v, %v", first, replayed, err)
	}
	again, replayed, err := f.admin.EnqueueOperation(ctx, "shop", "key-1", req)
	if err != nil || !replayed || again.ID != first.ID {
		t.Fatalf("replay = %+v, replayed %v, %v", again, replayed, err)
	}
	req.Payload = json.RawMessage(`{"target":"gcs"}`)
	if _, _, err := f.admin.EnqueueOperation(ctx, "shop", "key-1", req); !client.IsCode(err, "idempotency_key_reused") {
		t.Fatalf("same key, other body: %v", err)
	}
	if _, _, err := f.admin.EnqueueOperation(ctx, "shop", "", req); !client.IsCode(err, "idempotency_key_required") {
		t.Fatalf("no key: %v", err)
	}
	ops, err := f.admin.ListOperations(ctx, "shop")
	if err != nil || len(ops) != 1 {
		t.Fatalf("operations = %d, %v; want 1", len(ops), err)
	}
}

// TestRunnerKilledMidOperation: a runner process killed with SIGKILL while it holds an operation;
// after the lease expires another runner reclaims it with a higher fence and completes it, and the
// first runner's completion, replayed after its restart, is rejected.
func TestRunnerKilledMidOperation(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 30*time.Second)
	ctx := context.Background()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := func(mode string) (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), envRunnerChild+"="+mode, envRunnerURL+"="+f.srv.URL, envRunnerDir+"="+dir,
			abirunner.EnvRegistrationToken+"="+f.enrollment(t, "node-a", "r1"))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, bufio.NewScanner(out)
	}
	op, _, err := f.admin.EnqueueOperation(ctx, "shop", "deploy-1", client.OperationRequest{Kind: "reconcile"})
	if err != nil {
		t.Fatal(err)
	}
	a, out := child("run")
	if !out.Scan() {
		t.Fatal("runner A said nothing")
	}
	var fenceA int64
	if _, err := fmt.Sscanf(out.Text(), "started %d", &fenceA); err != nil {
		t.Fatalf("runner A: %q", out.Text())
	}
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()

	rc := f.runnerClient(t)
	reg, err := rc.Register(ctx, f.enrollment(t, "node-b", "r1"), "node-b", abirunner.Declaration{Region: "r1", Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ops, err := rc.Claim(ctx, "node-b", reg.Credential, 1); err != nil || len(ops) != 0 {
		t.Fatalf("claim before expiry = %v, %v; want nothing", ops, err)
	}
	f.clock.Advance(31 * time.Second) // the lease expires; the nodes stay online
	if _, err := rc.Heartbeat(ctx, reg.Credential, abirunner.HeartbeatRequest{NodeID: "node-b"}); err != nil {
		t.Fatal(err)
	}
	ops, err := rc.Claim(ctx, "node-b", reg.Credential, 1)
	if err != nil || len(ops) != 1 || ops[0].ID != op.ID || ops[0].Fence <= fenceA {
		t.Fatalf("reclaim = %+v, %v; want %s with a fence above %d", ops, err, op.ID, fenceA)
	}
	lb := abirunner.Lease{NodeID: "node-b", OperationID: op.ID, LeaseToken: ops[0].LeaseToken, Fence: ops[0].Fence}
	if err := rc.Complete(ctx, reg.Credential, lb, json.RawMessage(`{"by":"b"}`)); err != nil {
		t.Fatal(err)
	}
	r, out := child("replay")
	if !out.Scan() || out.Text() != "lease_lost" {
		t.Fatalf("replayed completion of runner A: %q, want lease_lost", out.Text())
	}
	_ = r.Wait()
	got, err := f.admin.GetOperation(ctx, op.ID)
	if err != nil || got.State != "succeeded" || got.Fence != ops[0].Fence || string(got.Result) != `{"by":"b"}` {
		t.Fatalf("operation = %+v, %v", got, err)
	}
	t.Logf("fence of the killed runner %d, of the reclaim %s", fenceA, strconv.FormatInt(got.Fence, 10))
}

// startAgent opens an agent for node in region r1 whose executions announce themselves on started
// and block until their ctx ends; it returns the agent and where each execution's ctx cause lands.
func (f *orchFixture) startAgent(t *testing.T, node string, creds runner.Credentials, shutdown time.Duration) (*runner.Agent, chan abirunner.Lease, chan error) {
	t.Helper()
	started, causes := make(chan abirunner.Lease, 4), make(chan error, 4)
	a, err := runner.Open(context.Background(), runner.AgentConfig{Client: f.runnerClient(t), NodeID: node,
		RegistrationToken: f.enrollment(t, node, "r1"), Credentials: creds, ShutdownTimeout: shutdown,
		Declaration: abirunner.Declaration{Region: "r1", Capacity: 2}, PollInterval: 10 * time.Millisecond,
		OnError: func(error) {},
		Execute: func(ctx context.Context, task *runner.Task) (json.RawMessage, error) {
			started <- task.Lease()
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a, started, causes
}

// TestAgentAbortsOnLeaseLoss: a lease that expires while the work runs aborts the work, and the
// agent settles nothing through the stale fence.
func TestAgentAbortsOnLeaseLoss(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 300*time.Millisecond)
	ctx := context.Background()
	op, _, err := f.admin.EnqueueOperation(ctx, "shop", "k", client.OperationRequest{Kind: "reconcile"})
	if err != nil {
		t.Fatal(err)
	}
	_, started, causes := f.startAgent(t, "node-a", &runner.MemoryCredentials{}, 200*time.Millisecond)
	first := <-started
	f.clock.Advance(time.Second) // the lease expires before the next renewal
	if cause := <-causes; !errors.Is(cause, runner.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", cause)
	}
	// Nothing was settled through the stale fence: the operation is reclaimed with a new one.
	second := <-started
	if second.OperationID != op.ID || second.Fence <= first.Fence {
		t.Fatalf("reclaim = %+v after %+v; want %s with a higher fence", second, first, op.ID)
	}
	got, err := f.admin.GetOperation(ctx, op.ID)
	if err != nil || got.State != "leased" || got.Attempts != 2 {
		t.Fatalf("operation = %+v, %v; want leased on its second attempt", got, err)
	}
}

// TestAgentRotatedCredentialStops: re-enrolling the node rotates its credential; the running
// holder stops claims and renewals, aborts its work, reports the failure and resolves Done.
func TestAgentRotatedCredentialStops(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 300*time.Millisecond)
	ctx := context.Background()
	if _, _, err := f.admin.EnqueueOperation(ctx, "shop", "k", client.OperationRequest{Kind: "reconcile"}); err != nil {
		t.Fatal(err)
	}
	a, started, causes := f.startAgent(t, "node-a", &runner.MemoryCredentials{}, time.Minute)
	<-started
	if _, err := f.runnerClient(t).Register(ctx, f.enrollment(t, "node-a", "r1"), "node-a", abirunner.Declaration{Region: "r1", Capacity: 2}); err != nil {
		t.Fatal(err)
	}
	if cause := <-causes; !errors.Is(cause, runner.ErrUnauthenticated) {
		t.Fatalf("cause = %v, want ErrUnauthenticated", cause)
	}
	<-a.Done()
	if !errors.Is(a.Err(), runner.ErrUnauthenticated) {
		t.Fatalf("Err = %v", a.Err())
	}
	// A restart with the rotated credential fails without an enrollment token.
	creds := &runner.MemoryCredentials{}
	_ = creds.Save(ctx, runner.Credential{NodeID: "node-a", Token: "brn_" + strings.Repeat("x", 43)})
	if _, err := runner.Open(ctx, runner.AgentConfig{Client: f.runnerClient(t), NodeID: "node-a", Credentials: creds,
		Execute: func(context.Context, *runner.Task) (json.RawMessage, error) { return nil, nil }}); !errors.Is(err, runner.ErrUnauthenticated) {
		t.Fatalf("restart with a rotated credential: %v", err)
	}
}

// TestAgentShutdownTimeoutAbandons: Close marks the node draining, waits the grace period, then
// aborts the remaining work and leaves its lease for fenced reclamation.
func TestAgentShutdownTimeoutAbandons(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, true, 300*time.Millisecond)
	ctx := context.Background()
	op, _, err := f.admin.EnqueueOperation(ctx, "shop", "k", client.OperationRequest{Kind: "reconcile"})
	if err != nil {
		t.Fatal(err)
	}
	a, started, causes := f.startAgent(t, "node-a", &runner.MemoryCredentials{}, 200*time.Millisecond)
	<-started
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := <-causes; !errors.Is(cause, runner.ErrAbandoned) {
		t.Fatalf("cause = %v, want ErrAbandoned", cause)
	}
	got, err := f.admin.GetOperation(ctx, op.ID)
	if err != nil || got.State != "leased" {
		t.Fatalf("operation = %+v, %v; want leased, left for reclamation", got, err)
	}
	rs, _ := f.admin.ListRunners(ctx)
	if len(rs) != 1 || !rs[0].Draining {
		t.Fatalf("runner = %+v, want draining", rs)
	}
}

// TestPlacementUnderProjectLease: a deploy while another control-plane worker holds the project's
// lease answers PROJECT_BUSY and changes nothing.
func TestPlacementUnderProjectLease(t *testing.T) {
	t.Parallel()
	f := newOrchFixture(t, false, 30*time.Second)
	ctx := context.Background()
	p, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "sha256:" + strings.Repeat("a", 64)})
	if err != nil || p.Status != "waiting" {
		t.Fatalf("first deploy = %+v, %v; want waiting (no runner)", p, err)
	}
	other := leases.NewManager(f.st, leases.Config{Owner: "brd_other", Now: f.clock.Now})
	if _, err := other.Acquire(ctx, leases.Key(p.ProjectID)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.SetPlacement(ctx, "shop", client.PlacementRequest{Release: "sha256:" + strings.Repeat("b", 64)}); !client.IsCode(err, "PROJECT_BUSY") {
		t.Fatalf("deploy during another worker's lease: %v, want PROJECT_BUSY", err)
	}
	if got, err := f.admin.GetPlacement(ctx, "shop"); err != nil || got.Generation != 1 {
		t.Fatalf("placement = %+v, %v; want generation 1 unchanged", got, err)
	}
	mode := "stateful"
	if _, err := f.admin.SetPlacement(ctx, "other", client.PlacementRequest{Release: "sha256:" + strings.Repeat("a", 64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.SetPlacement(ctx, "other", client.PlacementRequest{Release: "sha256:" + strings.Repeat("a", 64), PlacementMode: &mode}); !client.IsCode(err, "placement_mode_immutable") {
		t.Fatalf("mode change: %v, want placement_mode_immutable", err)
	}
}
