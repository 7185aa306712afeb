package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/nodeplugins/fake"
)

func (c *coreConn) sendRe(ctx context.Context, typ node.Type, id, re string, body any) {
	c.t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	frame, _ := json.Marshal(node.Envelope{V: 1, Type: typ, ID: id, Re: re, Body: raw})
	if err := c.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		c.t.Fatal(err)
	}
}

// awaitRe reads until an answer to re arrives.
func (c *coreConn) awaitRe(ctx context.Context, re string) node.Envelope {
	c.t.Helper()
	for {
		env := c.read(ctx)
		if env.Re == re {
			return env
		}
	}
}

func signedGrant(t *testing.T, key ed25519.PrivateKey, token int64) node.LeaseGrant {
	t.Helper()
	g := node.LeaseGrant{LeaseID: "lse_a", ResourceType: node.LeaseResourceService, ResourceID: "svc_a",
		Mode: node.LeaseExpiring, FencingToken: token, DurationMS: 15000, GrantedAt: time.Now().UTC().Truncate(time.Second)}
	if err := node.SignLeaseGrant(&g, key); err != nil {
		t.Fatal(err)
	}
	return g
}

func signedRevoke(t *testing.T, key ed25519.PrivateKey, token int64) node.LeaseRevoke {
	t.Helper()
	r := node.LeaseRevoke{LeaseID: "lse_a", FencingToken: token, Reason: node.RevokeMoved}
	if err := node.SignLeaseRevoke(&r, key); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLeaseMessages runs lease_grant, lease_renew and lease_revoke over a
// real session against the real lease manager and the fake driver: a first
// grant makes the node renew at once and the answer makes the lease held;
// bad signatures and lower tokens are refused; a revoke is fenced and
// answered before the next message is handled.
func TestLeaseMessages(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	drv, err := fake.New(fake.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	var mg *lease.Manager
	var st *localstore.Store
	startAgent(t, fc, func(cfg *Config) {
		st = cfg.Store.(*localstore.Store)
		mg, err = lease.New(ctx, lease.Config{Store: st, Driver: drv, BootID: "boot-1", NodeID: "nod_test",
			Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Leases = mg
	})
	mctx, mcancel := context.WithCancel(context.Background())
	mdone := make(chan struct{})
	go func() { defer close(mdone); _ = mg.Run(mctx) }()
	t.Cleanup(func() { mcancel(); <-mdone })

	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	g := signedGrant(t, fc.key, 7)
	c.sendRe(ctx, node.TypeLeaseGrant, "msg_g1", "", g)
	renew := c.await(ctx, node.TypeLeaseRenew)
	var rb node.LeaseRenew
	if err := json.Unmarshal(renew.Body, &rb); err != nil || rb.LeaseID != "lse_a" || rb.FencingToken != 7 {
		t.Fatalf("lease_renew body %s, %v", renew.Body, err)
	}
	if l, _ := mg.Lease("lse_a"); l.State != node.LeaseUncertain {
		t.Fatalf("lease before the renewal is answered = %+v, want uncertain", l)
	}
	c.sendRe(ctx, node.TypeLeaseGrant, "msg_g2", renew.ID, g)
	c.send(ctx, node.TypePing, "msg_ping0", struct{}{})
	c.awaitRe(ctx, "msg_ping0") // the grant before it was applied
	if l, _ := mg.Lease("lse_a"); l.State != node.LeaseHeld || l.Token != 7 {
		t.Fatalf("lease after the answered renewal = %+v, want held with token 7", l)
	}

	_, other, _ := ed25519.GenerateKey(rand.Reader)
	c.sendRe(ctx, node.TypeLeaseGrant, "msg_bad", "", signedGrant(t, other, 8))
	if env := c.awaitRe(ctx, "msg_bad"); env.Type != node.TypeError || !hasCode(env, "bad_signature") {
		t.Errorf("grant signed by another key answered %s %s; want error bad_signature", env.Type, env.Body)
	}
	c.sendRe(ctx, node.TypeLeaseGrant, "msg_low", "", signedGrant(t, fc.key, 6))
	if env := c.awaitRe(ctx, "msg_low"); env.Type != node.TypeError || !hasCode(env, "bad_message") {
		t.Errorf("lower-token grant answered %s %s; want error bad_message", env.Type, env.Body)
	}

	r, err := drv.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_s", Command: []string{"db"},
		Mutation: pluginapi.Mutation{IdempotencyKey: "k1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutWorkload(ctx, localstore.Workload{WorkloadID: "wl_s", Driver: "fake", Phase: "running", LeaseID: "lse_a",
		DriverHandle: localstore.DriverHandle{Version: r.State.Handle.Version, Data: r.State.Handle.Data}}); err != nil {
		t.Fatal(err)
	}
	c.sendRe(ctx, node.TypeLeaseRevoke, "msg_rv0", "", signedRevoke(t, fc.key, 6))
	if env := c.awaitRe(ctx, "msg_rv0"); env.Type != node.TypeError || !hasCode(env, "bad_message") {
		t.Errorf("lower-token revoke answered %s %s; want error bad_message", env.Type, env.Body)
	}
	if l, _ := mg.Lease("lse_a"); l.State != node.LeaseHeld {
		t.Errorf("lease after a refused revoke = %+v, want held", l)
	}

	c.sendRe(ctx, node.TypeLeaseRevoke, "msg_rv1", "", signedRevoke(t, fc.key, 7))
	c.send(ctx, node.TypePing, "msg_ping1", struct{}{})
	for {
		env := c.read(ctx)
		if env.Re == "msg_ping1" {
			t.Fatalf("pong before the revoke's command_result: the revoke did not block the read loop")
		}
		if env.Re != "msg_rv1" {
			continue
		}
		var res node.CommandResult
		if err := json.Unmarshal(env.Body, &res); err != nil || env.Type != node.TypeCommandResult || res.Status != "ok" {
			t.Fatalf("revoke answered %s %s", env.Type, env.Body)
		}
		if _, err := drv.Inspect(ctx, &runtime.InspectRequest{WorkloadID: "wl_s"}); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("wl_s still known to the driver when the revoke was answered: %v", err)
		}
		break
	}
	c.awaitRe(ctx, "msg_ping1")
	if l, _ := mg.Lease("lse_a"); l.State != node.LeaseRevoked || l.Fence != lease.FenceDone {
		t.Errorf("lease after the revoke = %+v, want revoked and fenced", l)
	}
}

func hasCode(env node.Envelope, code string) bool {
	var eb node.ErrorBody
	return json.Unmarshal(env.Body, &eb) == nil && eb.Code == code && !eb.Fatal
}
