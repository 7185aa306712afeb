package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
)

// fakeCommands answers every command with its kind and streams one line,
// then waits for its stream to be closed.
type fakeCommands struct{}

var _ Commands = fakeCommands{}

func (fakeCommands) Command(_ context.Context, cmd node.Command) node.CommandResult {
	return node.CommandResult{Status: "ok", Detail: cmd.Kind}
}

func (fakeCommands) Stream(ctx context.Context, open node.StreamOpen, send func([]node.LogLine) error) error {
	if err := send([]node.LogLine{{Stream: "output", Line: open.StreamID}}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func decode[T any](t *testing.T, env node.Envelope) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(env.Body, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCommandsAndStreamLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	startAgent(t, fc, func(c *Config) { c.Commands = fakeCommands{} })
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)

	c.send(ctx, node.TypeCommand, "msg_cmd", node.Command{Kind: node.CommandProbe})
	env := c.await(ctx, node.TypeCommandResult)
	if res := decode[node.CommandResult](t, env); env.Re != "msg_cmd" || res.Status != "ok" || res.Detail != "probe" {
		t.Fatalf("command_result %+v re %q", res, env.Re)
	}
	// 32 streams open; the 33rd is refused with stream_limit.
	for i := range node.MaxStreamsPerSession {
		id := fmt.Sprintf("msg_s%02d", i)
		c.send(ctx, node.TypeStreamOpen, id, node.StreamOpen{StreamID: id, Kind: node.StreamAppLogs, Params: json.RawMessage(`{"workload_id":"wl_a"}`)})
		env := c.await(ctx, node.TypeStreamData)
		if d := decode[node.StreamData](t, env); d.StreamID != id || d.Seq != 1 || d.Lines[0].Line != id {
			t.Fatalf("stream_data %+v, want the first of %s", d, id)
		}
	}
	c.send(ctx, node.TypeStreamOpen, "msg_s32", node.StreamOpen{StreamID: "msg_s32", Kind: node.StreamAppLogs})
	env = c.await(ctx, node.TypeCommandResult)
	if res := decode[node.CommandResult](t, env); env.Re != "msg_s32" || res.Status != "error" || res.Error == nil || res.Error.Code != "stream_limit" {
		t.Fatalf("33rd stream_open answered %+v", res)
	}
	// stream_close ends one with cancelled, which frees a slot.
	c.send(ctx, node.TypeStreamClose, "msg_close", node.StreamClose{StreamID: "msg_s00"})
	env = c.await(ctx, node.TypeStreamEnd)
	if e := decode[node.StreamEnd](t, env); e.StreamID != "msg_s00" || e.Reason != node.StreamCancelled {
		t.Fatalf("stream_end %+v", e)
	}
	c.send(ctx, node.TypeStreamClose, "msg_close2", node.StreamClose{StreamID: "msg_unknown"})
	c.send(ctx, node.TypeStreamOpen, "msg_s33", node.StreamOpen{StreamID: "msg_s33", Kind: node.StreamAppLogs})
	if d := decode[node.StreamData](t, c.await(ctx, node.TypeStreamData)); d.StreamID != "msg_s33" {
		t.Fatalf("stream after a close: %+v", d)
	}
}

func TestSigningKeyRotate(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, func(c *Config) { c.Keys = c.Store.(*localstore.Store) })
	if err := a.store.SaveIdentity(ctx, localstore.Identity{NodeID: "nod_test", ClusterPublicKey: base64.StdEncoding.EncodeToString(fc.pub)}); err != nil {
		t.Fatal(err)
	}
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	newPub, newKey, _ := ed25519.GenerateKey(rand.Reader)
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)

	// Signed by a key the node does not pin: refused, old key kept.
	bad := node.SigningKeyRotate{PublicKey: base64.StdEncoding.EncodeToString(newPub)}
	if err := node.SignRotate(&bad, stranger); err != nil {
		t.Fatal(err)
	}
	c.send(ctx, node.TypeSigningKeyRotate, "msg_bad", bad)
	if e := decode[node.ErrorBody](t, c.await(ctx, node.TypeError)); e.Code != "bad_signature" || e.Fatal {
		t.Fatalf("error %+v", e)
	}
	good := node.SigningKeyRotate{PublicKey: base64.StdEncoding.EncodeToString(newPub)}
	if err := node.SignRotate(&good, fc.key); err != nil {
		t.Fatal(err)
	}
	c.send(ctx, node.TypeSigningKeyRotate, "msg_rot", good)
	env := c.await(ctx, node.TypeCommandResult)
	if res := decode[node.CommandResult](t, env); res.Status != "ok" || env.Re != "msg_rot" {
		t.Fatalf("rotation answered %+v", res)
	}
	id, err := a.store.Identity(ctx)
	if err != nil || id.ClusterPublicKey != good.PublicKey {
		t.Fatalf("stored key %v %v", id, err)
	}
	// Desired state signed by the old key is now refused; by the new one, stored.
	c.send(ctx, node.TypeDesiredState, "msg_old", fc.signed(5, fc.key))
	if e := decode[node.ErrorBody](t, c.await(ctx, node.TypeError)); e.Code != "bad_signature" {
		t.Fatalf("old key accepted after rotation: %+v", e)
	}
	c.send(ctx, node.TypeDesiredState, "msg_new", fc.signed(6, newKey))
	if res := decode[node.CommandResult](t, c.await(ctx, node.TypeCommandResult)); res.Status != "ok" {
		t.Fatalf("new key refused: %+v", res)
	}
}
