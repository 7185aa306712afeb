package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

type leaseFixture struct {
	*fixture
	auth  *fencing.Authority
	clock *clocktest.Clock
	s     *Server
}

// newLeaseFixture is newFixture with a lease authority on a manual clock.
func newLeaseFixture(t *testing.T) *leaseFixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t)
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	f := &fixture{reg: reg, cat: cat, pub: pub, changes: make(chan string, 64), events: events.New(st, nil), clog: changelog.New(st, 1, nil), st: st}
	f.node, f.cred = enrollForTest(t, reg, "n1")
	clock := clocktest.New(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC))
	auth := fencing.New(st, fencing.Config{Now: clock.Now})
	s := New(Config{Nodes: reg, Catalog: cat, SigningKey: priv, ClusterID: "cls_test", Events: f.events, Changelog: f.clog, Leases: auth,
		OnChange: func(r string) {
			select {
			case f.changes <- r:
			default:
			}
		}, SessionTimeout: quietPeerTimeout})
	f.srv = httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); f.srv.Close() })
	return &leaseFixture{fixture: f, auth: auth, clock: clock, s: s}
}

func enrollForTest(t *testing.T, reg *nodes.Registry, name string) (*nodes.Node, string) {
	t.Helper()
	ctx := context.Background()
	tok, _, err := reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	npub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, cred, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(npub), Hostname: name, Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return n, cred
}

// settle waits until the session finished its post-handshake work (the grants of leases the
// hello did not list run before the read loop), by a ping answered from that loop; a lease
// granted before would race that work and be sent twice.
func settle(t *testing.T, p *peer) {
	t.Helper()
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("got %s %s, want pong", env.Type, env.Body)
	}
}

func (f *leaseFixture) grant(t *testing.T, svc, nodeID string, mode node.LeaseMode, d time.Duration) *fencing.Lease {
	t.Helper()
	l, _, err := f.auth.Grant(context.Background(), fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: svc, NodeID: nodeID, Mode: mode, Duration: d})
	if err != nil {
		t.Fatalf("grant %s to %s: %v", svc, nodeID, err)
	}
	return l
}

// expectRevoke reads the next message, checks it is a lease_revoke of leaseID with reason and
// token signed by the cluster key, and returns its envelope.
func (f *leaseFixture) expectRevoke(t *testing.T, p *peer, leaseID, reason string, token int64) *node.Envelope {
	t.Helper()
	env := p.next()
	if env.Type != node.TypeLeaseRevoke {
		t.Fatalf("got %s %s, want lease_revoke of %s", env.Type, env.Body, leaseID)
	}
	rv, err := node.VerifyLeaseRevoke(env.Body, f.pub)
	if err != nil {
		t.Fatalf("lease_revoke does not verify: %v", err)
	}
	if rv.LeaseID != leaseID || rv.Reason != reason || rv.FencingToken != token {
		t.Fatalf("lease_revoke %+v, want %s reason %s token %d", rv, leaseID, reason, token)
	}
	return env
}

// expectSilence checks the core is waiting for the peer's answer: a ping sent now is answered by
// a pong before anything else (a core that went on would have sent its next message first).
func expectSilence(t *testing.T, p *peer) {
	t.Helper()
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("the core went on without waiting for the answer: %s %s", env.Type, env.Body)
	}
}

func okResult() node.CommandResult { return node.CommandResult{Status: "ok"} }

