package session

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/store"
)

// handshakeAnswerTimeout bounds how long the handshake waits for the node's command_result to one
// lease_revoke or fence_ack. A fence takes at most M (a few seconds); the bound only ends a stuck
// session, which the node then redials.
const handshakeAnswerTimeout = 2 * time.Minute

// revokeAnswerTimeout bounds the background wait for a command_result to a lease_revoke sent on a
// live session.
const revokeAnswerTimeout = 2 * time.Minute

// handshakeKey is the key the node pins when it says hello: the retired key its hello names if this
// core holds it, else the current one. Lease messages sent before signing_key_rotate are signed with
// it, so the node can verify them.
func (s *Server) handshakeKey(hello *node.Hello) ed25519.PrivateKey {
	if hello.SigningKeyID != "" {
		if k, ok := s.keys.lookup(hello.SigningKeyID); ok {
			return k
		}
	}
	return s.keys.get()
}

// sessionKey is the key this session signs with now.
func (s *Server) sessionKey(c *conn) ed25519.PrivateKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.signKey == nil {
		return s.keys.get()
	}
	return c.signKey
}

// awaitAnswer waits during the handshake for the command_result answering request id, handling
// every other message the node sends meanwhile as in the steady state. ch was registered in
// c.waits before the request was written. It returns the answer, or done (a reason the session
// ends) when the node broke the session or did not answer within handshakeAnswerTimeout.
func (s *Server) awaitAnswer(ctx context.Context, c *conn, id string, ch chan node.CommandResult) (res node.CommandResult, done string) {
	defer func() {
		c.waits.mu.Lock()
		delete(c.waits.results, id)
		c.waits.mu.Unlock()
	}()
	deadline := time.Now().Add(handshakeAnswerTimeout)
	for time.Now().Before(deadline) {
		env, err := s.read(ctx, c)
		if err != nil && !errors.Is(err, errTooLarge) && !errors.Is(err, errMalformed) {
			return res, readReason(err)
		}
		if err == nil {
			if d := s.handle(ctx, c, env); d != "" {
				return res, d
			}
		}
		select {
		case r := <-ch:
			return r, ""
		default:
		}
	}
	return res, "handshake_answer_timeout"
}

// request writes a message whose command_result is awaited, and returns its id and channel.
func (s *Server) request(ctx context.Context, c *conn, typ node.Type, body any) (string, chan node.CommandResult, error) {
	id := identity.NewID("msg_")
	ch := make(chan node.CommandResult, 1)
	c.waits.mu.Lock()
	c.waits.results[id] = ch
	c.waits.mu.Unlock()
	if err := s.writeID(ctx, c, id, typ, "", body); err != nil {
		c.waits.mu.Lock()
		delete(c.waits.results, id)
		c.waits.mu.Unlock()
		return "", nil, err
	}
	return id, ch, nil
}

// staleReason says why a lease the node listed in hello is stale, or "" when the node rightly
// holds it (docs/node-protocol.md sections 5.1 and 9 step 2).
func staleReason(l *fencing.Lease, nodeID string, hl node.HelloLease) string {
	switch {
	case l == nil || l.Deleted:
		return node.RevokeDeleted
	case hl.FencingToken < l.FencingToken:
		return node.RevokeSuperseded
	case l.Holder != nodeID:
		return node.RevokeMoved
	case hl.FencingToken > l.FencingToken:
		return node.RevokeSuperseded // a token this core never issued
	}
	return ""
}

