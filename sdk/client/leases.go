package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Fencing headers of a shared-storage write (docs/api.md "Fencing tokens"): a write carrying
// them is checked by the core's fencing guard and refused with code stale_fencing_token when the
// token is lower than the highest the core has seen for the resource.
const (
	HeaderFencingToken    = "X-Berth-Fencing-Token"
	HeaderFencingResource = "X-Berth-Fencing-Resource"
)

// Lease is the lease of one stateful service (GET /leases, docs/api.md "Leases").
type Lease struct {
	LeaseID      string `json:"lease_id"`
	ResourceType string `json:"resource_type"`
	ResourceID   string `json:"resource_id"`
	// Holder is the node holding the lease; empty when nobody does.
	Holder       string `json:"holder,omitempty"`
	FencingToken int64  `json:"fencing_token"`
	Mode         string `json:"mode"`
	DurationMS   int64  `json:"duration_ms,omitempty"`
	// GrantedAt is the core's time of the last grant or renewal to Holder.
	GrantedAt time.Time `json:"granted_at"`
	// GateAt is the earliest time the lease may go to another node; nil when never by time
	// (a local lease held by a node).
	GateAt *time.Time `json:"gate_at,omitempty"`
	// FenceFailed lists nodes whose failed fence of this lease awaits an acknowledgement; while
	// it is not empty the lease is granted to nobody.
	FenceFailed []string `json:"fence_failed,omitempty"`
	Deleted     bool     `json:"deleted,omitempty"`
}

// FenceFailure is a failed self-fence recorded on a node.
type FenceFailure struct {
	LeaseID      string    `json:"lease_id"`
	ResourceID   string    `json:"resource_id,omitempty"`
	FencingToken int64     `json:"fencing_token"`
	WorkloadIDs  []string  `json:"workload_ids"`
	Detail       string    `json:"detail,omitempty"`
	At           time.Time `json:"at"`
}

// NodeFence is a node's fence state: its unacknowledged failed fences and the acknowledgements
// it has not confirmed yet (GET /nodes/{id}/fence).
type NodeFence struct {
	NodeID          string         `json:"node_id"`
	FenceFailure    []FenceFailure `json:"fence_failure"`
	FenceAckPending []string       `json:"fence_ack_pending"`
}

// FenceAckRequest is the body of POST /nodes/{id}/fence-ack: exactly the node's outstanding
// failed-fence lease ids.
type FenceAckRequest struct {
	LeaseIDs []string `json:"lease_ids"`
}

// LeaseChange is the answer of POST /nodes/{id}/lost and /fence-ack: the leases changed, each
// now free under a higher token.
type LeaseChange struct {
	NodeID string  `json:"node_id"`
	Leases []Lease `json:"leases"`
}

// ListLeases lists every lease (GET /leases; scope nodes:read).
func (c *Client) ListLeases(ctx context.Context) ([]Lease, error) {
	var out List[Lease]
	if err := c.do(ctx, http.MethodGet, "/leases", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// NodeLost declares a node lost (POST /nodes/{id}/lost; scope node:remove, human-only): every
// lease it holds is freed under a higher token, so its workloads may start elsewhere and its
// writes with the old token are refused. Only declare a node lost once it is known to run
// nothing (powered off, isolated). Errors: code node_not_found.
func (c *Client) NodeLost(ctx context.Context, id string) (*LeaseChange, error) {
	var out LeaseChange
	if err := c.do(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/lost", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NodeFence returns a node's fence state (GET /nodes/{id}/fence; scope nodes:read).
func (c *Client) NodeFence(ctx context.Context, id string) (*NodeFence, error) {
	var out NodeFence
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(id)+"/fence", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FenceAck acknowledges a node's failed fences (POST /nodes/{id}/fence-ack; scope node:fence_ack,
// human-only) after checking out of band that the workloads they name are stopped. leaseIDs must
// be exactly the outstanding ones, else code fence_ack_mismatch and nothing changes.
func (c *Client) FenceAck(ctx context.Context, id string, leaseIDs []string) (*LeaseChange, error) {
	var out LeaseChange
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/fence-ack", FenceAckRequest{LeaseIDs: leaseIDs}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PushBundleFenced is [Client.PushBundle] as a fenced shared-storage write: resource and token
// travel in the fencing headers, and a token lower than the highest seen for resource fails with
// code stale_fencing_token before anything is stored.
func (c *Client) PushBundleFenced(ctx context.Context, project, name, resource string, token int64, r io.Reader) (*Bundle, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	hdr := http.Header{HeaderFencingResource: {resource}, HeaderFencingToken: {strconv.FormatInt(token, 10)}}
	resp, err := c.sendWith(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/bundles", q, r, "application/gzip", "application/json", true, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out Bundle
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&out); err != nil {
		return nil, fmt.Errorf("push bundle: decode answer: %w", err)
	}
	return &out, nil
}
