// Package provider is the Go contract of provider plugins: the Provider
// interface, its request and response types, and their gRPC wire adapters
// (docs/plugins.md section 4).
//
// Plugin authors implement [Provider] and serve it with
// github.com/berthhq/berth/sdk/provider; hosts reach a provider through
// [Client]. Both sides share the adapters here.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
)

// APIVersion is the provider contract version of this package.
//
// Changelog:
//   - 1 (2026-11-29) Gateway: Describe, SetRoutes.
//   - 1 (2026-12-06, before any release) reshaped into the generic resource
//     contract: Describe, Health, ValidateConfig, Configure, Plan, Apply,
//     Read, Delete. The gateway's route table is the resource type
//     "gateway.route_table" (abi/routes).
//   - 1 (2026-12-02) ResourceType gains Schema and DriftInterval, both
//     optional: hosts that predate them ignore them and plugins that leave
//     them out keep working, so the version stays 1 (docs/plugins.md
//     section 1.2).
const APIVersion = 1

// Provider manages typed resources outside Berth: a route table, DNS records,
// buckets, machines. berthd calls it; implementations must be safe for
// concurrent use.
//
// Vocabulary: a [Resource] is named by a type (one the provider lists in its
// capabilities) and an id; its attributes are a JSON object whose shape the
// type defines. Plan computes the state Apply would produce, Apply produces
// it, Read reports it, Delete removes it.
//
// Lifecycle:
//
//  1. Describe once after launch; ValidateConfig and then, when the plugin
//     implements [Configurer], Configure with the catalog's configuration.
//  2. For each change: Read (or the state the host remembers), Plan(desired,
//     current), and Apply(planned) with a [pluginapi.Mutation].
//  3. Delete when the resource is no longer wanted.
//
// Obligations, checked by the conformance suite:
//
//  1. Apply returns exactly the planned state (Plan equals Apply); the host
//     marks a plugin that breaks this degraded.
//  2. A repeated Apply or Delete with the same idempotency key returns the
//     recorded result and changes nothing.
//  3. A fencing token lower than the highest seen for the resource is
//     refused with code stale_fencing_token, changing nothing.
//  4. After Delete, Read returns an error wrapping [ErrNotFound].
//  5. Every call honours ctx's deadline.
//
// Optional interfaces: [Configurer], [pluginapi.HealthReporter].
type Provider interface {
	// Describe names the plugin. Cheap; called once per launch.
	Describe(ctx context.Context) (*DescribeResponse, error)
	// ValidateConfig checks a configuration without applying it. Problems
	// are returned in the response, not as an error.
	ValidateConfig(ctx context.Context, req *ConfigRequest) (*ValidateConfigResponse, error)
	// Plan computes the state applying req.Desired would produce. It
	// changes nothing. Unknown types are refused with validation_failed.
	Plan(ctx context.Context, req *PlanRequest) (*PlanResponse, error)
	// Apply makes req.Planned real and returns the resulting state.
	Apply(ctx context.Context, req *ApplyRequest) (*ApplyResponse, error)
	// Read returns a resource's current state, or an error wrapping
	// ErrNotFound.
	Read(ctx context.Context, req *ReadRequest) (*ReadResponse, error)
	// Delete removes a resource; an absent resource is success.
	Delete(ctx context.Context, req *DeleteRequest) (*DeleteResponse, error)
}

// Configurer is the optional interface of a provider that takes the
// configuration of its catalog entry. Configure is called after a successful
// ValidateConfig, once per launch, before any other call but Describe.
type Configurer interface {
	Configure(ctx context.Context, req *ConfigRequest) error
}

// ErrNotFound is returned (wrapped) by Read for an absent resource. It
// carries code not_found, so errors.Is holds on both sides of the wire.
var ErrNotFound = abierrors.New(abierrors.NotFound, "resource not found")

// DescribeResponse names a provider plugin and what it can do.
type DescribeResponse struct {
	Name         string // e.g. "gateway"; a DNS label
	Version      string // the plugin's own version
	APIVersions  []int  // contract versions it speaks; must include the negotiated one
	Capabilities Capabilities
}

// Capabilities is what a provider can do; static for the life of the process.
type Capabilities struct {
	// ResourceTypes lists the types it manages. At least one.
	ResourceTypes []ResourceType
	// DurableState reports whether applied state and the fencing and
	// idempotency records survive a restart of the plugin process. When
	// false the host applies the last state again after a relaunch.
	DurableState bool
}

