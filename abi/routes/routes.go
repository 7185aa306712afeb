// Package routes holds the gateway route table: the complete mapping from
// hostnames to upstream workloads that core computes and pushes to the gateway.
package routes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
)

// Table is the complete route table. Routes are sorted by Hostname; a hostname
// appears at most once. Revision increases with every table core pushes.
type Table struct {
	Revision int64   `json:"revision"`
	Routes   []Route `json:"routes"`
}

// Route sends HTTP requests for Hostname (lower case, no port) to Upstreams in turn.
// The gateway plugin does not yet enforce TLSMode and AllowSources.
type Route struct {
	Hostname  string     `json:"hostname"`
	Project   string     `json:"project"`
	Service   string     `json:"service"`
	Upstreams []Upstream `json:"upstreams"`
	// TLSMode is "none", "acme" or "passthrough"; empty means "none".
	TLSMode string `json:"tls_mode,omitempty"`
	// AllowSources lists the CIDR prefixes that may use the route; empty
	// means every source.
	AllowSources []string `json:"allow_sources,omitempty"`
}

// Upstream is one workload serving a route. Address is "host:port". Only
// healthy upstreams receive traffic.
type Upstream struct {
	WorkloadID string `json:"workload_id"`
	Address    string `json:"address"`
	Healthy    bool   `json:"healthy"`
}

// Normalize sorts routes by hostname and upstreams by workload id, in place.
func (t *Table) Normalize() {
	sort.Slice(t.Routes, func(i, j int) bool { return t.Routes[i].Hostname < t.Routes[j].Hostname })
	for i := range t.Routes {
		u := t.Routes[i].Upstreams
		sort.Slice(u, func(a, b int) bool { return u[a].WorkloadID < u[b].WorkloadID })
	}
}

// Digest returns the hex SHA-256 of the normalized table's routes (the revision
// is left out), so two tables that route the same way have the same digest.
func (t Table) Digest() string {
	c := Table{Routes: append([]Route(nil), t.Routes...)}
	c.Normalize()
	raw, _ := json.Marshal(c.Routes) // plain structs: cannot fail
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
