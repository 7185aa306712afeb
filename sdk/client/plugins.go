package client

import (
	"context"
	"net/http"
)

// Plugin is one plugin process berthd supervises, as GET /api/v1/plugins
// lists it (docs/api.md, docs/plugins.md section 2).
type Plugin struct {
	Name              string `json:"name"`
	Kind              string `json:"kind"` // "provider" or "runtime"
	Path              string `json:"path"`
	Version           string `json:"version,omitempty"`
	APIVersion        int    `json:"api_version,omitempty"`
	State             string `json:"state"` // running, restarting, quarantined, closed
	PID               int    `json:"pid,omitempty"`
	Launches          int    `json:"launches"`
	Crashes           int    `json:"crashes"` // within the quarantine window (10 minutes)
	Health            string `json:"health,omitempty"`
	HealthDescription string `json:"health_description,omitempty"`
	// Degraded reports whether the plugin broke its contract without
	// stopping (a provider whose Apply differed from its Plan).
	Degraded       bool   `json:"degraded"`
	DegradedReason string `json:"degraded_reason,omitempty"`
	LastError      string `json:"last_error,omitempty"`
}

// ListPlugins returns berthd's plugins (scope nodes:read).
func (c *Client) ListPlugins(ctx context.Context) ([]Plugin, error) {
	var out List[Plugin]
	if err := c.do(ctx, http.MethodGet, "/plugins", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}