// ResourceType is one type of resource a provider manages.
type ResourceType struct {
	Name     string   // e.g. "gateway.route_table", "dns.record"
	Variants []string // kinds within the type, e.g. a DNS provider's record types ("A", "TXT")
	// ExampleID and ExampleAttributes, optional, declare valid desired
	// states of one resource of this type: its id, and at least two
	// different attribute objects. `berth conformance plugin` without
	// --samples uses the first two as the suite's samples
	// (docs/plugins.md section 6.1). Both empty means no examples.
	ExampleID         string
	ExampleAttributes []json.RawMessage
	// Schema, optional, is a JSON Schema of the attributes of a desired
	// state (draft 2020-12 unless its $schema names another). berthd
	// checks a declared resource's spec against it before storing it and
	// refuses one that does not fit, naming the field (docs/plugins.md
	// section 4.6). nil: specs of the type are checked only by Plan.
	Schema json.RawMessage
	// DriftInterval is how often berthd reads each resource of the type to
	// find drift (docs/plugins.md section 4.6); zero lets berthd choose.
	// Whole seconds on the wire.
	DriftInterval time.Duration
}

// Examples returns the first two declared example states as resources, and
// reports whether t declares two.
func (t ResourceType) Examples() ([2]Resource, bool) {
	var out [2]Resource
	if t.ExampleID == "" || len(t.ExampleAttributes) < 2 {
		return out, false
	}
	for i := range out {
		out[i] = Resource{Type: t.Name, ID: t.ExampleID, Attributes: t.ExampleAttributes[i]}
	}
	return out, true
}

// Resource is one managed object. Attributes is a JSON object; nil means {}.
type Resource struct {
	Type       string
	ID         string
	Attributes json.RawMessage
}

// Equal reports whether r and o name the same resource with semantically
// equal attributes (JSON compared as values, so key order and spacing do not
// matter).
func (r Resource) Equal(o Resource) bool {
	if r.Type != o.Type || r.ID != o.ID {
		return false
	}
	if bytes.Equal(r.Attributes, o.Attributes) {
		return true
	}
	var a, b any
	if json.Unmarshal(orEmpty(r.Attributes), &a) != nil || json.Unmarshal(orEmpty(o.Attributes), &b) != nil {
		return false
	}
	return reflect.DeepEqual(a, b)
}

func orEmpty(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

// ConfigRequest carries the configuration of a plugin's catalog entry (a JSON
// object; nil means {}) and the negotiated contract version.
type ConfigRequest struct {
	Config     json.RawMessage
	APIVersion int
}

// ValidateConfigResponse lists what is wrong with a configuration; empty
// means acceptable.
type ValidateConfigResponse struct {
	Problems []string
}

// PlanRequest asks what applying Desired over Current would produce. Current
// is nil when the resource does not exist.
type PlanRequest struct {
	Desired Resource
	Current *Resource
}

// PlanResponse is the planned state and whether it differs from Current.
type PlanResponse struct {
	Planned Resource
	Changes bool
}

// ApplyRequest applies a planned state.
type ApplyRequest struct {
	Planned Resource
	pluginapi.Mutation
}

// ApplyResponse is the state after Apply.
type ApplyResponse struct {
	State Resource
	// Credentials, optional, is a JSON object of credential values the
	// apply issued (a database password, an access key), never part of
	// State and so never compared, planned or stored by the host as it is:
	// the host seals it into secrets (docs/plugins.md section 4.5). A
	// replayed Apply returns the same credentials again.
	Credentials json.RawMessage
}

// ReadRequest names a resource.
type ReadRequest struct {
	Type string
	ID   string
}

// ReadResponse is a resource's current state.
type ReadResponse struct {
	State Resource
}

// DeleteRequest removes a resource.
type DeleteRequest struct {
	Type string
	ID   string
	// Purge asks the provider to drop the data the resource holds. Without
	// it a provider of data (databases, buckets) only releases the
	// resource: Read answers not found and the data stays
	// (docs/plugins.md section 4.5).
	Purge bool
	pluginapi.Mutation
}

// DeleteResponse is empty: a successful Delete has nothing to report.
type DeleteResponse struct{}
