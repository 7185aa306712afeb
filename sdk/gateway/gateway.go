// Package gateway holds what every gateway provider shares, the built-in
// reverse proxy and adapters of external ones alike: the route-table
// resource's canonical form, its example states and the check of a
// configuration they take as flags (docs/plugins.md section 5).
package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
)

// ResourceType is the capability entry of a gateway provider: the route
// table resource (routes.ResourceType, id routes.ResourceID) with
// [ExampleTables] as its example states.
func ResourceType() provider.ResourceType {
	return provider.ResourceType{
		Name: routes.ResourceType, Variants: []string{"http"},
		ExampleID: routes.ResourceID, ExampleAttributes: ExampleTables(),
	}
}

// ExampleTables are two valid route tables (one route to a discard port, at
// revisions 1 and 2): the states authors' tools check when given none.
func ExampleTables() []json.RawMessage {
	var out []json.RawMessage
	for i, addr := range []string{"127.0.0.1:9", "127.0.0.1:10"} {
		raw, _ := json.Marshal(routes.Table{Revision: int64(i + 1), Routes: []routes.Route{{ // plain structs: cannot fail
			Hostname: "conformance.test", Project: "prj_conformance", Service: "web",
			Upstreams: []routes.Upstream{{WorkloadID: "wl_conformance", Address: addr, Healthy: true}},
		}}})
		out = append(out, raw)
	}
	return out
}

// Canonical decodes a route-table resource (unknown fields refused), checks
// it with [routes.Table.Validate] and returns it with canonical attributes
// (routes and upstreams sorted, compact JSON) beside the table. Another
// resource, attributes that do not decode and an unroutable table are
// validation_failed; who names the provider in the first refusal.
func Canonical(r provider.Resource, who string) (provider.Resource, routes.Table, error) {
	if r.Type != routes.ResourceType || r.ID != routes.ResourceID {
		return provider.Resource{}, routes.Table{}, abierrors.New(abierrors.ValidationFailed,
			fmt.Sprintf("%s manages only %s/%s, not %s/%s", who, routes.ResourceType, routes.ResourceID, r.Type, r.ID))
	}
	attrs := r.Attributes
	if len(attrs) == 0 {
		attrs = json.RawMessage("{}")
	}
	var t routes.Table
	dec := json.NewDecoder(bytes.NewReader(attrs))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return provider.Resource{}, routes.Table{}, abierrors.Wrap(abierrors.ValidationFailed, "route table attributes do not decode", err)
	}
	if err := t.Validate(); err != nil {
		return provider.Resource{}, routes.Table{}, abierrors.Wrap(abierrors.ValidationFailed, "route table is not routable", err)
	}
	t.Normalize()
	raw, err := json.Marshal(t)
	if err != nil {
		return provider.Resource{}, routes.Table{}, fmt.Errorf("encode route table: %w", err)
	}
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}, t, nil
}

// ValidateNoConfig is ValidateConfig of a provider that takes its settings
// as flags: the configuration must be empty or an empty JSON object; each
// field is one problem (sorted), hint appended to it when not empty.
func ValidateNoConfig(req *provider.ConfigRequest, hint string) *provider.ValidateConfigResponse {
	var obj map[string]json.RawMessage
	if len(req.Config) > 0 {
		if err := json.Unmarshal(req.Config, &obj); err != nil {
			return &provider.ValidateConfigResponse{Problems: []string{"config is not a JSON object"}}
		}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var problems []string
	for _, k := range keys {
		p := fmt.Sprintf("unknown config field %q", k)
		if hint != "" {
			p += " (" + hint + ")"
		}
		problems = append(problems, p)
	}
	return &provider.ValidateConfigResponse{Problems: problems}
}
