// Package errors names the stable error codes that cross Berth's boundaries: the
// HTTP API (problem+json "code"), the node session ("error" bodies) and plugin calls.
package errors

import (
	stderrors "errors"
	"net/http"
)

// Code is a stable, machine-readable error class. Codes never change meaning;
// new ones are added, old ones are never reused. docs/api.md lists them.
type Code string

// API codes (docs/api.md section "Errors").
const (
	BadRequest           Code = "bad_request"            // malformed JSON, wrong types, unknown fields
	UnsupportedMedia     Code = "unsupported_media_type" // a body that is not JSON where JSON is required
	BodyTooLarge         Code = "body_too_large"         // a body over the endpoint's limit
	InvalidName          Code = "invalid_name"           // a project or service name that is not a DNS label
	ValidationFailed     Code = "validation_failed"      // a well-formed request whose values are refused
	Unauthenticated      Code = "unauthenticated"        // missing or wrong credentials (always generic)
	Forbidden            Code = "forbidden"              // a valid bearer without the needed scope
	NotFound             Code = "not_found"              // no such route or object
	ProjectNotFound      Code = "project_not_found"      // the named project does not exist
	ServiceNotFound      Code = "service_not_found"      // the named service does not exist
	NodeNotFound         Code = "node_not_found"         // the named node does not exist
	BundleNotFound       Code = "bundle_not_found"       // no bundle with that digest or name in the project
	RevisionConflict     Code = "revision_conflict"      // expected_revision is stale
	AlreadyExists        Code = "already_exists"         // create of an object that exists
	JoinTokenUsed        Code = "join_token_used"        // a join token that was already consumed (409)
	JoinTokenExpired     Code = "join_token_expired"     // a join token past its lifetime or unknown (422)
	DigestMismatch       Code = "digest_mismatch"        // uploaded content does not hash to the claimed digest
	BundleInvalid        Code = "bundle_invalid"         // not a gzip tar, or a path or link escaping its root
	IdempotencyKeyReused Code = "idempotency_key_reused" // same Idempotency-Key with another body
	// IdempotencyKeyInFlight: the first request with this Idempotency-Key is still running; retry
	// after it answers (409, with Retry-After).
	IdempotencyKeyInFlight Code = "idempotency_key_in_flight"
	MethodNotAllowed       Code = "method_not_allowed"
	Internal               Code = "internal"    // details only in the server log
	Unavailable            Code = "unavailable" // a dependency (store, plugin) is not ready
)

// Gateway codes: the edge gateway's own answers (docs/plugins.md section 4).
const (
	NoRoute           Code = "no_route"            // no service is routed at the request's host
	NoHealthyUpstream Code = "no_healthy_upstream" // the route has no healthy upstream
	BadGateway        Code = "bad_gateway"         // the upstream tried last refused the connection or broke it before answering (502)
	GatewayTimeout    Code = "gateway_timeout"     // the upstream tried last did not accept or answer within the route's timeouts (504)
	SourceNotAllowed  Code = "source_not_allowed"  // the client's address is outside the route's allow_sources (403)
	TLSUnavailable    Code = "tls_unavailable"     // the route's tls_mode needs TLS the gateway does not serve (421)
)

// Plugin codes: refusals a plugin returns over its contract (docs/plugins.md section 1.5).
const (
	StaleFencingToken Code = "stale_fencing_token" // a mutating call's fencing token is lower than the highest seen for the resource
	Unimplemented     Code = "unimplemented"       // the plugin does not implement an optional call
	// ImageUnavailable: a runtime driver could not fetch a workload's image (the registry refused or
	// could not be reached, or its certificate did not match the pin); the message says why.
	ImageUnavailable Code = "image_unavailable"
)

// Lease codes (docs/api.md "Leases").
const (
	FenceAckMismatch Code = "fence_ack_mismatch" // a fence-ack's lease ids are not exactly the node's outstanding failed fences (409)
)

