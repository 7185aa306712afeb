package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/nodeplugins/fake"
)

// runFakeAgent runs an Agent over the fake driver (state under
// dataDir/driver/fake) until the returned stop func is called.
func runFakeAgent(t *testing.T, dataDir string, logs *syncbuf.Buffer) (stop func()) {
	t.Helper()
	drv, err := fake.New(fake.Config{StateDir: filepath.Join(dataDir, "driver", "fake")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{DataDir: dataDir, Driver: drv, Logger: testLogger(logs), PollInterval: 50 * time.Millisecond,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		FenceGrace: 100 * time.Millisecond, FenceForce: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		_ = a.Close()
		_ = drv.Close()
	}
}

func (fc *fakeCore) grant(ctx context.Context, token int64) {
	fc.t.Helper()
	g := node.LeaseGrant{LeaseID: "lse_a", ResourceType: node.LeaseResourceService, ResourceID: "svc_db",
		Mode: node.LeaseLocal, FencingToken: token, GrantedAt: time.Now().UTC().Truncate(time.Second)}
	if err := node.SignLeaseGrant(&g, fc.key); err != nil {
		fc.t.Fatal(err)
	}
	fc.send(ctx, node.TypeLeaseGrant, g)
}

func (fc *fakeCore) revoke(ctx context.Context, rec *recorder, token int64) node.CommandResult {
	fc.t.Helper()
	r := node.LeaseRevoke{LeaseID: "lse_a", FencingToken: token, Reason: node.RevokeMoved}
	if err := node.SignLeaseRevoke(&r, fc.key); err != nil {
		fc.t.Fatal(err)
	}
	mark := rec.mark()
	fc.send(ctx, node.TypeLeaseRevoke, r)
	return rec.result(ctx, mark, "msg_"+string(node.TypeLeaseRevoke))
}

// recorder keeps every frame the node sent, so that waiting for one kind
// never loses another.
type recorder struct {
	t      *testing.T
	mu     sync.Mutex
	frames []node.Envelope
	more   chan struct{}
}

func record(ctx context.Context, t *testing.T, fc *fakeCore) *recorder {
	r := &recorder{t: t, more: make(chan struct{}, 1)}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case env := <-fc.frames:
				r.mu.Lock()
				r.frames = append(r.frames, env)
				r.mu.Unlock()
				select {
				case r.more <- struct{}{}:
				default:
				}
			}
		}
	}()
	return r
}

func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.frames)
}

// find waits until pick, given the frames from index since, returns true.
func (r *recorder) find(ctx context.Context, what string, since int, pick func(node.Envelope) bool) node.Envelope {
	r.t.Helper()
	for {
		r.mu.Lock()
		for _, env := range r.frames[since:] {
			if pick(env) {
				r.mu.Unlock()
				return env
			}
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			r.t.Fatalf("no %s", what)
		case <-r.more:
		}
	}
}

func (r *recorder) result(ctx context.Context, since int, re string) node.CommandResult {
	r.t.Helper()
	env := r.find(ctx, "command_result re "+re, since, func(env node.Envelope) bool {
		return env.Type == node.TypeCommandResult && env.Re == re
	})
	var res node.CommandResult
	if err := json.Unmarshal(env.Body, &res); err != nil {
		r.t.Fatal(err)
	}
	return res
}

func (r *recorder) event(ctx context.Context, since int, typ string) node.Event {
	r.t.Helper()
	var ev node.Event
	r.find(ctx, "event "+typ, since, func(env node.Envelope) bool {
		return env.Type == node.TypeEvent && json.Unmarshal(env.Body, &ev) == nil && ev.Type == typ
	})
	return ev
}

// status waits until the newest status report satisfies ok: reports are
// sent on every change, so the newest one is the node's current view.
func (r *recorder) status(ctx context.Context, what string, ok func(node.StatusReport) bool) node.StatusReport {
	r.t.Helper()
	for {
		r.mu.Lock()
		for i := len(r.frames) - 1; i >= 0; i-- {
			if r.frames[i].Type != node.TypeStatusReport {
				continue
			}
			var rep node.StatusReport
			if json.Unmarshal(r.frames[i].Body, &rep) == nil && ok(rep) {
				r.mu.Unlock()
				return rep
			}
			break
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			r.t.Fatalf("no status report with %s", what)
		case <-r.more:
		}
	}
}

func dbSpec(token int64) node.WorkloadSpec {
	return node.WorkloadSpec{WorkloadID: "wl_db", Project: "shop", Service: "db", Driver: "fake", Command: []string{"db"},
		DesiredStatus: node.DesiredRunning, RestartGeneration: 1, Stateful: true, LeaseID: "lse_a", FencingToken: token,
		HealthCheck: node.HealthCheck{IntervalS: 1}}
}

