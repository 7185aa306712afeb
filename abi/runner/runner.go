// Package runner holds the wire types of the runner transport /api/runner/v1: registration,
// heartbeat, claims, lease renewal, settlement, observations and artifacts (docs/runner-protocol.md section 6).
package runner

import (
	"encoding/json"
	"time"
)

// Version 1 of the transport. Changelog: 2026-11-29 first version; 2026-11-29 runtime call,
// lifecycle kinds rollback and delete.
const (
	// Prefix is the fixed path prefix of the transport.
	Prefix = "/api/runner/v1"
	// MaxClaim bounds the count of one claim.
	MaxClaim = 16
	// MaxRequestBytes bounds every JSON request body.
	MaxRequestBytes = 128 << 10
	// MaxResponseBytes bounds every JSON answer a client reads (artifacts have their own ceiling).
	MaxResponseBytes = 1 << 20
	// ArtifactMediaType is the media type of an artifact answer (a release bundle, gzip tar).
	ArtifactMediaType = "application/gzip"
	// HeaderDigest carries the artifact's "sha256:<hex>" digest.
	HeaderDigest = "X-Berth-Digest"
	// EnvRegistrationToken names the environment variable a runner reads its enrollment token from
	// (berthd reads the same name for the legacy shared registration secret, docs/runner-protocol.md
	// section 6.4).
	EnvRegistrationToken = "BERTH_RUNNER_REGISTRATION_TOKEN"
	// RuntimeMediaType is the media type of a runtime answer: a [RuntimeCapsule] as JSON.
	RuntimeMediaType = "application/vnd.berth.runtime+json"
	// RuntimeProtocol marks a reconcile payload that selects the runtime call.
	RuntimeProtocol = "berth-runtime/1"
)

// Operation kinds the control plane derives itself (docs/runner-protocol.md section 6.3). Callers
// of the admin API cannot enqueue rollback or delete.
const (
	KindReconcile = "reconcile"
	KindRollback  = "rollback"
	KindDelete    = "delete"
)

// Paths under [Prefix].
const (
	PathRegister  = "/register"
	PathHeartbeat = "/heartbeat"
	PathClaim     = "/claim"
	PathRenew     = "/renew"
	PathComplete  = "/complete"
	PathFail      = "/fail"
	PathObserve   = "/observe"
	PathArtifact  = "/artifact"
	PathRuntime   = "/runtime"
)

// Declaration is what a node advertises at registration and heartbeat (docs/runner-protocol.md
// section 3).
type Declaration struct {
	Region string `json:"region"`
	// Endpoint is the node's private provider origin; empty: none.
	Endpoint string `json:"endpoint,omitempty"`
	// Capacity is in capacity units (process slots).
	Capacity int               `json:"capacity"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// RegisterRequest is the body of POST /register; the enrollment token (bre_) is the bearer.
type RegisterRequest struct {
	NodeID string `json:"node_id"`
	Declaration
}

// Node is a node as the transport reports it.
type Node struct {
	ID          string            `json:"id"`
	Region      string            `json:"region"`
	Endpoint    string            `json:"endpoint,omitempty"`
	Capacity    int               `json:"capacity"`
	Reserved    int               `json:"reserved"`
	Labels      map[string]string `json:"labels,omitempty"`
	Draining    bool              `json:"draining"`
	ExpiresAt   time.Time         `json:"expires_at"`
	HeartbeatAt time.Time         `json:"last_heartbeat_at"`
}

// RegisterResponse answers POST /register: the node and its new credential (brn_), shown once.
type RegisterResponse struct {
	Node       Node   `json:"node"`
	Credential string `json:"credential"`
}

// HeartbeatRequest is the body of POST /heartbeat; the node credential is the bearer.
type HeartbeatRequest struct {
	NodeID string `json:"node_id"`
	// Declaration, when not nil, replaces what the node advertises.
	Declaration *Declaration `json:"declaration,omitempty"`
	// Draining, when not nil, sets or clears draining.
	Draining *bool `json:"draining,omitempty"`
}

// HeartbeatResponse answers POST /heartbeat.
type HeartbeatResponse struct {
	Node Node `json:"node"`
	// LeaseTTLSeconds is the operation lease lifetime, so the runner can plan renewals.
	LeaseTTLSeconds float64 `json:"lease_ttl_seconds"`
	// NodeTTLSeconds is how long one heartbeat keeps the node online.
	NodeTTLSeconds float64 `json:"node_ttl_seconds"`
}

// ClaimRequest is the body of POST /claim.
type ClaimRequest struct {
	NodeID string `json:"node_id"`
	// Max is how many operations to lease at most, 1 to [MaxClaim].
	Max int `json:"max"`
}

// Operation is one leased operation. LeaseToken is shown once, to the claimer.
type Operation struct {
	ID             string          `json:"id"`
	ProjectID      string          `json:"project_id"`
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload"`
	Attempts       int             `json:"attempts"`
	Fence          int64           `json:"fence"`
	LeaseToken     string          `json:"lease_token"`
	LeaseExpiresAt time.Time       `json:"lease_expires_at"`
}