// WebAssembly extension codes (docs/wasm-abi.md section 9).
const (
	PolicyDenied   Code = "policy_denied"    // an admission policy denied the request; the problem's reasons say why (403)
	ModuleInvalid  Code = "module_invalid"   // an uploaded module does not implement the WebAssembly ABI (422)
	ModuleNotFound Code = "module_not_found" // no module with that digest (404)
	// ModuleAmbiguous: a binding named its module by a digest prefix or a name that more than
	// one pushed module has; the detail lists the candidates (409).
	ModuleAmbiguous Code = "module_ambiguous"
	BindingNotFound Code = "binding_not_found" // no policy binding with that id (404)
	// InputNotRecorded: this berthd keeps no input with that digest: it was
	// decided by another replica, before a restart, or too long ago (404).
	InputNotRecorded Code = "input_not_recorded"
)

// Route table codes (docs/routes.md section 3): a route compiler's table refused for a route's
// match conditions, in the compilation's error (GET /api/v1/routes last_error, berth conformance
// wasm, berth policy test). abi/routes declares the same strings for its InvalidError.
const (
	// RoutePathPrefixInvalid: a path_prefix not starting with "/", ending with "/", with "..", an
	// empty or "." segment, a NUL, a %-escape or another character outside a URL path; or
	// strip_prefix without a path_prefix (422).
	RoutePathPrefixInvalid Code = "route_path_prefix_invalid"
	// RouteHeaderInvalid: a header match whose name is not an HTTP token (or is Host), whose value
	// is empty or malformed, a name matched twice in one route, or too many matches (422).
	RouteHeaderInvalid Code = "route_header_invalid"
	// RouteMatchDuplicate: two routes of one hostname with the same path prefix and headers (422).
	RouteMatchDuplicate Code = "route_match_duplicate"
	// RouteMatchUnsupported: match conditions on a passthrough route, or routes of one hostname
	// with different tls_mode (422).
	RouteMatchUnsupported Code = "route_match_unsupported"
)

// Certificate codes (docs/certificates.md section 6): a service's tls block refused at apply.
const (
	// TLSCertificateInvalid: a tls_mode manual secret does not hold a PEM certificate chain and
	// the private key of its leaf, or the certificate does not cover the service's domains (422).
	TLSCertificateInvalid Code = "tls_certificate_invalid"
	// TLSDomainUnverifiable: a tls_mode acme domain is neither under a zone Berth manages DNS
	// for nor served on a port 80 the CA can reach, so no challenge can prove it (422).
	TLSDomainUnverifiable Code = "tls_domain_unverifiable"
	// TLSModeInvalid: an unknown tls mode, or manual without a secret (422).
	TLSModeInvalid Code = "tls_mode_invalid"
)

// Node-session codes (docs/node-protocol.md section "error").
const (
	BadMessage         Code = "bad_message"         // malformed or unknown message; non-fatal
	UnsupportedVersion Code = "unsupported_version" // envelope major version not implemented; fatal
	BadSignature       Code = "bad_signature"       // desired_state signature does not verify
	FenceFailed        Code = "fence_failed"        // a self-fence could not confirm its workloads stopped
	SessionReplaced    Code = "session_replaced"    // a newer session of the same node closed this one; fatal
	LogDiverged        Code = "log_diverged"        // hello's log_seq/log_hash differ from the core's change log; non-fatal (section 7.5)
	StreamLimit        Code = "stream_limit"        // a stream_open beyond the per-session limit (section 5.15)
	NodeRemoved        Code = "node_removed"        // the node was removed; fatal, the agent stops dialling for good (section 10)
)

