package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// RunnerEnrollmentRequest asks for a one-time runner enrollment token bound to one node id and
// one region (docs/runner-protocol.md section 3).
type RunnerEnrollmentRequest struct {
	NodeID string `json:"node_id"`
	Region string `json:"region"`
	// TTLSeconds is the token's lifetime; zero means one hour, at most seven days.
	TTLSeconds int `json:"ttl_seconds,omitempty"`
}

// RunnerEnrollment is a created enrollment token (bre_), shown once.
type RunnerEnrollment struct {
	Token     string    `json:"token"`
	NodeID    string    `json:"node_id"`
	Region    string    `json:"region"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Runner is a placement node as the admin API shows it.
type Runner struct {
	ID              string            `json:"id"`
	Region          string            `json:"region"`
	Endpoint        string            `json:"endpoint,omitempty"`
	Capacity        int               `json:"capacity"`
	Reserved        int               `json:"reserved"`
	Labels          map[string]string `json:"labels,omitempty"`
	Draining        bool              `json:"draining"`
	Revoked         bool              `json:"revoked"`
	Online          bool              `json:"online"`
	LastHeartbeatAt time.Time         `json:"last_heartbeat_at"`
	ExpiresAt       time.Time         `json:"expires_at"`
}

// NodeRequirements restrict the runner nodes a placement may use.
type NodeRequirements struct {
	Endpoint bool              `json:"endpoint"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// PlacementRequest is a new desired generation of a project's placement. Nil fields inherit the
// previous generation's value (docs/runner-protocol.md section 4).
type PlacementRequest struct {
	// Release is a bundle digest or name of the project, or an image digest ("sha256:...").
	Release          string            `json:"release"`
	State            string            `json:"state,omitempty"`
	PlacementMode    *string           `json:"placement_mode,omitempty"`
	Region           *string           `json:"region,omitempty"`
	CapacityUnits    *int              `json:"capacity_units,omitempty"`
	NodeRequirements *NodeRequirements `json:"node_requirements,omitempty"`
	// Provider selects provider placement (the runner runs the runtime and receives it through the
	// runtime call); only the first generation may set it.
	Provider *bool `json:"provider,omitempty"`
}

// Placement is a project's desired placement as recorded.
type Placement struct {
	ProjectID        string           `json:"project_id"`
	Generation       int64            `json:"generation"`
	Release          string           `json:"release"`
	State            string           `json:"state"`
	PlacementMode    string           `json:"placement_mode"`
	Region           string           `json:"region,omitempty"`
	CapacityUnits    int              `json:"capacity_units"`
	NodeRequirements NodeRequirements `json:"node_requirements"`
	NodeID           string           `json:"node_id,omitempty"`
	Pinned           bool             `json:"pinned"`
	Provider         bool             `json:"provider"`
	Deleting         bool             `json:"deleting,omitempty"`
	Status           string           `json:"status"`
	Observed         *json.RawMessage `json:"observed,omitempty"`
	UpdatedAt        time.Time        `json:"updated_at"`
	Revision         int64            `json:"revision"`
}

// OperationRequest enqueues one operation (POST /projects/{project}/operations).
type OperationRequest struct {
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	TargetNode  string          `json:"target_node,omitempty"`
	MaxAttempts int             `json:"max_attempts,omitempty"`
}

// Operation is a queued operation as the admin API shows it (never its lease token).
type Operation struct {
	ID             string          `json:"id"`
	ProjectID      string          `json:"project_id"`
	Kind           string          `json:"kind"`
	IdempotencyKey string          `json:"idempotency_key"`
	Payload        json.RawMessage `json:"payload"`
	TargetNode     string          `json:"target_node,omitempty"`
	State          string          `json:"state"`
	Attempts       int             `json:"attempts"`
	MaxAttempts    int             `json:"max_attempts"`
	NodeID         string          `json:"node_id,omitempty"`
	Fence          int64           `json:"fence"`
	LastError      string          `json:"last_error,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
}

// CreateRunnerEnrollment creates a one-time runner enrollment token (POST
// /runners/enrollment-tokens, scope node:enroll). The token is shown once.
func (c *Client) CreateRunnerEnrollment(ctx context.Context, req RunnerEnrollmentRequest) (*RunnerEnrollment, error) {
	var out RunnerEnrollment
	if err := c.doJSON(ctx, http.MethodPost, "/runners/enrollment-tokens", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListRunners lists the runner nodes (GET /runners).
func (c *Client) ListRunners(ctx context.Context) ([]Runner, error) {
	var out List[Runner]
	if err := c.do(ctx, http.MethodGet, "/runners", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// SetPlacement records the next desired generation of project's placement (PUT
// /projects/{project}/placement) and assigns it.
func (c *Client) SetPlacement(ctx context.Context, project string, req PlacementRequest) (*Placement, error) {
	var out Placement
	if err := c.doJSON(ctx, http.MethodPut, "/projects/"+pathEscape(project)+"/placement", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetPlacement returns project's placement (GET /projects/{project}/placement).
func (c *Client) GetPlacement(ctx context.Context, project string) (*Placement, error) {
	var out Placement
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/placement", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EnqueueOperation enqueues an operation under idempotencyKey (POST
// /projects/{project}/operations with the Idempotency-Key header). replayed reports whether the
// server answered an earlier request with the same key and body (Idempotency-Replayed: true).
// Errors: idempotency_key_reused when the key was used with another body.
func (c *Client) EnqueueOperation(ctx context.Context, project, idempotencyKey string, req OperationRequest) (op *Operation, replayed bool, err error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, false, fmt.Errorf("enqueue operation: encode: %w", err)
	}
	path := "/projects/" + pathEscape(project) + "/operations"
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+apiPrefix+path, bytes.NewReader(b))
	if err != nil {
		return nil, false, fmt.Errorf("POST %s: %w", path, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json, application/problem+json")
	hreq.Header.Set("User-Agent", c.userAgent)
	if idempotencyKey != "" { // an empty header is refused as a malformed key, not read as none
		hreq.Header.Set(HeaderIdempotencyKey, idempotencyKey)
	}
	if c.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, false, decodeProblem(resp)
	}
	var out Operation
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&out); err != nil {
		return nil, false, fmt.Errorf("POST %s: decode answer: %w", path, err)
	}
	return &out, resp.Header.Get(HeaderIdempotencyReplayed) == "true", nil
}

// ListOperations lists project's operations, oldest first (GET /projects/{project}/operations).
func (c *Client) ListOperations(ctx context.Context, project string) ([]Operation, error) {
	var out List[Operation]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/operations", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// GetOperation returns one operation (GET /operations/{id}).
func (c *Client) GetOperation(ctx context.Context, id string) (*Operation, error) {
	var out Operation
	if err := c.do(ctx, http.MethodGet, "/operations/"+pathEscape(id), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PlacementDeletion is where the project-delete workflow of DELETE /projects/{project}/placement
// stands: Status "deleted", or "waiting_for_provider" (202) while the provider's delete operation
// runs.
type PlacementDeletion struct {
	Project           string `json:"project"`
	Status            string `json:"status"`
	ProviderOperation string `json:"provider_operation,omitempty"`
	ProviderState     string `json:"provider_state,omitempty"`
	Revoked           int    `json:"revoked"`
}

// DeletePlacement runs the project-delete workflow of project's orchestration state (DELETE
// /projects/{project}/placement): it holds the placement, waits for a provider's delete operation,
// revokes the project's operations, removes the placement and then the project's fence sequence.
// Call it again while Status is "waiting_for_provider". Errors: PROJECT_BUSY, PROJECT_LEASE_LOST.
func (c *Client) DeletePlacement(ctx context.Context, project string) (*PlacementDeletion, error) {
	var out PlacementDeletion
	if err := c.do(ctx, http.MethodDelete, "/projects/"+pathEscape(project)+"/placement", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RollbackPlacement enqueues the provider rollback of project's exact current generation (POST
// /projects/{project}/placement/rollback); only for provider placements.
func (c *Client) RollbackPlacement(ctx context.Context, project string) (*Operation, error) {
	var out Operation
	if err := c.doJSON(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/placement/rollback", struct{}{}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