// ClaimResponse answers POST /claim.
type ClaimResponse struct {
	Operations []Operation `json:"operations"`
}

// Lease identifies the lease a node acts under: the operation, its lease token and its fence.
type Lease struct {
	NodeID      string `json:"node_id"`
	OperationID string `json:"operation_id"`
	LeaseToken  string `json:"lease_token"`
	Fence       int64  `json:"fence"`
}

// RenewResponse answers POST /renew.
type RenewResponse struct {
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

// CompleteRequest is the body of POST /complete. Result is bounded, non-secret JSON.
type CompleteRequest struct {
	Lease
	Result json.RawMessage `json:"result,omitempty"`
}

// FailRequest is the body of POST /fail. Error is bounded, non-secret text.
type FailRequest struct {
	Lease
	Error string `json:"error"`
	// Retryable reports whether the operation may be retried; false fails it for good.
	Retryable bool `json:"retryable"`
}

// ObserveRequest is the body of POST /observe: what the node runs for the operation's project.
type ObserveRequest struct {
	Lease
	Generation int64  `json:"generation"`
	Release    string `json:"release"`
	State      string `json:"state"`
}

// SettleResponse answers POST /complete, /fail and /observe.
type SettleResponse struct {
	State string `json:"state"`
}

// ArtifactRequest is the body of POST /artifact; the answer is the artifact's bytes with
// Content-Type [ArtifactMediaType], an exact Content-Length and [HeaderDigest].
type ArtifactRequest struct {
	Lease
}

// ReconcilePayload is the canonical payload of a "reconcile" operation. Protocol is
// [RuntimeProtocol] for a project placed with provider placement (its runner fetches the runtime
// with POST /runtime), empty otherwise.
type ReconcilePayload struct {
	Generation int64  `json:"generation"`
	Release    string `json:"release"`
	State      string `json:"state"`
	Protocol   string `json:"protocol,omitempty"`
}

// LifecyclePayload is the canonical payload of a "rollback" or "delete" operation: only the exact
// current generation. The runner derives the confirmation itself.
type LifecyclePayload struct {
	Generation int64 `json:"generation"`
}

// RuntimeRequest is the body of POST /runtime; the answer is a [RuntimeCapsule] as JSON with
// Content-Type [RuntimeMediaType], an exact Content-Length and [HeaderDigest]. Nothing of the
// runtime travels in the request, the URL or a header.
type RuntimeRequest struct {
	Lease
}

// RuntimeCapsule binds a verified release to one project's final runtime: its environment, its
// placement intent and its managed-ingress identity (docs/runner-protocol.md section 6.2). It
// holds application secrets: keep it in memory, never log it, never put any of it in a completion
// result, an observation or a file others can read.
type RuntimeCapsule struct {
	// Version is 1.
	Version     int    `json:"version"`
	ProjectID   string `json:"project_id"`
	Project     string `json:"project"`
	OperationID string `json:"operation_id"`
	Fence       int64  `json:"fence"`
	Generation  int64  `json:"generation"`
	// Release is the release digest of the operation's canonical payload.
	Release   string           `json:"release"`
	State     string           `json:"state"`
	Services  []RuntimeService `json:"services"`
	Placement RuntimePlacement `json:"placement"`
	Ingress   RuntimeIngress   `json:"ingress"`
}

// RuntimeService is one service of the project with its final environment.
type RuntimeService struct {
	Name     string   `json:"name"`
	Command  []string `json:"command,omitempty"`
	Port     int      `json:"port,omitempty"`
	Replicas int      `json:"replicas"`
	// Env is the service's declared, non-secret environment.
	Env map[string]string `json:"env"`
	// Secrets holds secret environment values, resolved; SECRET. Empty while the control plane
	// holds no secrets for the service.
	Secrets map[string]string `json:"secrets"`
}

// RuntimePlacement is the placement intent the runtime runs under.
type RuntimePlacement struct {
	Mode          string `json:"placement_mode"`
	Region        string `json:"region,omitempty"`
	CapacityUnits int    `json:"capacity_units"`
	NodeID        string `json:"node_id"`
}

// RuntimeIngress is the managed-ingress identity: the name the edge routes the project under and
// the domains it routes to the node's provider endpoint.
type RuntimeIngress struct {
	Identity string         `json:"identity"`
	Routes   []RuntimeRoute `json:"routes"`
}

// RuntimeRoute is one domain routed to a service port.
type RuntimeRoute struct {
	Domain  string `json:"domain"`
	Service string `json:"service"`
	Port    int    `json:"port"`
}