// Orchestration codes: project leases, placement and the operation queue (docs/runner-protocol.md
// section 9). PROJECT_BUSY and PROJECT_LEASE_LOST keep their historical upper-case spelling.
const (
	ProjectBusy            Code = "PROJECT_BUSY"             // another control-plane worker holds the project's lease (409)
	ProjectLeaseLost       Code = "PROJECT_LEASE_LOST"       // the project lease expired or was taken while an operation ran (409)
	OperationLeaseLost     Code = "operation_lease_lost"     // a runner's operation lease is no longer current: reclaimed, expired or settled (409)
	PlacementModeImmutable Code = "placement_mode_immutable" // a later desired generation asked for another placement_mode (409)
	PlacementPinned        Code = "placement_pinned"         // region or requirements of a pinned placement cannot change (409)
	CapacityInUse          Code = "capacity_in_use"          // a node advertised less capacity than it has reserved (409)
	RequirementInUse       Code = "requirement_in_use"       // a node dropped a label or endpoint an assigned placement requires (409)
	EnrollmentInvalid      Code = "enrollment_invalid"       // a runner enrollment token is unknown, used, expired or bound to another node or region (401)
	NodeDraining           Code = "node_draining"            // a draining runner node asked for claims (409)
	NodeOffline            Code = "node_offline"             // a runner node whose heartbeat expired asked for claims; heartbeat first (409)
	IdempotencyKeyRequired Code = "idempotency_key_required" // a request that creates an operation carried no Idempotency-Key header (400)
)

// Reconciliation codes (docs/reconciliation.md sections 1, 8, 9 and 10): a runtime spec write's
// named refusals, with the dashes of their names as underscores.
const (
	Conflict                      Code = "conflict"                         // a spec write's expected_revision does not match what is stored (409)
	ServiceDeleting               Code = "service_deleting"                 // the service is being deleted and accepts no writes (409)
	NoPreviousRelease             Code = "no_previous_release"              // rollout undo of a service that never ran another release (409)
	SpecOwnsPlacement             Code = "spec_owns_placement"              // a service update states replicas while an operator runtime spec owns them (409)
	SpecNodeUnknown               Code = "spec_node_unknown"                // a pinned node id is not an enrolled, unretired node (422)
	SpecReadinessTargetUndeclared Code = "spec_readiness_target_undeclared" // a tcp or http probe names a port the service does not declare (422)
	SpecReadinessUnsupported      Code = "spec_readiness_unsupported"       // a tcp or http probe on an isolated network (422)
	SpecPlacementInvalid          Code = "spec_placement_invalid"           // unknown placement mode or bad pinned node list (422)
	SpecReplicasInvalid           Code = "spec_replicas_invalid"            // replica counts out of bounds or for the wrong placement (422)
	SpecResourcesInvalid          Code = "spec_resources_invalid"           // memory or CPU out of bounds (422)
	SpecReadinessInvalid          Code = "spec_readiness_invalid"           // unknown probe kind or timings out of bounds (422)
	SpecNetworkInvalid            Code = "spec_network_invalid"             // unknown network mode (422)
	NodeAlreadyRetired            Code = "node_already_retired"             // the node is retired, removed, or already retiring that way (409)
	NodeStillReporting            Code = "node_still_reporting"             // a lost retirement of a node that still reports (409)
)

// Change-log codes (docs/node-protocol.md section 7.8).
const (
	ChangeTooLarge Code = "change_too_large" // a write whose change-log entry would not fit in one node-session frame (413)
)

// Identity codes (docs/api.md section "Identity").
const (
	ReauthenticationRequired Code = "reauthentication_required" // a sensitive action by a human whose login is older than 5 minutes (401)
	ScopeHumanOnly           Code = "scope_human_only"          // a machine token asked for a human-only scope (422)
	PasswordPolicy           Code = "password_policy"           // a new password outside 20 characters to 1,024 bytes of UTF-8 (422)
	UserNotFound             Code = "user_not_found"            // no user with that name (404)
	TokenNotFound            Code = "token_not_found"           // no machine token with that name (404)
	CredentialInURL          Code = "credential_in_url"         // a bearer or password in the URL query (400); the request is not served
	// LoginBusy: as many password verifications run as the server allows at once; retry after
	// Retry-After (429). Nothing was verified.
	LoginBusy Code = "login_busy"
	// LoginBackoff: the name failed to log in too often; its next attempt is due after
	// Retry-After (429). Nothing was verified.
	LoginBackoff Code = "login_backoff"
	// LoginRateLimited: the client's address made too many login attempts; retry after
	// Retry-After (429). Nothing was verified.
	LoginRateLimited Code = "login_rate_limited"
)