// TestHelloRevokesStaleLeasesThenFenceAckThenDesiredState checks the order of docs/node-protocol.md
// section 4.2 message by message: welcome; one lease_revoke per stale lease of hello, each awaited;
// command fence_ack when an acknowledgement is pending, awaited; only then desired_state.
func TestHelloRevokesStaleLeasesThenFenceAckThenDesiredState(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	n1 := f.node.ID
	n2, _ := enrollForTest(t, f.reg, "n2")

	moved := f.grant(t, "svc_MOVED", n2.ID, node.LeaseLocal, 0) // another node holds it
	lost := f.grant(t, "svc_LOST", n1, node.LeaseLocal, 0)      // n1 declared lost since
	if _, err := f.auth.Lost(ctx, n1); err != nil {
		t.Fatal(err)
	}
	kept := f.grant(t, "svc_KEPT", n1, node.LeaseLocal, 0) // n1 rightly holds it
	acked := f.grant(t, "svc_ACKED", n1, node.LeaseLocal, 0)
	if err := f.auth.RecordFenceFailure(ctx, n1, nodes.FenceFailure{LeaseID: acked.ID, FencingToken: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.auth.FenceAck(ctx, n1, []string{acked.ID}); err != nil {
		t.Fatal(err)
	}

	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	hl := func(id string, token int64) node.HelloLease {
		return node.HelloLease{LeaseID: id, ResourceType: "service", Mode: node.LeaseLocal, FencingToken: token, State: node.LeaseHeld}
	}
	p.send(1, node.TypeHello, node.Hello{NodeID: n1, AgentVersion: "test", Leases: []node.HelloLease{
		hl(moved.ID, 1), hl("lse_UNKNOWN", 3), hl(lost.ID, 1), hl(kept.ID, 1),
	}})
	if env := p.next(); env.Type != node.TypeWelcome {
		t.Fatalf("first message %s, want welcome", env.Type)
	}
	env := f.expectRevoke(t, p, moved.ID, node.RevokeMoved, 1)
	expectSilence(t, p)
	p.send(1, node.TypeHeartbeat, node.Heartbeat{}) // other frames are handled while the core waits
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	env = f.expectRevoke(t, p, "lse_UNKNOWN", node.RevokeDeleted, 3)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	env = f.expectRevoke(t, p, lost.ID, node.RevokeSuperseded, 2)
	expectSilence(t, p)
	p.sendEnv(node.TypeCommandResult, env.ID, node.CommandResult{Status: "error", Detail: "wl_1 neither stopped nor gone",
		Error: &node.ErrorBody{Code: string(abierrors.FenceFailed), Message: "self-fence failed"}})

	env = p.next()
	var cmd node.Command
	_ = json.Unmarshal(env.Body, &cmd)
	var params node.FenceAckParams
	_ = json.Unmarshal(cmd.Params, &params)
	if env.Type != node.TypeCommand || cmd.Kind != node.CommandFenceAck || len(params.LeaseIDs) != 1 || params.LeaseIDs[0] != acked.ID {
		t.Fatalf("got %s %s, want command fence_ack [%s]", env.Type, env.Body, acked.ID)
	}
	expectSilence(t, p)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())

	env = p.next()
	if env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want desired_state after the revokes and fence_ack", env.Type)
	}
	if _, err := node.Verify(env.Body, f.pub); err != nil {
		t.Fatal(err)
	}
	p.barrier()

	n, _ := f.reg.Get(ctx, n1)
	if len(n.FenceAckPending) != 0 {
		t.Fatalf("fence_ack answered ok but still pending: %v", n.FenceAckPending)
	}
	if len(n.FenceFailure) != 1 || n.FenceFailure[0].LeaseID != lost.ID || n.FenceFailure[0].Detail == "" {
		t.Fatalf("failed fence of the revoke not recorded: %+v", n.FenceFailure)
	}
	if l, _ := f.auth.Get(ctx, lost.ID); !l.Blocked() {
		t.Fatalf("lease with a failed fence is not blocked: %+v", l)
	}
	if l, _ := f.auth.Get(ctx, kept.ID); l.Holder != n1 || l.FencingToken != 1 {
		t.Fatalf("a rightly held lease changed: %+v", l)
	}
}

// TestHelloReleasesLeasesTheNodeFenced: a lease the core says the node holds but the node reports
// expired (or does not list) is released at hello, so the next grant carries a higher token.
func TestHelloReleasesLeasesTheNodeFenced(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	l := f.grant(t, "svc_EXP", f.node.ID, node.LeaseExpiring, 15*time.Second)
	forgotten := f.grant(t, "svc_FORGOT", f.node.ID, node.LeaseLocal, 0)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, Leases: []node.HelloLease{{LeaseID: l.ID, ResourceType: "service",
		Mode: node.LeaseExpiring, FencingToken: 1, State: node.LeaseExpired}}})
	if env := p.next(); env.Type != node.TypeWelcome {
		t.Fatalf("got %s", env.Type)
	}
	if env := p.next(); env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want desired_state (nothing to revoke)", env.Type)
	}
	for _, id := range []string{l.ID, forgotten.ID} {
		got, _ := f.auth.Get(ctx, id)
		if got.Holder != "" {
			t.Fatalf("lease %s still held after the node reported it fenced: %+v", id, got)
		}
	}
	if again := f.grant(t, "svc_EXP", f.node.ID, node.LeaseExpiring, 15*time.Second); again.FencingToken != 2 {
		t.Fatalf("re-grant token %d, want 2", again.FencingToken)
	}
}

