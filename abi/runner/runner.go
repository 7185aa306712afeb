// Package runner holds the wire types of the runner transport /api/runner/v1: registration,
// heartbeat, claims, lease renewal, settlement, observations and artifacts (docs/runner-protocol.md section 6).
package runner

import (
	"encoding/json"
	"time"
)

// Version 1 of the transport. Changelog: 2026-11-29 first version.
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
	// EnvRegistrationToken names the environment variable a runner reads its enrollment token from.
	EnvRegistrationToken = "BERTH_RUNNER_REGISTRATION_TOKEN"
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

// ReconcilePayload is the canonical payload of a "reconcile" operation.
type ReconcilePayload struct {
	Generation int64  `json:"generation"`
	Release    string `json:"release"`
	State      string `json:"state"`
}
