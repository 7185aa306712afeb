package client

import (
	"context"
	"net/http"
	"net/url"
)

// CreateJoinToken creates a one-time join token (POST /nodes/join-tokens).
// The token in the answer is shown once; the server keeps only its digest.
func (c *Client) CreateJoinToken(ctx context.Context, req JoinTokenRequest) (*JoinToken, error) {
	var out JoinToken
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/join-tokens", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateJoinCode creates a one-time join code (POST /nodes/join-codes). The
// code is shown once; the server keeps only its digest.
func (c *Client) CreateJoinCode(ctx context.Context, req JoinCodeRequest) (*JoinCode, error) {
	var out JoinCode
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/join-codes", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Enroll enrolls a node with its join token (POST /nodes/enroll). It sends no
// bearer: the join token in req is the credential. The answer's node
// credential is shown once.
func (c *Client) Enroll(ctx context.Context, req EnrollRequest) (*EnrollResponse, error) {
	var out EnrollResponse
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/enroll", req, false, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListNodes lists the enrolled nodes (GET /nodes).
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var out List[Node]
	if err := c.do(ctx, http.MethodGet, "/nodes", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// nonNil returns items, or an empty slice for nil, so a list encodes as [].
func nonNil[T any](items []T) []T {
	if items == nil {
		return []T{}
	}
	return items
}

// RemoveNode removes a node (DELETE /nodes/{id}; scope node:remove, held only
// by humans). The node's session ends with a fatal node_removed, the node
// stops dialling for good and keeps its workloads running; the core moves
// them elsewhere. Removing a removed node succeeds again. Errors: an
// *[Error] with code node_not_found for an unknown id.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/nodes/"+url.PathEscape(id), nil, nil, "", true, nil)
}

// GetNode returns one node (GET /nodes/{id}), with its drain's progress while it drains.
// Errors: an *[Error] with code node_not_found for an unknown id.
func (c *Client) GetNode(ctx context.Context, id string) (*Node, error) {
	var out Node
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(id), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetNodeCapacity sets or clears (req.Clear) the operator's capacity override of a node
// (PUT /nodes/{id}/capacity; scope admin) and returns the node after it. Idempotent.
func (c *Client) SetNodeCapacity(ctx context.Context, id string, req NodeCapacityRequest) (*Node, error) {
	var out Node
	if err := c.doJSON(ctx, http.MethodPut, "/nodes/"+url.PathEscape(id)+"/capacity", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CordonNode stops new placements on a node (POST /nodes/{id}/cordon; scope admin); what runs
// on it stays. Idempotent.
func (c *Client) CordonNode(ctx context.Context, id string) (*Node, error) {
	var out Node
	if err := c.do(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/cordon", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// UncordonNode returns a node to placement (POST /nodes/{id}/uncordon; scope admin), ending its
// drain if it drains. Idempotent.
func (c *Client) UncordonNode(ctx context.Context, id string) (*Node, error) {
	var out Node
	if err := c.do(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/uncordon", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DrainNode cordons a node and starts its drain (POST /nodes/{id}/drain; scope admin): the
// rollout moves its scheduled replicas elsewhere and its stateful leases are handed over. It
// returns at once with the node and [Node.Drain]; poll [Client.GetNode] for progress. Draining
// a draining node again keeps its start and sets the new deadline (0 keeps the old one).
func (c *Client) DrainNode(ctx context.Context, id string, req NodeDrainRequest) (*Node, error) {
	var out Node
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/"+url.PathEscape(id)+"/drain", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