// Upgrade codes (docs/upgrades.md): version skew, agent and node-plugin upgrades.
const (
	AgentVersionSkew  Code = "agent_version_skew"  // an agent or plugin version outside the skew berthd accepts; fatal on the node session (409)
	AgentDowngrade    Code = "agent_downgrade"     // an upgrade to an older version than the one running, without force (409)
	ReleaseNotFound   Code = "release_not_found"   // no release binary with that name, version or SHA-256 on this core (404)
	UpgradeInProgress Code = "upgrade_in_progress" // the node is already upgrading (409)
	UpgradeFailed     Code = "upgrade_failed"      // the node did not come back at the new version and runs the previous one (409)
)

// Secret codes (docs/api.md section 10). No code, message or problem detail ever carries a
// secret value.
const (
	SecretNotFound         Code = "secret_not_found"         // no secret (or version) with that name in the project (404)
	SecretSetNotFound      Code = "secret_set_not_found"     // no secret set with that name in the project (404)
	SecretInUse            Code = "secret_in_use"            // delete of a secret or set a service still references; the detail names the services (409)
	SecretUnknown          Code = "secret_unknown"           // a service or set references a secret, version or set that does not exist (422)
	SecretUseForbidden     Code = "secret_use_forbidden"     // a service write would make the service take a secret or set it did not, without secret:use; the detail names it (403)
	SecretTooLarge         Code = "secret_too_large"         // a value over the 64 KiB limit (413)
	SecretVersionsFull     Code = "secret_versions_full"     // a secret that holds its 64 versions; delete it and set it again (409)
	KeyringRotationRunning Code = "keyring_rotation_running" // a keyring rotation while the previous one still re-wraps (409)
	KeyringInvalid         Code = "keyring_invalid"          // the keyring file is missing, unsafe or malformed, or no longer the one berthd loaded
	SecretOpenFailed       Code = "secret_open_failed"       // a sealed value did not open: tampered, moved, or under a key not held; nothing was started with it
)

// Registry codes (docs/registry.md section 7).
const (
	ReleaseTagReserved Code = "release_tag_reserved" // a release tag that is already reserved or pushed in the repository (409)
	ReleaseTagInvalid  Code = "release_tag_invalid"  // "latest", or a name outside the OCI tag grammar (422)
	// ImageReleaseNotFound: a promotion of a tag the service's repository never had, or of a
	// release whose manifest registry retention removed (404).
	ImageReleaseNotFound Code = "image_release_not_found"
	// ReleaseNotPushed: a promotion of a tag reserved but not pushed yet (409).
	ReleaseNotPushed Code = "release_not_pushed"
	// ServiceNotContainer: a promotion of a service whose runtime is not "containerd" (409).
	ServiceNotContainer Code = "service_not_container"
)

// DNS codes (docs/dns.md section 5): the DNS provider plugin and the core's DNS records.
const (
	// DNSAuthRefused: the DNS server refused the TSIG key (NOTAUTH with BADSIG, BADKEY or
	// BADTIME on knot and BIND; REFUSED on PowerDNS). Not retryable: the key must change (502).
	DNSAuthRefused Code = "dns_auth_refused"
	// DNSZoneNotServed: a record outside the plugin's configured zones, or in a zone the server
	// is not authoritative for (NOTAUTH without a TSIG error, NOTZONE) (422).
	DNSZoneNotServed Code = "dns_zone_not_served"
	// DNSRecordNotOwned: a write or delete of a name and type Berth did not create, or that
	// another owner holds (its ownership record names someone else); nothing was changed (409).
	DNSRecordNotOwned Code = "dns_record_not_owned"
	// DNSChallengeHostUnknown: a node's dns_challenge for a host that is not a domain of a
	// route in its own desired state (docs/node-protocol.md section 6.8) (403).
	DNSChallengeHostUnknown Code = "dns_challenge_host_unknown"
)

