package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// ClusterRelay is one relay registration of a cluster (docs/relay.md section 10).
type ClusterRelay struct {
	RelayID      string    `json:"relay_id"`
	Build        string    `json:"build"`
	NodeID       string    `json:"node_id,omitempty"`
	Address      string    `json:"address"`
	Sequence     uint64    `json:"sequence"`
	Generation   int64     `json:"generation"`
	Core         string    `json:"core,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`
	RenewedAt    time.Time `json:"renewed_at"`
}

// ClusterElection is the relay election of a cluster: State is "connected",
// "relay_not_connected" or "relay_ambiguous" ("" for a cluster without a relay); Relay is the
// elected one, Live every live registration.
type ClusterElection struct {
	State  string         `json:"state,omitempty"`
	Detail string         `json:"detail,omitempty"`
	Relay  *ClusterRelay  `json:"relay,omitempty"`
	Live   []ClusterRelay `json:"live,omitempty"`
}

// Cluster is a cluster (docs/api.md section "Clusters and relays").
type Cluster struct {
	Name          string    `json:"name"`
	RequiresRelay bool      `json:"requires_relay"`
	CreatedAt     time.Time `json:"created_at"`
	Credential    *struct {
		Generation int64     `json:"generation"`
		IssuedAt   time.Time `json:"issued_at"`
	} `json:"credential,omitempty"`
	Relays   []ClusterRelay  `json:"relays,omitempty"`
	Election ClusterElection `json:"election"`
}

// ClusterNode is a node of a cluster in its status.
type ClusterNode struct {
	ID           string `json:"id"`
	Hostname     string `json:"hostname"`
	Status       string `json:"status"`
	AgentVersion string `json:"agent_version,omitempty"`
}

// ClusterStatus is GET /clusters/{name}: the cluster, its relay election and its nodes.
type ClusterStatus struct {
	Cluster  Cluster         `json:"cluster"`
	Election ClusterElection `json:"election"`
	Nodes    []ClusterNode   `json:"nodes"`
}

// RelayCredential answers ensure and rotate: Credential is the bearer, shown once, and empty
// when ensure found one issued already.
type RelayCredential struct {
	Cluster    string `json:"cluster"`
	Generation int64  `json:"generation"`
	Credential string `json:"credential,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// CreateCluster creates a cluster (POST /clusters; scope admin). Errors: already_exists,
// validation_failed.
func (c *Client) CreateCluster(ctx context.Context, name string, requiresRelay bool) (*Cluster, error) {
	var out Cluster
	req := map[string]any{"name": name, "requires_relay": requiresRelay}
	if err := c.doJSON(ctx, http.MethodPost, "/clusters", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListClusters lists the clusters with their relay elections (GET /clusters).
func (c *Client) ListClusters(ctx context.Context) ([]Cluster, error) {
	var out struct {
		Clusters []Cluster `json:"clusters"`
	}
	if err := c.do(ctx, http.MethodGet, "/clusters", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Clusters), nil
}

// ClusterStatus returns one cluster's status (GET /clusters/{name}). Errors: cluster_not_found.
func (c *Client) ClusterStatus(ctx context.Context, name string) (*ClusterStatus, error) {
	var out ClusterStatus
	if err := c.do(ctx, http.MethodGet, "/clusters/"+url.PathEscape(name), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EnsureRelayCredential issues the cluster's first relay credential, or says which generation
// it holds (POST /clusters/{name}/relay-credential). Errors: cluster_not_found, cluster_no_relay.
func (c *Client) EnsureRelayCredential(ctx context.Context, name string) (*RelayCredential, error) {
	var out RelayCredential
	if err := c.do(ctx, http.MethodPost, "/clusters/"+url.PathEscape(name)+"/relay-credential", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RotateRelayCredential replaces the cluster's relay credential with one of the next generation;
// the old one stops at once (POST /clusters/{name}/relay-credential/rotate).
func (c *Client) RotateRelayCredential(ctx context.Context, name string) (*RelayCredential, error) {
	var out RelayCredential
	if err := c.do(ctx, http.MethodPost, "/clusters/"+url.PathEscape(name)+"/relay-credential/rotate", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
