package node

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gowebpki/jcs"
)

// Lease message types (docs/node-protocol.md sections 5.5, 5.12, 5.13 and 8).
const (
	TypeLeaseGrant  Type = "lease_grant"  // core to node; also the answer to lease_renew
	TypeLeaseRevoke Type = "lease_revoke" // core to node; answered by command_result
	TypeLeaseRenew  Type = "lease_renew"  // node to core; expiring leases only
)

// CommandFenceAck is the command kind carrying an operator's acknowledgement
// of failed fences (section 5.17); its params are [FenceAckParams].
const CommandFenceAck = "fence_ack"

// LeaseMode says whether a lease expires with the holder's silence.
type LeaseMode string

// Lease modes (section 8).
const (
	// LeaseLocal never expires with the session: it moves only by an
	// explicit revoke or an operator declaring the holder lost.
	LeaseLocal LeaseMode = "local"
	// LeaseExpiring is valid for DurationMS after the send time of the
	// renewal that made it held, and is renewed every DurationMS/3.
	LeaseExpiring LeaseMode = "expiring"
)

// LeaseState is the node-side state of one lease (section 8).
type LeaseState string

// Node-side lease states.
const (
	LeaseHeld      LeaseState = "held"      // may run its stateful workloads
	LeaseUncertain LeaseState = "uncertain" // granted, renewal unanswered: keep running, start nothing
	LeaseExpired   LeaseState = "expired"   // validity ran out: fenced
	LeaseRevoked   LeaseState = "revoked"   // revoked by the core: fenced
)

// Lease resource types. v1 leases services only.
const LeaseResourceService = "service"

// Lease revoke reasons (section 5.13).
const (
	RevokeMoved      = "moved"      // granted to another node
	RevokeDeleted    = "deleted"    // the resource is gone
	RevokeSuperseded = "superseded" // a higher token exists (operator lost/fence-ack, stale hello)
	RevokeLost       = "lost"       // an operator declared this node lost
	// RevokeDrain: the node drains; it stops the lease's workloads and answers ok, which frees
	// the lease for a grant to another node (a handover in order, docs/operating.md).
	RevokeDrain = "drain"
)

// MinLeaseDuration is the shortest expiring lease; a shorter request is
// refused (section 8.4).
const MinLeaseDuration = 3000 * time.Millisecond

// LeaseMargin returns M = max(1000 ms, D/10) for an expiring lease of
// duration d (section 8.4): the node's validity is t_send + D - M and the
// core grants the lease to another holder no earlier than T_grant + D + 2M.
func LeaseMargin(d time.Duration) time.Duration {
	if m := d / 10; m > time.Second {
		return m
	}
	return time.Second
}

// HelloLease is one lease the node believes it holds, listed in hello
// (section 5.1); the core revokes every one it does not know or whose token
// is lower than its own right after welcome.
type HelloLease struct {
	LeaseID      string     `json:"lease_id"`
	ResourceType string     `json:"resource_type"`
	ResourceID   string     `json:"resource_id"`
	Mode         LeaseMode  `json:"mode"`
	FencingToken int64      `json:"fencing_token"`
	State        LeaseState `json:"state"`
}

// LeaseGrant grants a lease or answers a renewal (section 5.12). A grant
// answering a lease_renew has Envelope.Re set to the renewal's id and the
// same FencingToken. DurationMS is 0 for local leases. Grants are signed
// like desired state (Signature over the canonical body without it).
type LeaseGrant struct {
	LeaseID      string    `json:"lease_id"`
	ResourceType string    `json:"resource_type"`
	ResourceID   string    `json:"resource_id"`
	Mode         LeaseMode `json:"mode"`
	FencingToken int64     `json:"fencing_token"`
	DurationMS   int64     `json:"duration_ms,omitempty"`
	GrantedAt    time.Time `json:"granted_at"`
	Signature    string    `json:"signature,omitempty"`
}

// LeaseRevoke revokes a lease (section 5.13); the node fences the lease's
// stateful workloads and answers command_result (ok, or error fence_failed)
// before it processes the next message. A revoke with a token lower than
// the node's current one is refused bad_message and changes nothing.
type LeaseRevoke struct {
	LeaseID      string `json:"lease_id"`
	FencingToken int64  `json:"fencing_token"`
	Reason       string `json:"reason"`
	Signature    string `json:"signature,omitempty"`
}

// LeaseRenew asks the core to renew an expiring lease (section 5.5),
// every DurationMS/3 while held or uncertain and once at once after a
// first grant. The core answers lease_grant with the same token, or
// lease_revoke when the token is stale or the lease is gone.
type LeaseRenew struct {
	LeaseID      string `json:"lease_id"`
	FencingToken int64  `json:"fencing_token"`
}

// FenceAckParams is the params of command fence_ack (section 5.17): the
// lease ids whose failed fences an operator verified. A listed lease with
// no recorded failed fence is not an error.
type FenceAckParams struct {
	LeaseIDs []string `json:"lease_ids"`
}

// Lease event types (section 8.5), carried in [Event].Type.
const (
	EventNodeFenced      = "node.fenced"       // every bound workload confirmed stopped
	EventNodeFenceFailed = "node.fence_failed" // a forced stop could not be confirmed
)

// FenceEventData is the data of node.fenced and node.fence_failed: the
// lease, its token, the reason (expired | revoked) and the workloads
// stopped or, for node.fence_failed, possibly still running.
type FenceEventData struct {
	LeaseID      string   `json:"lease_id"`
	ResourceID   string   `json:"resource_id,omitempty"`
	FencingToken int64    `json:"fencing_token"`
	Reason       string   `json:"reason"`
	WorkloadIDs  []string `json:"workload_ids"`
}

// SignLeaseGrant sets g.Signature to the cluster key's signature over g's
// RFC 8785 form without the signature member (section 2.4: lease messages
// are signed like desired state).
func SignLeaseGrant(g *LeaseGrant, key ed25519.PrivateKey) error {
	c := *g
	c.Signature = ""
	sig, err := signCanonical(&c, key)
	g.Signature = sig
	return err
}

// SignLeaseRevoke is [SignLeaseGrant] for a lease_revoke body.
func SignLeaseRevoke(r *LeaseRevoke, key ed25519.PrivateKey) error {
	c := *r
	c.Signature = ""
	sig, err := signCanonical(&c, key)
	r.Signature = sig
	return err
}

// VerifyLeaseGrant checks a lease_grant body as received against the pinned
// key before parsing it. Errors wrap [ErrBadSignature].
func VerifyLeaseGrant(raw []byte, pub ed25519.PublicKey) (*LeaseGrant, error) {
	if err := verifyRaw(raw, pub); err != nil {
		return nil, err
	}
	var g LeaseGrant
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, fmt.Errorf("%w: parse lease_grant: %w", ErrBadSignature, err)
	}
	return &g, nil
}

// VerifyLeaseRevoke is [VerifyLeaseGrant] for a lease_revoke body.
func VerifyLeaseRevoke(raw []byte, pub ed25519.PublicKey) (*LeaseRevoke, error) {
	if err := verifyRaw(raw, pub); err != nil {
		return nil, err
	}
	var r LeaseRevoke
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: parse lease_revoke: %w", ErrBadSignature, err)
	}
	return &r, nil
}

func signCanonical(v any, key ed25519.PrivateKey) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("marshal signed body: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("canonical form of signed body: %w", err)
	}
	return base64.StdEncoding.EncodeToString(ed25519.Sign(key, canon)), nil
}