// Operator codes: berthd's own configuration, backup and restore (docs/operating.md
// sections 3 and 5). They reach an operator's terminal, not the API.
const (
	ConfigInvalid   Code = "config_invalid"    // a configuration file with an unknown key or a bad value; the message names file, line and key
	BackupInvalid   Code = "backup_invalid"    // a backup archive that is truncated, tampered with or not a Berth backup; nothing was restored
	RestoreNotEmpty Code = "restore_not_empty" // restore into a data directory that already holds something; nothing was written
)

// Binding codes: platform resources a service binds (docs/bindings.md).
const (
	BindingNotGranted  Code = "binding_not_granted"  // a provider call without a grant, or with one whose digest does not cover the exact request (403)
	BindingKindUnknown Code = "binding_kind_unknown" // a service binding of a kind no provider serves (422)
	BindingNameClash   Code = "binding_name_clash"   // two bindings of one service with the same name, or a name that is not a DNS label (422)
	BindingUnavailable Code = "binding_unavailable"  // the server that holds a binding's data did not answer; the reason says why (503)
	// BackupScheduleInvalid: a service's backup block with a cron expression that does not
	// parse, a keep outside 0 to 1,000, or a drill other than daily or weekly (422).
	BackupScheduleInvalid Code = "backup_schedule_invalid"
)

// Cloud provider codes: a machine provider plugin's refusals (docs/plugins-hetzner.md section 6).
// The provider's own error codes map onto them; [ProviderRetryable] says which are worth a retry.
const (
	ProviderInvalidInput          Code = "provider_invalid_input"           // the cloud refused a field (unknown type, location, image); final (422)
	ProviderForbidden             Code = "provider_forbidden"               // the cloud refused the API token (unknown, or read-only for a write); final (403)
	ProviderResourceLimitExceeded Code = "provider_resource_limit_exceeded" // the project's quota (servers, cores) is used up; final (409)
	ProviderResourceUnavailable   Code = "provider_resource_unavailable"    // the type or location has no capacity now, or a server did not finish booting; retried with backoff (503)
	ProviderPlacementError        Code = "provider_placement_error"         // the cloud could not place the server (placement group spread); retried with backoff (503)
	ProviderLocked                Code = "provider_locked"                  // another action holds the server's lock; retried with backoff (409)
	ProviderActionFailed          Code = "provider_action_failed"           // an action the create started (start_server) failed; the server was deleted; final (502)
	ProviderNameTaken             Code = "provider_name_taken"              // the machine id is the name of a server Berth did not create; final (409)
)

// ProviderRetryable reports whether a provider refusal of code c may succeed
// when retried later: capacity, placement and locks change, quotas and
// tokens do not; unavailable covers 5xx answers and timeouts.
func ProviderRetryable(c Code) bool {
	switch c {
	case ProviderResourceUnavailable, ProviderPlacementError, ProviderLocked, Unavailable:
		return true
	}
	return false
}