// TestLeaseRenewGrantRevokeAndFenceEvents: lease_renew is answered by lease_grant (same token, re
// set) or lease_revoke; node.fence_failed records the failure; node.fenced frees the lease.
func TestLeaseRenewGrantRevokeAndFenceEvents(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	settle(t, p)
	l := f.grant(t, "svc_R", f.node.ID, node.LeaseExpiring, 3*time.Second)
	f.s.SendLeaseGrant(ctx, f.node.ID, l)
	env := p.next()
	g, err := node.VerifyLeaseGrant(env.Body, f.pub)
	if env.Type != node.TypeLeaseGrant || err != nil || g.FencingToken != 1 || g.DurationMS != 3000 {
		t.Fatalf("grant: %s %+v %v", env.Type, g, err)
	}
	// The first renewal is answered with the same token; T_grant moves to the core's clock.
	f.clock.Advance(time.Second)
	p.sendEnv(node.TypeLeaseRenew, "", node.LeaseRenew{LeaseID: l.ID, FencingToken: 1})
	env = p.next()
	g, err = node.VerifyLeaseGrant(env.Body, f.pub)
	if env.Type != node.TypeLeaseGrant || env.Re != "msg_peer" || err != nil || g.FencingToken != 1 || !g.GrantedAt.Equal(f.clock.Now()) {
		t.Fatalf("renew answer: %s re %q %+v %v", env.Type, env.Re, g, err)
	}
	// A renewal under another token is answered with a revoke at the core's token.
	p.sendEnv(node.TypeLeaseRenew, "", node.LeaseRenew{LeaseID: l.ID, FencingToken: 0})
	env = f.expectRevoke(t, p, l.ID, node.RevokeSuperseded, 1)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	// An unknown lease: revoked as deleted.
	p.sendEnv(node.TypeLeaseRenew, "", node.LeaseRenew{LeaseID: "lse_NOPE", FencingToken: 4})
	env = f.expectRevoke(t, p, "lse_NOPE", node.RevokeDeleted, 4)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())

	// node.fenced with the current token frees the lease at once.
	p.send(1, node.TypeEvent, node.Event{ID: "evt_fenced1", Type: node.EventNodeFenced, Time: time.Now().UTC(),
		Subject: node.EventRef{Type: "lease", ID: l.ID},
		Data:    map[string]any{"lease_id": l.ID, "fencing_token": 1, "reason": "expired", "workload_ids": []string{"wl_1"}}})
	p.barrier()
	if got, _ := f.auth.Get(ctx, l.ID); got.Holder != "" {
		t.Fatalf("node.fenced did not free the lease: %+v", got)
	}
	// node.fence_failed blocks the lease and lists it on the node.
	l = f.grant(t, "svc_R", f.node.ID, node.LeaseExpiring, 3*time.Second)
	p.send(1, node.TypeEvent, node.Event{ID: "evt_failed1", Type: node.EventNodeFenceFailed, Time: time.Now().UTC(),
		Subject: node.EventRef{Type: "lease", ID: l.ID},
		Data:    map[string]any{"lease_id": l.ID, "fencing_token": l.FencingToken, "reason": "revoked", "workload_ids": []string{"wl_2"}}})
	p.barrier()
	n, _ := f.reg.Get(ctx, f.node.ID)
	if len(n.FenceFailure) != 1 || n.FenceFailure[0].LeaseID != l.ID || len(n.FenceFailure[0].WorkloadIDs) != 1 {
		t.Fatalf("fence failure on node: %+v", n.FenceFailure)
	}
	// While blocked, even its holder's renewal is refused.
	p.sendEnv(node.TypeLeaseRenew, "", node.LeaseRenew{LeaseID: l.ID, FencingToken: l.FencingToken})
	env = f.expectRevoke(t, p, l.ID, node.RevokeSuperseded, l.FencingToken)
	p.sendEnv(node.TypeCommandResult, env.ID, node.CommandResult{Status: "error", Error: &node.ErrorBody{Code: string(abierrors.FenceFailed)}})
	p.barrier()

	// The operator's acknowledgement is delivered at once on the live session.
	if _, err := f.auth.FenceAck(ctx, f.node.ID, []string{l.ID}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.s.DeliverFenceAck(ctx, f.node.ID) }()
	env = p.next()
	if env.Type != node.TypeCommand {
		t.Fatalf("got %s, want command fence_ack", env.Type)
	}
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := f.reg.Get(ctx, f.node.ID); len(n.FenceAckPending) != 0 {
		t.Fatalf("pending after delivery: %v", n.FenceAckPending)
	}
}

