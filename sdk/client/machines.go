package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// MachineRequest asks for a machine (POST /machines, docs/machines.md section 4).
type MachineRequest struct {
	Provider string            `json:"provider"`
	Type     string            `json:"type"`
	Location string            `json:"location"`
	Image    string            `json:"image,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Machine is a cloud server Berth made for a node: its provider facts, its
// state (provisioning, ready, failed, deleting, deleted), the node bound to
// it, the operation running for it and what that operation does now.
type Machine struct {
	ID        string            `json:"id"`
	Provider  string            `json:"provider"`
	Type      string            `json:"type"`
	Location  string            `json:"location"`
	Image     string            `json:"image"`
	Labels    map[string]string `json:"labels,omitempty"`
	State     string            `json:"state"`
	NodeID    string            `json:"node_id,omitempty"`
	Operation string            `json:"operation"`
	Status    string            `json:"status,omitempty"`
	LastError string            `json:"last_error,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	JoinBy    time.Time         `json:"join_by"`
}

// CreateMachine records a machine and enqueues its creation (POST /machines).
func (c *Client) CreateMachine(ctx context.Context, req MachineRequest) (*Machine, error) {
	var out Machine
	if err := c.doJSON(ctx, http.MethodPost, "/machines", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListMachines lists every machine, oldest first (GET /machines).
func (c *Client) ListMachines(ctx context.Context) ([]Machine, error) {
	var out List[Machine]
	if err := c.do(ctx, http.MethodGet, "/machines", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// DeleteMachine enqueues the deletion of a machine's server (DELETE /machines/{id}).
func (c *Client) DeleteMachine(ctx context.Context, id string) (*Machine, error) {
	var out Machine
	if err := c.do(ctx, http.MethodDelete, "/machines/"+url.PathEscape(id), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