// leaseHandshake runs the lease part of the handshake, right after welcome (docs/node-protocol.md
// section 4.2 rules 3 and 4):
//
//  1. every lease of hello that is stale (unknown to the core, deleted, held by another node, or
//     under another token) is revoked, one lease_revoke at a time, each awaited: the node fences
//     it before it handles anything else; an answer with error fence_failed records the failed
//     fence;
//  2. a lease the core says this node holds but the node does not list as held or uncertain under
//     the same token (it fenced it, or forgot it) is released, so it is granted again with a higher
//     token (a node refuses a grant repeating a token it no longer holds);
//  3. when an operator acknowledged failed fences of this node that it has not confirmed yet,
//     command fence_ack is sent and awaited; ok clears the pending acknowledgement.
//
// key signs the revokes (the key the node pins). It returns a non-empty reason when the session
// must end.
func (s *Server) leaseHandshake(ctx context.Context, c *conn, hello *node.Hello, key ed25519.PrivateKey) string {
	la := s.cfg.Leases
	if la == nil {
		return ""
	}
	listed := map[string]node.HelloLease{}
	for _, hl := range hello.Leases {
		l, err := la.Get(ctx, hl.LeaseID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Error("read lease for hello", "node_id", c.nodeID, "lease_id", hl.LeaseID, "err", err)
			return "store_error"
		}
		if err != nil {
			l = nil
		}
		reason := staleReason(l, c.nodeID, hl)
		if reason == "" {
			listed[hl.LeaseID] = hl
			if hl.State == node.LeaseHeld || hl.State == node.LeaseUncertain {
				c.helloHeld.Store(hl.LeaseID, hl.FencingToken)
			}
			continue
		}
		token := hl.FencingToken
		if l != nil && l.FencingToken > token {
			token = l.FencingToken
		}
		rv, err := fencing.RevokeMessage(hl.LeaseID, token, reason, key)
		if err != nil {
			s.log.Error("sign lease_revoke", "node_id", c.nodeID, "err", err)
			return "internal_error"
		}
		id, ch, err := s.request(ctx, c, node.TypeLeaseRevoke, rv)
		if err != nil {
			return "write_failed"
		}
		s.log.Info("stale lease revoked at hello", "node_id", c.nodeID, "lease_id", hl.LeaseID, "reason", reason, "fencing_token", token)
		res, done := s.awaitAnswer(ctx, c, id, ch)
		if done != "" {
			return done
		}
		s.onRevokeAnswer(ctx, c.nodeID, hl.LeaseID, hl.ResourceID, hl.FencingToken, false, res)
	}
	held, err := la.HeldBy(ctx, c.nodeID)
	if err != nil {
		s.log.Error("read leases held by node", "node_id", c.nodeID, "err", err)
		return "store_error"
	}
	released := false
	for _, l := range held {
		hl, ok := listed[l.ID]
		if ok && hl.FencingToken == l.FencingToken && (hl.State == node.LeaseHeld || hl.State == node.LeaseUncertain) {
			continue
		}
		if l.Blocked() {
			continue // an acknowledgement moves it, not this node
		}
		if _, err := la.Release(ctx, l.ID, c.nodeID, l.FencingToken); err != nil && !errors.Is(err, fencing.ErrStale) {
			s.log.Error("release a lease the node no longer holds", "node_id", c.nodeID, "lease_id", l.ID, "err", err)
			return "store_error"
		}
		s.log.Info("lease released: the node does not hold it any more", "node_id", c.nodeID, "lease_id", l.ID, "fencing_token", l.FencingToken)
		released = true
	}
	if released {
		s.cfg.OnChange("lease.released")
	}
	n, err := s.cfg.Nodes.Get(ctx, c.nodeID)
	if err != nil {
		s.log.Error("read node for fence_ack", "node_id", c.nodeID, "err", err)
		return "store_error"
	}
	if len(n.FenceAckPending) == 0 {
		return ""
	}
	id, ch, err := s.request(ctx, c, node.TypeCommand, fenceAckCommand(n.FenceAckPending))
	if err != nil {
		return "write_failed"
	}
	res, done := s.awaitAnswer(ctx, c, id, ch)
	if done != "" {
		return done
	}
	s.onFenceAckAnswer(ctx, c.nodeID, n.FenceAckPending, res)
	return ""
}

func fenceAckCommand(ids []string) node.Command {
	raw, _ := json.Marshal(node.FenceAckParams{LeaseIDs: ids})
	return node.Command{Kind: node.CommandFenceAck, Params: raw}
}