// TestNodeReturnOrder is section 9: a node that held an expiring lease goes silent, the lease moves
// to another node after the gate, and the node comes back: its hello's lease is revoked (moved)
// before desired_state, and its renewal under the old token is refused.
func TestNodeReturnOrder(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	other, _ := enrollForTest(t, f.reg, "n2")
	l := f.grant(t, "svc_RET", f.node.ID, node.LeaseExpiring, 15*time.Second)
	f.clock.Advance(18*time.Second - time.Millisecond)
	if _, _, err := f.auth.Grant(ctx, fencing.GrantRequest{ResourceType: "service", ResourceID: "svc_RET", NodeID: other.ID, Mode: node.LeaseExpiring, Duration: 15 * time.Second}); !errors.Is(err, fencing.ErrHeld) {
		t.Fatalf("moved before the gate: %v", err)
	}
	f.clock.Advance(time.Millisecond)
	f.grant(t, "svc_RET", other.ID, node.LeaseExpiring, 15*time.Second)

	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, Leases: []node.HelloLease{{LeaseID: l.ID, ResourceType: "service",
		Mode: node.LeaseExpiring, FencingToken: 1, State: node.LeaseUncertain}}})
	if env := p.next(); env.Type != node.TypeWelcome {
		t.Fatalf("got %s", env.Type)
	}
	env := f.expectRevoke(t, p, l.ID, node.RevokeSuperseded, 2)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	if env := p.next(); env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want desired_state after the revoke", env.Type)
	}
	p.sendEnv(node.TypeLeaseRenew, "", node.LeaseRenew{LeaseID: l.ID, FencingToken: 1})
	env = f.expectRevoke(t, p, l.ID, node.RevokeMoved, 2)
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	p.barrier()
	if got, _ := f.auth.Get(ctx, l.ID); got.Holder != other.ID || got.FencingToken != 2 {
		t.Fatalf("the old holder's answers changed the lease: %+v", got)
	}
}

// TestNodeRemovalRevokesThenEnds is section 10 for a connected node: every lease it holds is
// revoked and awaited, then the session ends with fatal node_removed.
func TestNodeRemovalRevokesThenEnds(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	settle(t, p)
	a := f.grant(t, "svc_A", f.node.ID, node.LeaseLocal, 0)
	b := f.grant(t, "svc_B", f.node.ID, node.LeaseLocal, 0)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := f.s.RevokeAll(ctx, f.node.ID, node.RevokeDeleted)
		if err == nil {
			if _, _, err = f.reg.Remove(ctx, f.node.ID); err == nil {
				f.s.Remove(ctx, f.node.ID)
			}
		}
		done <- result{n, err}
	}()
	for _, l := range []*fencing.Lease{a, b} {
		env := f.expectRevoke(t, p, l.ID, node.RevokeDeleted, 1)
		expectSilence(t, p)
		p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	}
	p.expectError(string(abierrors.NodeRemoved), true)
	if r := <-done; r.err != nil || r.n != 2 {
		t.Fatalf("RevokeAll confirmed %d: %v", r.n, r.err)
	}
	for _, l := range []*fencing.Lease{a, b} {
		if got, _ := f.auth.Get(ctx, l.ID); got.Holder != "" {
			t.Fatalf("revoked lease still held: %+v", got)
		}
	}
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, _, err := p.ws.Read(ctx2); websocket.CloseStatus(err) == -1 && err == nil {
		t.Fatal("session still open after node_removed")
	}
}

// TestGrantDuringHandshakeIsDelivered: a lease granted to the node while its session is still in
// the handshake (no live session to send it to) is sent once the session is welcomed.
func TestGrantDuringHandshakeIsDelivered(t *testing.T) {
	t.Parallel()
	f := newLeaseFixture(t)
	ctx := context.Background()
	acked := f.grant(t, "svc_ACKED", f.node.ID, node.LeaseLocal, 0)
	if err := f.auth.RecordFenceFailure(ctx, f.node.ID, nodes.FenceFailure{LeaseID: acked.ID, FencingToken: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.auth.FenceAck(ctx, f.node.ID, []string{acked.ID}); err != nil {
		t.Fatal(err)
	}
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID})
	if env := p.next(); env.Type != node.TypeWelcome {
		t.Fatalf("got %s", env.Type)
	}
	env := p.next()
	if env.Type != node.TypeCommand {
		t.Fatalf("got %s, want command fence_ack", env.Type)
	}
	// The core waits for the answer; meanwhile the reconciler grants a lease to this node.
	l := f.grant(t, "svc_LATE", f.node.ID, node.LeaseLocal, 0)
	f.s.SendLeaseGrant(ctx, f.node.ID, l) // no live session yet: nothing is sent
	p.sendEnv(node.TypeCommandResult, env.ID, okResult())
	if env := p.next(); env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want desired_state", env.Type)
	}
	env = p.next()
	g, err := node.VerifyLeaseGrant(env.Body, f.pub)
	if env.Type != node.TypeLeaseGrant || err != nil || g.LeaseID != l.ID || g.FencingToken != l.FencingToken {
		t.Fatalf("got %s %+v %v, want the lease_grant decided during the handshake", env.Type, g, err)
	}
}
