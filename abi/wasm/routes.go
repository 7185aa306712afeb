package wasm

import "github.com/berthhq/berth/abi/routes"

// RoutesInput is what routes_compile receives (schema/routes_input.json):
// every service with its domains, and every workload with its node's address,
// its port and its health. Services and workloads are sorted by id.
type RoutesInput struct {
	Services  []RouteService  `json:"services"`
	Workloads []RouteWorkload `json:"workloads"`
}

// RouteService is a routed service. TLSMode is "none" (plain HTTP), "acme",
// "manual" or "passthrough" (abi/routes TLS modes); empty means "none". AllowSources lists CIDR prefixes that
// may reach the service; empty means everyone.
type RouteService struct {
	ID           string   `json:"id"`
	Project      string   `json:"project"`
	Name         string   `json:"name"`
	Domains      []string `json:"domains"`
	TLSMode      string   `json:"tls_mode,omitempty"`
	AllowSources []string `json:"allow_sources,omitempty"`
}

// RouteWorkload is a workload as last observed. NodeAddress and Port are
// empty and zero until the node reports them; Address is "host:port" then.
// ObservedStatus is the node's word ("running", "starting", "exited", ...);
// Health is "passing", "failing" or "unknown".
type RouteWorkload struct {
	ID             string `json:"id"`
	ServiceID      string `json:"service_id"`
	NodeID         string `json:"node_id"`
	NodeAddress    string `json:"node_address"`
	Port           int    `json:"port"`
	Address        string `json:"address"`
	ObservedStatus string `json:"observed_status"`
	Health         string `json:"health"`
}

// RoutesOutput is what routes_compile returns (schema/routes_output.json):
// the complete route table and SHA256, the lower-case hex SHA-256 that
// [routes.Table.Digest] computes over it. The host recomputes the digest and
// refuses a table whose digest differs.
type RoutesOutput struct {
	Routes []routes.Route `json:"routes"`
	SHA256 string         `json:"sha256,omitempty"`
	Error  *GuestError    `json:"error,omitempty"`
}