func (s *Server) onFenceAckAnswer(ctx context.Context, nodeID string, ids []string, res node.CommandResult) {
	if res.Status != "ok" {
		s.log.Warn("node refused fence_ack; it is sent again at its next session", "node_id", nodeID, "detail", res.Detail)
		return
	}
	if err := s.cfg.Leases.AckDelivered(ctx, nodeID, ids); err != nil {
		s.log.Error("record fence_ack delivered", "node_id", nodeID, "err", err)
		return
	}
	s.log.Info("node confirmed the fence acknowledgement", "node_id", nodeID, "lease_ids", ids, "detail", res.Detail)
}

// onRevokeAnswer handles the command_result to a lease_revoke: ok from the holder under the
// current token frees the lease at once (release is true only when the revoke was of the node's
// current holding); error fence_failed records the failed fence on the lease and the node.
func (s *Server) onRevokeAnswer(ctx context.Context, nodeID, leaseID, resourceID string, token int64, release bool, res node.CommandResult) {
	if res.Status == "ok" {
		if release {
			if _, err := s.cfg.Leases.Release(ctx, leaseID, nodeID, token); err == nil {
				s.cfg.OnChange("lease.released")
			} else if !errors.Is(err, fencing.ErrStale) {
				s.log.Error("release revoked lease", "node_id", nodeID, "lease_id", leaseID, "err", err)
			}
		}
		return
	}
	if res.Error != nil && res.Error.Code == string(abierrors.FenceFailed) {
		if err := s.cfg.Leases.RecordFenceFailure(ctx, nodeID, nodes.FenceFailure{LeaseID: leaseID, ResourceID: resourceID,
			FencingToken: token, WorkloadIDs: []string{}, Detail: res.Detail}); err != nil {
			s.log.Error("record failed fence", "node_id", nodeID, "lease_id", leaseID, "err", err)
		}
		s.cfg.OnChange("lease.fence_failed")
		return
	}
	s.log.Warn("node refused a lease_revoke", "node_id", nodeID, "lease_id", leaseID, "detail", res.Detail)
}

// onLeaseRenew answers a lease_renew (section 5.5): lease_grant with the same token and re set to
// the renewal's id while the node holds the lease under that token; lease_revoke with the core's
// token when the renewal is stale, blocked or for a lease that is gone. A store failure answers
// nothing: the node stays uncertain and renews again.
func (s *Server) onLeaseRenew(ctx context.Context, c *conn, env *node.Envelope) {
	var rn node.LeaseRenew
	if err := json.Unmarshal(env.Body, &rn); err != nil || rn.LeaseID == "" {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "lease_renew body is malformed", false)
		return
	}
	if s.cfg.Leases == nil {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "this core grants no leases", false)
		return
	}
	l, err := s.cfg.Leases.Renew(ctx, rn.LeaseID, c.nodeID, rn.FencingToken)
	key := s.sessionKey(c)
	if err == nil {
		g, err := l.GrantMessage(key)
		if err != nil {
			s.log.Error("sign lease_grant", "node_id", c.nodeID, "err", err)
			return
		}
		if err := s.write(ctx, c, node.TypeLeaseGrant, env.ID, g); err != nil {
			s.log.Info("answer lease_renew", "node_id", c.nodeID, "err", err)
		}
		return
	}
	reason := ""
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, fencing.ErrDeleted):
		reason = node.RevokeDeleted
	case errors.Is(err, fencing.ErrStale) && l.Holder != c.nodeID:
		reason = node.RevokeMoved
	case errors.Is(err, fencing.ErrStale), errors.Is(err, fencing.ErrBlocked):
		reason = node.RevokeSuperseded
	default:
		s.log.Error("renew lease", "node_id", c.nodeID, "lease_id", rn.LeaseID, "err", err)
		return
	}
	token := rn.FencingToken
	if l != nil && l.FencingToken > token {
		token = l.FencingToken
	}
	s.log.Info("lease renewal refused; revoking", "node_id", c.nodeID, "lease_id", rn.LeaseID, "reason", reason, "fencing_token", token)
	s.revokeAsync(ctx, c, rn.LeaseID, "", token, reason, false)
}