var statuses = map[Code]int{
	ProviderInvalidInput:          http.StatusUnprocessableEntity,
	ProviderForbidden:             http.StatusForbidden,
	ProviderResourceLimitExceeded: http.StatusConflict,
	ProviderResourceUnavailable:   http.StatusServiceUnavailable,
	ProviderPlacementError:        http.StatusServiceUnavailable,
	ProviderLocked:                http.StatusConflict,
	ProviderActionFailed:          http.StatusBadGateway,
	ProviderNameTaken:             http.StatusConflict,

	BindingNotGranted:     http.StatusForbidden,
	BindingKindUnknown:    http.StatusUnprocessableEntity,
	BindingNameClash:      http.StatusUnprocessableEntity,
	BindingUnavailable:    http.StatusServiceUnavailable,
	BackupScheduleInvalid: http.StatusUnprocessableEntity,
	TLSCertificateInvalid: http.StatusUnprocessableEntity,
	TLSDomainUnverifiable: http.StatusUnprocessableEntity,
	TLSModeInvalid:        http.StatusUnprocessableEntity,

	SecretNotFound:         http.StatusNotFound,
	SecretSetNotFound:      http.StatusNotFound,
	SecretInUse:            http.StatusConflict,
	SecretUnknown:          http.StatusUnprocessableEntity,
	SecretUseForbidden:     http.StatusForbidden,
	SecretTooLarge:         http.StatusRequestEntityTooLarge,
	SecretVersionsFull:     http.StatusConflict,
	KeyringRotationRunning: http.StatusConflict,
	KeyringInvalid:         http.StatusServiceUnavailable,
	SecretOpenFailed:       http.StatusUnprocessableEntity,
	ReleaseTagReserved:     http.StatusConflict,
	ReleaseTagInvalid:      http.StatusUnprocessableEntity,
	ImageReleaseNotFound:   http.StatusNotFound,
	ReleaseNotPushed:       http.StatusConflict,
	ServiceNotContainer:    http.StatusConflict,

	DNSAuthRefused:           http.StatusBadGateway,
	DNSZoneNotServed:         http.StatusUnprocessableEntity,
	DNSRecordNotOwned:        http.StatusConflict,
	DNSChallengeHostUnknown:  http.StatusForbidden,
	RelayProtocolUnsupported: http.StatusBadRequest,
	RelayNotConnected:        http.StatusServiceUnavailable,
	RelayAmbiguous:           http.StatusConflict,
	RelayCredentialStale:     http.StatusUnauthorized,
	RelayRegistrationRefused: http.StatusConflict,
	RelayClusterMismatch:     http.StatusForbidden,
	RelayRequired:            http.StatusForbidden,
	ClusterNotFound:          http.StatusNotFound,
	ClusterNoRelay:           http.StatusConflict,
	BackupCorrupt:            http.StatusUnprocessableEntity,
	BackupVersionMismatch:    http.StatusUnprocessableEntity,
	BackupNotFound:           http.StatusNotFound,
	BackupNotRestorable:      http.StatusConflict,
	RestoreTargetRunning:     http.StatusConflict,
	BackupNothingToBack:      http.StatusUnprocessableEntity,

	AgentVersionSkew:  http.StatusConflict,
	AgentDowngrade:    http.StatusConflict,
	ReleaseNotFound:   http.StatusNotFound,
	UpgradeInProgress: http.StatusConflict,
	UpgradeFailed:     http.StatusConflict,

	Conflict:                      http.StatusConflict,
	ServiceDeleting:               http.StatusConflict,
	NoPreviousRelease:             http.StatusConflict,
	SpecOwnsPlacement:             http.StatusConflict,
	SpecNodeUnknown:               http.StatusUnprocessableEntity,
	SpecReadinessTargetUndeclared: http.StatusUnprocessableEntity,
	SpecReadinessUnsupported:      http.StatusUnprocessableEntity,
	SpecPlacementInvalid:          http.StatusUnprocessableEntity,
	SpecReplicasInvalid:           http.StatusUnprocessableEntity,
	SpecResourcesInvalid:          http.StatusUnprocessableEntity,
	SpecReadinessInvalid:          http.StatusUnprocessableEntity,
	SpecNetworkInvalid:            http.StatusUnprocessableEntity,
	NodeAlreadyRetired:            http.StatusConflict,
	NodeStillReporting:            http.StatusConflict,
	ChangeTooLarge:                http.StatusRequestEntityTooLarge,

	ReauthenticationRequired: http.StatusUnauthorized,
	ScopeHumanOnly:           http.StatusUnprocessableEntity,
	PasswordPolicy:           http.StatusUnprocessableEntity,
	UserNotFound:             http.StatusNotFound,
	TokenNotFound:            http.StatusNotFound,
	CredentialInURL:          http.StatusBadRequest,
	LoginBusy:                http.StatusTooManyRequests,
	LoginBackoff:             http.StatusTooManyRequests,
	LoginRateLimited:         http.StatusTooManyRequests,

	BadRequest:           http.StatusBadRequest,
	UnsupportedMedia:     http.StatusUnsupportedMediaType,
	BodyTooLarge:         http.StatusRequestEntityTooLarge,
	InvalidName:          http.StatusUnprocessableEntity,
	ValidationFailed:     http.StatusUnprocessableEntity,
	Unauthenticated:      http.StatusUnauthorized,
	Forbidden:            http.StatusForbidden,
	NotFound:             http.StatusNotFound,
	ProjectNotFound:      http.StatusNotFound,
	ServiceNotFound:      http.StatusNotFound,
	NodeNotFound:         http.StatusNotFound,
	BundleNotFound:       http.StatusNotFound,
	RevisionConflict:     http.StatusConflict,
	AlreadyExists:        http.StatusConflict,
	JoinTokenUsed:        http.StatusConflict,
	JoinTokenExpired:     http.StatusUnprocessableEntity,
	DigestMismatch:       http.StatusUnprocessableEntity,
	BundleInvalid:        http.StatusUnprocessableEntity,
	IdempotencyKeyReused: http.StatusUnprocessableEntity,
	MethodNotAllowed:     http.StatusMethodNotAllowed,
	Internal:             http.StatusInternalServerError,
	Unavailable:          http.StatusServiceUnavailable,
	NoRoute:              http.StatusNotFound,
	NoHealthyUpstream:    http.StatusServiceUnavailable,
	BadGateway:           http.StatusBadGateway,
	GatewayTimeout:       http.StatusGatewayTimeout,
	SourceNotAllowed:     http.StatusForbidden,
	TLSUnavailable:       http.StatusMisdirectedRequest,
	PolicyDenied:         http.StatusForbidden,
	ModuleInvalid:        http.StatusUnprocessableEntity,
	ModuleNotFound:       http.StatusNotFound,
	ModuleAmbiguous:      http.StatusConflict,
	BindingNotFound:      http.StatusNotFound,
	InputNotRecorded:     http.StatusNotFound,

	RoutePathPrefixInvalid: http.StatusUnprocessableEntity,
	RouteHeaderInvalid:     http.StatusUnprocessableEntity,
	RouteMatchDuplicate:    http.StatusUnprocessableEntity,
	RouteMatchUnsupported:  http.StatusUnprocessableEntity,
	StaleFencingToken:      http.StatusConflict,
	ImageUnavailable:       http.StatusServiceUnavailable,
	FenceAckMismatch:       http.StatusConflict,
	Unimplemented:          http.StatusNotImplemented,
	StreamLimit:            http.StatusTooManyRequests,

	// Orchestration.
	ProjectBusy:            http.StatusConflict,
	ProjectLeaseLost:       http.StatusConflict,
	OperationLeaseLost:     http.StatusConflict,
	PlacementModeImmutable: http.StatusConflict,
	PlacementPinned:        http.StatusConflict,
	CapacityInUse:          http.StatusConflict,
	RequirementInUse:       http.StatusConflict,
	EnrollmentInvalid:      http.StatusUnauthorized,
	NodeDraining:           http.StatusConflict,
	NodeOffline:            http.StatusConflict,
	IdempotencyKeyRequired: http.StatusBadRequest,
	IdempotencyKeyInFlight: http.StatusConflict,
}

// HTTPStatus reports the HTTP status that carries c; 500 for a code without one.
func (c Code) HTTPStatus() int {
	if s, ok := statuses[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an error with a stable code. Message is safe to show to the caller.
type Error struct {
	Code    Code
	Message string
	Err     error // optional cause, never shown to a remote caller
}

// New returns an *Error with code c and message msg.
func New(c Code, msg string) *Error { return &Error{Code: c, Message: msg} }

// Wrap returns an *Error with code c and message msg that wraps cause.
func Wrap(c Code, msg string, cause error) *Error { return &Error{Code: c, Message: msg, Err: cause} }

func (e *Error) Error() string {
	if e.Err != nil {
		return string(e.Code) + ": " + e.Message + ": " + e.Err.Error()
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code, so
// errors.Is(err, errors.New(errors.NotFound, "")) matches by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// CodeOf returns the code of the first *Error in err's chain, or Internal.
func CodeOf(err error) Code {
	var e *Error
	if stderrors.As(err, &e) {
		return e.Code
	}
	return Internal
}
