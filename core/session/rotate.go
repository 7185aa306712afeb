package session

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"sync"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
)

// keyRing holds the current signing key and the retired ones.
type keyRing struct {
	mu      sync.Mutex
	rotate  sync.Mutex                    // serialises rotations
	current ed25519.PrivateKey            // mu must be held
	retired map[string]ed25519.PrivateKey // node.KeyID -> key; mu must be held
}

func (k *keyRing) get() ed25519.PrivateKey {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.current
}

// lookup returns the key whose public half has id, current or retired.
func (k *keyRing) lookup(id string) (ed25519.PrivateKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if keyIDOf(k.current) == id {
		return k.current, true
	}
	key, ok := k.retired[id]
	return key, ok
}

func keyIDOf(k ed25519.PrivateKey) string { return node.KeyID(k.Public().(ed25519.PublicKey)) }

// rotateMsg is signing_key_rotate handing over next, signed by pinned.
func rotateMsg(pinned, next ed25519.PrivateKey) (node.SigningKeyRotate, error) {
	r := node.SigningKeyRotate{PublicKey: base64.StdEncoding.EncodeToString(next.Public().(ed25519.PublicKey))}
	if err := node.SignRotate(&r, pinned); err != nil {
		return r, fmt.Errorf("sign signing_key_rotate: %w", err)
	}
	return r, nil
}

// rotateAtHandshake pins c to the current key. When the hello names a
// retired key the node still pins, it first sends signing_key_rotate
// signed by that key (section 5.21); the node handles it before the
// desired_state that follows, signed by the current key. A hello without a
// key id, or naming a key this core never held, changes nothing.
func (s *Server) rotateAtHandshake(ctx context.Context, c *conn, hello *node.Hello) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := s.keys.get()
	c.signKey = cur
	if hello.SigningKeyID == "" || hello.SigningKeyID == keyIDOf(cur) {
		return nil
	}
	pinned, ok := s.keys.lookup(hello.SigningKeyID)
	if !ok {
		s.log.Warn("node pins a signing key this core does not hold; it will refuse desired state", "node_id", c.nodeID, "key_id", hello.SigningKeyID)
		return nil
	}
	r, err := rotateMsg(pinned, cur)
	if err != nil {
		return err
	}
	s.log.Info("handing a node the rotated signing key", "node_id", c.nodeID, "from_key_id", hello.SigningKeyID, "key_id", r.KeyID)
	return s.write(ctx, c, node.TypeSigningKeyRotate, "", r)
}

// RotationResult is what [Server.RotateSigningKey] saw of one live session.
type RotationResult struct {
	NodeID string
	// Acknowledged reports whether the node answered command_result ok.
	Acknowledged bool
	Err          error
}

// RotateSigningKey replaces the cluster signing key with next
// (docs/node-protocol.md section 5.21): new sessions are signed with next
// from now on (a node whose hello names the previous key is handed next at
// its handshake), and every live session is sent signing_key_rotate signed
// by the key it pins, then signs everything after with next. It waits for
// each node's answer until ctx ends and returns one result per live
// session. The caller has persisted next (identity.RotateSigningKey) so a
// restart keeps it. Safe to call from any goroutine; rotations run one at
// a time.
func (s *Server) RotateSigningKey(ctx context.Context, next ed25519.PrivateKey) []RotationResult {
	s.keys.rotate.Lock()
	defer s.keys.rotate.Unlock()
	s.keys.mu.Lock()
	prev := s.keys.current
	s.keys.retired[keyIDOf(prev)] = prev
	s.keys.current = next
	s.keys.mu.Unlock()

	s.mu.Lock()
	live := make([]*conn, 0, len(s.sessions))
	for _, c := range s.sessions {
		live = append(live, c)
	}
	s.mu.Unlock()
	type pending struct {
		c  *conn
		ch chan node.CommandResult
		id string
	}
	var out []RotationResult
	var waits []pending
	for _, c := range live {
		id := identity.NewID("msg_")
		ch := make(chan node.CommandResult, 1)
		c.mu.Lock()
		pinned := c.signKey
		if pinned == nil || keyIDOf(pinned) == keyIDOf(next) {
			// The handshake has not pinned this session yet (it takes
			// next), or it already holds next.
			c.mu.Unlock()
			continue
		}
		r, err := rotateMsg(pinned, next)
		if err == nil {
			c.waits.mu.Lock()
			c.waits.results[id] = ch
			c.waits.mu.Unlock()
			err = s.writeID(ctx, c, id, node.TypeSigningKeyRotate, "", r)
		}
		if err == nil {
			c.signKey = next
		}
		c.mu.Unlock()
		if err != nil {
			out = append(out, RotationResult{NodeID: c.nodeID, Err: err})
			continue
		}
		waits = append(waits, pending{c: c, ch: ch, id: id})
	}
	for _, w := range waits {
		res := RotationResult{NodeID: w.c.nodeID}
		select {
		case r := <-w.ch:
			res.Acknowledged = r.Status == "ok"
			if !res.Acknowledged {
				res.Err = fmt.Errorf("node answered signing_key_rotate with %s: %s", r.Status, r.Detail)
			}
		case <-ctx.Done():
			res.Err = fmt.Errorf("await the node's answer to signing_key_rotate: %w", ctx.Err())
		}
		w.c.waits.mu.Lock()
		delete(w.c.waits.results, w.id)
		w.c.waits.mu.Unlock()
		out = append(out, res)
	}
	s.log.Info("cluster signing key rotated", "key_id", keyIDOf(next), "live_sessions", len(out))
	return out
}

// PublicKey returns the cluster signing key's public half as it is now,
// after any rotation; enrollment answers hand it to new nodes to pin
// (docs/node-protocol.md sections 2.4 and 5.21). Safe from any goroutine.
func (s *Server) PublicKey() ed25519.PublicKey {
	s.keys.mu.Lock()
	defer s.keys.mu.Unlock()
	return s.keys.current.Public().(ed25519.PublicKey)
}