// revokeAsync sends a signed lease_revoke on c and handles its answer in the background (the
// read loop must keep running to receive it).
func (s *Server) revokeAsync(ctx context.Context, c *conn, leaseID, resourceID string, token int64, reason string, release bool) {
	rv, err := fencing.RevokeMessage(leaseID, token, reason, s.sessionKey(c))
	if err != nil {
		s.log.Error("sign lease_revoke", "node_id", c.nodeID, "err", err)
		return
	}
	id, ch, err := s.request(ctx, c, node.TypeLeaseRevoke, rv)
	if err != nil {
		s.log.Info("send lease_revoke", "node_id", c.nodeID, "err", err)
		return
	}
	go func() {
		defer func() {
			c.waits.mu.Lock()
			delete(c.waits.results, id)
			c.waits.mu.Unlock()
		}()
		t := time.NewTimer(revokeAnswerTimeout)
		defer t.Stop()
		select {
		case res := <-ch:
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			s.onRevokeAnswer(actx, c.nodeID, leaseID, resourceID, token, release, res)
		case <-c.ctx.Done():
		case <-t.C:
			s.log.Warn("no answer to lease_revoke", "node_id", c.nodeID, "lease_id", leaseID)
		}
	}()
}

// onLeaseEvent handles node.fenced and node.fence_failed (section 8.5): a failed fence is recorded
// on the lease and the node; a confirmed fence of the node's current holding frees the lease.
func (s *Server) onLeaseEvent(ctx context.Context, c *conn, ev *node.Event) {
	if s.cfg.Leases == nil || (ev.Type != node.EventNodeFenced && ev.Type != node.EventNodeFenceFailed) {
		return
	}
	raw, _ := json.Marshal(ev.Data)
	var d node.FenceEventData
	if err := json.Unmarshal(raw, &d); err != nil || d.LeaseID == "" {
		s.log.Warn("fence event without a lease", "node_id", c.nodeID, "type", ev.Type)
		return
	}
	if ev.Type == node.EventNodeFenceFailed {
		if d.WorkloadIDs == nil {
			d.WorkloadIDs = []string{}
		}
		if err := s.cfg.Leases.RecordFenceFailure(ctx, c.nodeID, nodes.FenceFailure{LeaseID: d.LeaseID, ResourceID: d.ResourceID,
			FencingToken: d.FencingToken, WorkloadIDs: d.WorkloadIDs, Detail: d.Reason}); err != nil {
			s.log.Error("record failed fence", "node_id", c.nodeID, "lease_id", d.LeaseID, "err", err)
		}
		s.cfg.OnChange("lease.fence_failed")
		return
	}
	if _, err := s.cfg.Leases.Release(ctx, d.LeaseID, c.nodeID, d.FencingToken); err == nil {
		s.log.Info("lease released: the node fenced it", "node_id", c.nodeID, "lease_id", d.LeaseID, "fencing_token", d.FencingToken)
		s.cfg.OnChange("lease.released")
	} else if !errors.Is(err, fencing.ErrStale) && !errors.Is(err, store.ErrNotFound) {
		s.log.Error("release fenced lease", "node_id", c.nodeID, "lease_id", d.LeaseID, "err", err)
	}
}

// grantHeld sends lease_grant, once the session is welcomed, for every lease the core says the
// node holds that its hello did not list as held or uncertain under the same token: a grant decided
// while the session was still in its handshake found no live session to go to.
func (s *Server) grantHeld(ctx context.Context, c *conn) {
	if s.cfg.Leases == nil {
		return
	}
	held, err := s.cfg.Leases.HeldBy(ctx, c.nodeID)
	if err != nil {
		s.log.Error("read leases held by node", "node_id", c.nodeID, "err", err)
		return
	}
	for i := range held {
		l := &held[i]
		if tok, ok := c.helloHeld.Load(l.ID); ok && tok.(int64) == l.FencingToken {
			continue
		}
		if l.Blocked() || l.Deleted {
			continue
		}
		s.SendLeaseGrant(ctx, c.nodeID, l)
	}
}