func statusIs(id, observed string) func(node.StatusReport) bool {
	return func(rep node.StatusReport) bool {
		w, ok := statusOf(rep, id)
		return ok && w.ObservedStatus == observed
	}
}

// TestStatefulWorkloadFollowsItsLease runs a stateful workload through the
// whole agent and the fake driver: it stays stopped (health unknown, no
// error) until its lease is held with the spec's token, is fenced by a
// revoke, and a failed forced stop marks the node failed until fence_ack.
func TestStatefulWorkloadFollowsItsLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fc := newFakeCore(t)
	dataDir := filepath.Join(t.TempDir(), "agent")
	var logs syncbuf.Buffer
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dataDir, Logger: testLogger(&logs)}); err != nil {
		t.Fatal(err)
	}
	stop := runFakeAgent(t, dataDir, &logs)
	defer func() { stop() }()
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	rec := record(ctx, t, fc)
	rec.find(ctx, "hello", 0, func(env node.Envelope) bool { return env.Type == node.TypeHello })
	web := node.WorkloadSpec{WorkloadID: "wl_web", Driver: "fake", Command: []string{"web"}, DesiredStatus: node.DesiredRunning, RestartGeneration: 1}

	fc.desire(ctx, 1, dbSpec(3), web)
	rep := rec.status(ctx, "wl_db stopped, wl_web running", func(rep node.StatusReport) bool {
		return statusIs("wl_db", node.StatusStopped)(rep) && statusIs("wl_web", node.StatusRunning)(rep)
	})
	if w, _ := statusOf(rep, "wl_db"); w.Health != node.HealthUnknown || w.Message != "" {
		t.Errorf("wl_db without its lease = %+v; want stopped, health unknown, no message", w)
	}

	fc.grant(ctx, 3)
	rec.status(ctx, "wl_db running under its lease", statusIs("wl_db", node.StatusRunning))

	if res := fc.revoke(ctx, rec, 3); res.Status != "ok" {
		t.Fatalf("revoke answered %+v", res)
	}
	if ev := rec.event(ctx, 0, node.EventNodeFenced); ev.Subject.ID != "lse_a" {
		t.Errorf("node.fenced = %+v", ev)
	}
	rec.status(ctx, "wl_db stopped after the revoke", statusIs("wl_db", node.StatusStopped))

	// A grant with a higher token and the snapshot carrying it start it again.
	fc.grant(ctx, 4)
	fc.desire(ctx, 2, dbSpec(4), web)
	rec.status(ctx, "wl_db running under token 4", statusIs("wl_db", node.StatusRunning))

	// The driver fails forced stops: the revoke's fence fails.
	if err := os.WriteFile(filepath.Join(dataDir, "driver", "fake", fake.FailForcedStopFile), []byte("*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mark := rec.mark()
	if res := fc.revoke(ctx, rec, 5); res.Status != "error" || res.Error == nil || res.Error.Code != "fence_failed" {
		t.Fatalf("revoke with a failing driver answered %+v; want error fence_failed", res)
	}
	if ev := rec.event(ctx, mark, node.EventNodeFenceFailed); ev.Subject.ID != "lse_a" {
		t.Errorf("node.fence_failed = %+v", ev)
	}
	if err := os.Remove(filepath.Join(dataDir, "driver", "fake", fake.FailForcedStopFile)); err != nil {
		t.Fatal(err)
	}
	mark = rec.mark()
	fc.send(ctx, node.TypeCommand, node.Command{Kind: node.CommandFenceAck, Params: json.RawMessage(`{"lease_ids":["lse_a"]}`)})
	if res := rec.result(ctx, mark, "msg_"+string(node.TypeCommand)); res.Status != "ok" {
		t.Errorf("fence_ack answered %+v", res)
	}

	// After a restart the hello lists the lease as the node last knew it.
	stop()
	mark = rec.mark()
	stop = runFakeAgent(t, dataDir, &logs)
	env := rec.find(ctx, "hello after restart", mark, func(env node.Envelope) bool { return env.Type == node.TypeHello })
	var hello node.Hello
	if err := json.Unmarshal(env.Body, &hello); err != nil {
		t.Fatal(err)
	}
	if len(hello.Leases) != 1 || hello.Leases[0].LeaseID != "lse_a" || hello.Leases[0].FencingToken != 5 ||
		hello.Leases[0].State != node.LeaseRevoked || hello.Drivers[0] != "fake" {
		t.Errorf("hello after restart = %+v", hello)
	}
}
