package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// TestRotateSigningKey: a live node is sent signing_key_rotate signed by the
// key it pins, and everything after is signed by the new key; a node that
// was away names the old key in its hello and is handed the new one before
// its desired_state (docs/node-protocol.md section 5.21).
func TestRotateSigningKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.srv.Config.Handler.(*Server)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	nextPub, next, _ := ed25519.GenerateKey(rand.Reader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan []RotationResult, 1)
	go func() { done <- s.RotateSigningKey(ctx, next) }()
	env := p.next()
	for env.Type != node.TypeSigningKeyRotate {
		env = p.next()
	}
	got, _, err := node.VerifyRotate(env.Body, f.pub)
	if err != nil || !got.Equal(nextPub) {
		t.Fatalf("signing_key_rotate: %v; want the new key signed by the pinned one", err)
	}
	p.sendEnv(node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok"})
	if res := <-done; len(res) != 1 || !res[0].Acknowledged || res[0].Err != nil {
		t.Fatalf("rotation results %+v, want one acknowledged", res)
	}
	n, _ := f.reg.Get(ctx, f.node.ID)
	if _, _, err := f.reg.SetDesired(ctx, n, "h2", `{"workloads":[],"routes":[],"network":{}}`); err != nil {
		t.Fatal(err)
	}
	s.Push(ctx, f.node.ID)
	env = p.next()
	if _, err := node.Verify(env.Body, nextPub); env.Type != node.TypeDesiredState || err != nil {
		t.Fatalf("after the rotation got %s (%v), want desired_state signed by the new key", env.Type, err)
	}

	// A node that missed the rotation names the old key and is handed the new one first.
	p2, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p2.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, SigningKeyID: node.KeyID(f.pub)})
	if env := p2.next(); env.Type != node.TypeWelcome {
		t.Fatalf("got %s, want welcome", env.Type)
	}
	env = p2.next()
	if _, _, err := node.VerifyRotate(env.Body, f.pub); env.Type != node.TypeSigningKeyRotate || err != nil {
		t.Fatalf("got %s (%v), want signing_key_rotate signed by the old key before desired_state", env.Type, err)
	}
	env = p2.next()
	if _, err := node.Verify(env.Body, nextPub); env.Type != node.TypeDesiredState || err != nil {
		t.Fatalf("got %s (%v), want desired_state signed by the new key", env.Type, err)
	}
}