// SendLeaseGrant sends l's signed lease_grant to nodeID's live session, if any (docs/node-protocol.md
// section 5.12). It returns at once; a node without a session learns the lease at its next hello
// (it is released there and granted again). Safe from any goroutine.
func (s *Server) SendLeaseGrant(ctx context.Context, nodeID string, l *fencing.Lease) {
	c := s.live(nodeID)
	if c == nil || l == nil || l.Holder != nodeID {
		return
	}
	g, err := l.GrantMessage(s.sessionKey(c))
	if err != nil {
		s.log.Error("sign lease_grant", "node_id", nodeID, "err", err)
		return
	}
	if err := s.write(ctx, c, node.TypeLeaseGrant, "", g); err != nil {
		s.log.Info("send lease_grant", "node_id", nodeID, "err", err)
		return
	}
	s.log.Info("lease_grant sent", "node_id", nodeID, "lease_id", l.ID, "fencing_token", l.FencingToken, "mode", l.Mode)
}

// RevokeLease sends a signed lease_revoke of l under l's current token to nodeID's live session, if
// any, and handles the answer in the background: ok from the current holder frees the lease, error
// fence_failed records the failed fence. Returns at once.
func (s *Server) RevokeLease(ctx context.Context, nodeID string, l *fencing.Lease, reason string) {
	c := s.live(nodeID)
	if c == nil || l == nil {
		return
	}
	s.revokeAsync(ctx, c, l.ID, l.ResourceID, l.FencingToken, reason, l.Holder == nodeID)
}

// RevokeAll revokes every lease nodeID holds on its live session and waits for each answer, bounded
// by ctx (node removal of a connected node, section 10). It returns the number of leases revoked
// and confirmed, and [ErrNotConnected] when the node has no live session.
func (s *Server) RevokeAll(ctx context.Context, nodeID, reason string) (int, error) {
	c := s.live(nodeID)
	if c == nil {
		return 0, ErrNotConnected
	}
	if s.cfg.Leases == nil {
		return 0, nil
	}
	held, err := s.cfg.Leases.HeldBy(ctx, nodeID)
	if err != nil {
		return 0, err
	}
	confirmed := 0
	for _, l := range held {
		rv, err := fencing.RevokeMessage(l.ID, l.FencingToken, reason, s.sessionKey(c))
		if err != nil {
			return confirmed, err
		}
		id, ch, err := s.request(ctx, c, node.TypeLeaseRevoke, rv)
		if err != nil {
			return confirmed, err
		}
		var res node.CommandResult
		select {
		case res = <-ch:
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		c.waits.mu.Lock()
		delete(c.waits.results, id)
		c.waits.mu.Unlock()
		if res.Status == "" {
			return confirmed, fmt.Errorf("await the answer to lease_revoke %s: %w", l.ID, errors.Join(ctx.Err(), c.ctx.Err()))
		}
		s.onRevokeAnswer(ctx, nodeID, l.ID, l.ResourceID, l.FencingToken, true, res)
		if res.Status == "ok" {
			confirmed++
		}
	}
	return confirmed, nil
}

// DeliverFenceAck sends command fence_ack with nodeID's pending acknowledgements on its live
// session and waits for the answer, bounded by ctx (section 8.5 step 4). ok clears them; a node
// without a session gets them at its next handshake. Errors: [ErrNotConnected], ctx's, a store or
// write error.
func (s *Server) DeliverFenceAck(ctx context.Context, nodeID string) error {
	n, err := s.cfg.Nodes.Get(ctx, nodeID)
	if err != nil {
		return err
	}
	if len(n.FenceAckPending) == 0 || s.cfg.Leases == nil {
		return nil
	}
	res, err := s.Command(ctx, nodeID, fenceAckCommand(n.FenceAckPending))
	if err != nil {
		return err
	}
	s.onFenceAckAnswer(ctx, nodeID, n.FenceAckPending, *res)
	return nil
}
