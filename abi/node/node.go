// Package node holds the wire types of the node session: the v1 envelope and the
// message bodies exchanged between berth-agent and berthd (docs/node-protocol.md).
package node

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// Version is the envelope major version this package implements.
//
// Changelog: 1 (2026-11-29) first version.
const Version = 1

// MaxMessageBytes is the largest frame either side accepts (docs/node-protocol.md section 3.2).
const MaxMessageBytes = 1 << 20

// Default timers, used until a welcome carries others (docs/node-protocol.md section 4.3).
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultSessionTimeout    = 15 * time.Second
	StatusReportInterval     = 30 * time.Second
)

// Type names a message.
type Type string

// Message types of v1.
const (
	TypeHello         Type = "hello"
	TypeHeartbeat     Type = "heartbeat"
	TypeStatusReport  Type = "status_report"
	TypeCommandResult Type = "command_result"
	TypeWelcome       Type = "welcome"
	TypeDesiredState  Type = "desired_state"
	TypeError         Type = "error"
	TypePing          Type = "ping"
	TypePong          Type = "pong"
	// TypeEvent carries one [Event], node to core (section 5.4).
	TypeEvent Type = "event"
)

// MaxBufferedEvents bounds the node's event buffer while disconnected; on
// overflow the oldest are dropped and counted in hello's dropped_events
// (docs/node-protocol.md section 6.5).
const MaxBufferedEvents = 10000

// Envelope wraps every message: {"v":1,"type":...,"id":"msg_...","re":...,"body":{...}}.
// ID pairs a request with its answer inside one session and is never persisted.
type Envelope struct {
	V    int             `json:"v"`
	Type Type            `json:"type"`
	ID   string          `json:"id"`
	Re   string          `json:"re,omitempty"`
	Body json.RawMessage `json:"body"`
}

// Hello is the first message of every session, node to core (section 5.1).
type Hello struct {
	NodeID       string    `json:"node_id"`
	AgentVersion string    `json:"agent_version"`
	BootID       string    `json:"boot_id,omitempty"`
	StoredRev    int64     `json:"stored_rev"`
	AppliedRev   int64     `json:"applied_rev"`
	Capacity     Resources `json:"capacity"`
	Allocated    Resources `json:"allocated"`
	// Allocatable is what the node can give to workloads, after what the host keeps
	// (section 5.1); nil from agents older than the field.
	Allocatable *Allocatable `json:"allocatable,omitempty"`
	// ResourceLimits says how the node enforces workload memory and CPU limits: "cgroup2",
	// "cgroup1", "container", or "none: <why>" (section 5.1); "" when unknown.
	ResourceLimits string   `json:"resource_limits,omitempty"`
	Drivers        []string `json:"drivers,omitempty"` // runtime drivers the node runs, e.g. ["process"]
	// DriverVersions maps each runtime driver's name to the version its
	// Describe answered (the seed's engine_version).
	DriverVersions map[string]string `json:"driver_versions,omitempty"`
	// NetworkVersions maps each node-network plugin the node runs
	// (docs/plugins.md section 7; e.g. "nftables") to the version its
	// Describe answered; absent when the node runs none. berthd judges them
	// by the skew rule and offers their in-place upgrade
	// (docs/upgrades.md sections 2 and 3.5).
	NetworkVersions map[string]string `json:"network_versions,omitempty"`
	// LogSeq and LogHash are the newest change-log entry the node verified
	// and stored (0 and "" when none; section 7).
	LogSeq  int64  `json:"log_seq"`
	LogHash string `json:"log_hash,omitempty"`
	// DroppedEvents counts events the node dropped from its full buffer
	// since its last hello (section 6.5).
	DroppedEvents int64 `json:"dropped_events"`
	// SigningKeyID is the [KeyID] of the cluster signing key the node pins
	// (section 5.21); a core that rotated its key since sends the node a
	// signing_key_rotate signed by this one before desired_state. Empty
	// (older agents) means unknown: nothing is rotated at the handshake.
	SigningKeyID string `json:"signing_key_id,omitempty"`
	// Leases lists every lease the node believes it holds or held
	// (section 5.1): states held, uncertain, and expired or revoked ones
	// not yet superseded by a higher grant.
	Leases []HelloLease `json:"leases,omitempty"`
}

// Resources is a node's capacity or allocation.
type Resources struct {
	CPUs     int   `json:"cpus"`
	MemoryMB int64 `json:"memory_mb"`
	DiskGB   int64 `json:"disk_gb,omitempty"`
}

// Allocatable is what a node can give to workloads (docs/node-protocol.md section 5.1): its
// CPU in thousandths of a CPU, memory and disk for volumes in MiB (2^20 bytes), after what the
// host keeps for itself, and the extended resources its operator declared (berth-agent run
// --resource gpu=1), by name. A zero field is unknown.
type Allocatable struct {
	CPUMilli  int64            `json:"cpu_m,omitempty"`
	MemoryMiB int64            `json:"memory_mib,omitempty"`
	DiskMiB   int64            `json:"disk_mib,omitempty"`
	Extended  map[string]int64 `json:"extended,omitempty"`
}

// Heartbeat is sent by the node every heartbeat interval (section 5.2).
type Heartbeat struct {
	Time time.Time `json:"time"`
	Busy bool      `json:"busy"`
}

// Observed workload statuses (section 5.3).
const (
	StatusCreating = "creating"
	StatusStopped  = "stopped"
	StatusStarting = "starting"
	StatusRunning  = "running"
	StatusStopping = "stopping"
	StatusCrashed  = "crashed"
	StatusDeleted  = "deleted"
	StatusUnknown  = "unknown"
)

// Health values (section 5.3).
const (
	HealthPassing = "passing"
	HealthFailing = "failing"
	HealthUnknown = "unknown"
)

// StatusReport tells the core what the node observes (section 5.3).
type StatusReport struct {
	AppliedRev int64            `json:"applied_rev"`
	Workloads  []WorkloadStatus `json:"workloads"`
	Routes     []RouteStatus    `json:"routes,omitempty"`
	Capacity   Resources        `json:"capacity"`
	Allocated  Resources        `json:"allocated"`
	// DiskFreeGB is the free space of the agent's data directory, in GB
	// (10^9 bytes); zero when unknown.
	DiskFreeGB float64 `json:"disk_free_gb,omitempty"`
	// Allocatable and ResourceLimits are as in [Hello]; a report repeats them so a change
	// (a disk filling up) reaches the core without a new session.
	Allocatable    *Allocatable `json:"allocatable,omitempty"`
	ResourceLimits string       `json:"resource_limits,omitempty"`
}

// RouteStatus is one hostname of the node's desired routes as served
// (section 5.3). CertStatus is one of pending, issued, renewing, failed,
// not_applicable; CertExpiresAt is set when a certificate is issued.
type RouteStatus struct {
	Hostname      string     `json:"hostname"`
	CertStatus    string     `json:"cert_status"`
	CertExpiresAt *time.Time `json:"cert_expires_at,omitempty"`
}

// Event is something the cluster should know that happened on a node
// (section 5.4): the body of an event message. The node names the event
// (ID, "evt_" + ULID) and the core assigns its seq on receipt and drops an ID
// it has already stored, so a resent event never makes two rows.
type Event struct {
	SchemaVersion int            `json:"schema_version"` // 1
	ID            string         `json:"id"`
	Type          string         `json:"type"` // e.g. "app.down", "app.up", "workload.crashed"
	Time          time.Time      `json:"time"`
	Source        EventSource    `json:"source"`
	Subject       EventRef       `json:"subject"`
	ProjectID     string         `json:"project_id,omitempty"`
	Actor         EventRef       `json:"actor"`
	Data          map[string]any `json:"data,omitempty"`
}

// EventSource says which process emitted an event: Kind "node" with NodeID, or "core".
type EventSource struct {
	Kind   string `json:"kind"`
	NodeID string `json:"node_id,omitempty"`
}

// EventRef names an entity: {"type": "workload", "id": "wl_..."}.
type EventRef struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// WorkloadStatus is one workload as the node observes it. Address is
// "host:port" where the workload serves HTTP, empty until it listens.
type WorkloadStatus struct {
	WorkloadID     string `json:"workload_id"`
	ObservedStatus string `json:"observed_status"`
	Health         string `json:"health"`
	Address        string `json:"address,omitempty"`
	RestartCount   int    `json:"restart_count"`
	LastExitCode   *int   `json:"last_exit_code,omitempty"`
	Message        string `json:"message,omitempty"` // last error, e.g. a failed bundle download
	// LastFailure is the workload's most recent failure as structured
	// fields (section 5.3.1); nil while it has not failed. Absent from
	// older agents.
	LastFailure *Failure `json:"last_failure,omitempty"`
	// ExitReason is why the workload last exited when the runtime driver knows more than its
	// exit code: "oom" when the kernel's OOM killer ended it for going over its memory limit;
	// absent otherwise.
	ExitReason string `json:"exit_reason,omitempty"`
	// Job is how a job run's workload ended or stands (docs/jobs.md section 7); nil for a
	// service's workload and from older agents.
	Job *JobOutcome `json:"job,omitempty"`
}

// Job run results of a [JobOutcome] (docs/jobs.md section 7).
const (
	// JobRunning: the run's process is running, or waits for its retry's backoff.
	JobRunning = "running"
	// JobSucceeded: the process exited 0; it is never started again.
	JobSucceeded = "succeeded"
	// JobFailed: the process exited non-zero or died of a signal and no retry is left.
	JobFailed = "failed"
	// JobTimedOut: the run outlived its timeout and the agent stopped it (graceful, then forced).
	JobTimedOut = "timed_out"
)

// JobRun marks a workload as one run of a job (docs/jobs.md section 7): it runs to
// completion instead of being kept running.
type JobRun struct {
	// RunID is the run's id in the core (`<project>/<job>@<fire instant>`).
	RunID string `json:"run_id"`
	// TimeoutS bounds the whole run, retries included, in seconds from its first start; 0 means
	// no bound.
	TimeoutS int `json:"timeout_s,omitempty"`
	// Retries is how many times a failed attempt is started again, after the slot backoff.
	Retries int `json:"retries,omitempty"`
}

// JobOutcome is what the node reports of a job run's workload.
type JobOutcome struct {
	// Result is [JobRunning], [JobSucceeded], [JobFailed] or [JobTimedOut].
	Result string `json:"result"`
	// Attempts counts the starts of the run's process (1 without retries).
	Attempts int `json:"attempts"`
	// ExitCode is the last attempt's exit code; nil when it died of a signal or is running.
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal is the signal number that ended the last attempt; 0 when none.
	Signal int `json:"signal,omitempty"`
	// StartedAt is the node's clock at the first start; EndedAt when the run ended (zero while
	// it runs).
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// OutputTail is the end of the run's output (at most [JobOutputTailBytes] bytes), once it
	// ended.
	OutputTail string `json:"output_tail,omitempty"`
}

// JobOutputTailBytes bounds [JobOutcome.OutputTail].
const JobOutputTailBytes = 4096

// FailureKind names what failed (docs/node-protocol.md section 5.3.1).
type FailureKind string

// Failure kinds.
const (
	// FailureExit: the process exited unasked with ExitCode.
	FailureExit FailureKind = "exit"
	// FailureSignal: the process was ended by Signal (a process driver
	// reports such an exit as 128 + signal).
	FailureSignal FailureKind = "signal"
	// FailureProbe: the readiness probe at ProbeURL fails; ProbeStatus is
	// the HTTP status it answered, 0 when it did not answer (Message says
	// why).
	FailureProbe FailureKind = "probe"
	// FailureStart: the runtime driver could not start the workload
	// (port, working directory, network, the driver's Start).
	FailureStart FailureKind = "start"
	// FailureImage: the workload's bundle or image could not be fetched or
	// unpacked.
	FailureImage FailureKind = "image"
	// FailureOOM: the kernel's OOM killer ended the process for going over the workload's
	// memory limit (MemoryBytes); Signal is 9.
	FailureOOM FailureKind = "oom"
)

// Failure is one failure of a workload (section 5.3.1). At is the node's
// clock when it observed the failure; Count is how many failures the node
// observed for this workload so far (probe failures count consecutive failed
// probes of the current run).
type Failure struct {
	Kind        FailureKind `json:"kind"`
	ExitCode    *int        `json:"exit_code,omitempty"`
	Signal      int         `json:"signal,omitempty"`
	ProbeURL    string      `json:"probe_url,omitempty"`
	ProbeStatus int         `json:"probe_status,omitempty"`
	Message     string      `json:"message,omitempty"`
	At          time.Time   `json:"at"`
	Count       int         `json:"count"`
}

// ExitFailure classifies an unasked exit with code (-1: unknown) observed
// at: exit codes 129..192 are read as the signal code-128, the process
// driver's convention for a signalled process.
func ExitFailure(code int, at time.Time, count int) Failure {
	f := Failure{Kind: FailureExit, At: at, Count: count}
	switch {
	case code > 128 && code <= 128+64:
		f.Kind, f.Signal = FailureSignal, code-128
	case code >= 0:
		c := code
		f.ExitCode = &c
	}
	return f
}

// CommandResult answers desired_state (meaning "stored") and commands (section 5.9).
//
// Lines answers logs_query, Metrics metrics_query and Probe probe; each is
// absent otherwise.
type CommandResult struct {
	Status string     `json:"status"` // "ok" or "error"
	Detail string     `json:"detail,omitempty"`
	Error  *ErrorBody `json:"error,omitempty"`
	Lines  []LogLine  `json:"lines,omitempty"`
	// More reports, for a logs_query with after_seq, that records after the last of Lines
	// exist which did not fit the answer.
	More    bool     `json:"more,omitempty"`
	Metrics *Metrics `json:"metrics,omitempty"`
	Probe   *Probe   `json:"probe,omitempty"`
	// SecretKey answers secret_key_rotate: the node's new X25519 public key, base64.
	SecretKey string `json:"secret_key,omitempty"`
}

// ErrorBody is the body of an error message, and the error of a CommandResult (section 5.18).
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Fatal   bool   `json:"fatal"`
}

// Welcome is the core's first message, answering hello (section 5.10).
type Welcome struct {
	ClusterID           string    `json:"cluster_id"`
	Term                int64     `json:"term"`
	ServerTime          time.Time `json:"server_time"`
	HeartbeatIntervalMS int64     `json:"heartbeat_interval_ms"`
	SessionTimeoutMS    int64     `json:"session_timeout_ms"`
}

// DesiredState is the full, signed snapshot of what a node should run (section 5.11).
// Signature is base64 (std encoding) of the Ed25519 signature over the RFC 8785
// form of the body without the signature member; see [Sign] and [Verify].
type DesiredState struct {
	Rev       int64     `json:"rev"`
	IssuedAt  time.Time `json:"issued_at"`
	Term      int64     `json:"term"`
	Spec      Spec      `json:"spec"`
	Signature string    `json:"signature,omitempty"`
}

// Spec is the complete set of a node's workloads and routes.
type Spec struct {
	Workloads []WorkloadSpec `json:"workloads"`
	Routes    []RouteSpec    `json:"routes"`
	Network   Network        `json:"network"`
	// PurgeVolumes names the services being deleted with their volumes whose workloads this
	// node holds (section 6.7): once no workload of one is in the spec or on the node any more,
	// the agent removes DATA/volumes/<project>/<service> before it acknowledges the revision.
	// Sorted by project and service; absent when empty.
	PurgeVolumes []VolumePurge `json:"purge_volumes,omitempty"`
	// RegistryHost is the host (and port) of the core's registry as the image references of
	// Workloads name it, present when one of them does. A node that reaches the core through a
	// relay pulls those images from its relay's /v2/ instead, with its own credential
	// (docs/relay.md section 12).
	RegistryHost string `json:"registry_host,omitempty"`
}

// VolumePurge names one service whose volumes a node removes (section 6.7).
type VolumePurge struct {
	ProjectID string `json:"project_id"`
	Project   string `json:"project"`
	ServiceID string `json:"service_id"`
	Service   string `json:"service"`
}

// Desired workload statuses.
const (
	DesiredRunning = "running"
	DesiredStopped = "stopped"
)

// WorkloadSpec is one workload the node should hold. BundleDigest is
// "sha256:<64 hex>"; the agent downloads it from GET /api/v1/bundles/{digest}.
// Port is the port the app listens on when it does not honour PORT; the process
// driver always sets PORT to a free port of the node's address.
type WorkloadSpec struct {
	WorkloadID        string            `json:"workload_id"`
	ProjectID         string            `json:"project_id"`
	Project           string            `json:"project"`
	ServiceID         string            `json:"service_id"`
	Service           string            `json:"service"`
	Slot              int               `json:"slot"`
	Driver            string            `json:"driver"` // "process" or "containerd"
	BundleDigest      string            `json:"bundle_digest"`
	Command           []string          `json:"command"`
	Env               map[string]string `json:"env,omitempty"`
	Port              int               `json:"port,omitempty"`
	HealthCheck       HealthCheck       `json:"health_check"`
	DesiredStatus     string            `json:"desired_status"`
	RestartGeneration int64             `json:"restart_generation"`
	Stateful          bool              `json:"stateful"`
	// LeaseID and FencingToken bind a stateful workload to the lease the
	// node must hold, in state held with exactly this token, before it
	// starts the workload (section 6.4). Empty and 0 when not stateful.
	LeaseID      string `json:"lease_id,omitempty"`
	FencingToken int64  `json:"fencing_token,omitempty"`
	// Image is the container image of a containerd workload, pinned by
	// digest: "host/repo@sha256:<hex>", or "sha256:<hex>" naming an image of
	// the OCI image layout in BundleDigest (docs/plugins.md section 3).
	// User, MemoryBytes (bytes) and CPUMillis (thousandths of a CPU) apply
	// to containers; zero means the image's user and no limit.
	Image       string `json:"image,omitempty"`
	User        string `json:"user,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	CPUMillis   int64  `json:"cpu_millis,omitempty"`
	// Secrets are the workload's secret values, each sealed to this node's
	// X25519 key (section 6.6); empty when the service references none.
	Secrets []WorkloadSecret `json:"secrets,omitempty"`
	// Volumes are the service's persistent directories (docs/node-protocol.md section 6.7);
	// absent when it has none.
	Volumes []Volume `json:"volumes,omitempty"`
	// Job, when set, marks the workload as one run of a job: the agent records its exit
	// instead of restarting it (docs/jobs.md section 7). Nil for a service's workload.
	Job *JobRun `json:"job,omitempty"`
}

// Volume is one persistent directory of a service: Name is a lowercase label unique within
// the service; Path is where a container sees it (a process workload gets its directory in
// BERTH_VOLUME_<NAME> instead).
type Volume struct {
	Name string `json:"name"`
	Path string `json:"path,omitempty"`
}

// Secret delivery modes of a [WorkloadSecret].
const (
	SecretAsEnv  = "env"  // an environment variable named Key
	SecretAsFile = "file" // a file named Key in the directory $BERTH_SECRETS_DIR
	// SecretAsRegistry: the pull credential ("user:password") of the image registry whose
	// host ("host[:port]") is Key, handed to the runtime driver, never to the workload
	// (docs/registry.md section 9).
	SecretAsRegistry = "registry"
)

// EnvSafe reports whether value can be delivered as an environment variable ([SecretAsEnv]):
// UTF-8 text without a NUL byte. An environment entry ends at its first NUL, and the runtime
// driver contract carries the environment as protobuf strings, which must be UTF-8. A file
// ([SecretAsFile]) carries any bytes.
func EnvSafe(value []byte) bool {
	return utf8.Valid(value) && bytes.IndexByte(value, 0) < 0
}

// WorkloadSecret is one secret value of a workload, sealed to the node that runs it
// (docs/node-protocol.md section 6.6). Secret and Version name what it is; the value travels
// only in Sealed: nacl/box anonymous sealing (X25519, XSalsa20-Poly1305) to the node key
// RecipientKey names, of [SealedSecretPlaintext]. The agent opens it only to start the workload,
// and refuses a plaintext bound to another workload, key, secret or version.
type WorkloadSecret struct {
	Key     string `json:"key"`
	As      string `json:"as"`
	Secret  string `json:"secret"`
	Version int    `json:"version"`
	// RecipientKey is the hex SHA-256 of the node's X25519 public key the value is sealed to.
	RecipientKey string `json:"recipient_key"`
	Sealed       []byte `json:"sealed,omitempty"`
}

// SealedSecretPlaintext is what [WorkloadSecret.Sealed] seals: a binding prefix naming the
// workload, key, secret and version, each preceded by its length, then the value.
func SealedSecretPlaintext(workloadID string, s WorkloadSecret, value []byte) []byte {
	out := []byte("berth.secret.delivery.v1")
	for _, p := range []string{workloadID, s.Key, s.Secret, strconv.Itoa(s.Version)} {
		out = append(out, ':')
		out = append(out, strconv.Itoa(len(p))...)
		out = append(out, ':')
		out = append(out, p...)
	}
	out = append(out, '\n')
	return append(out, value...)
}

// OpenedSecretValue checks that plain is [SealedSecretPlaintext] of workloadID and s and returns
// the value; ok is false for any other binding.
func OpenedSecretValue(workloadID string, s WorkloadSecret, plain []byte) (value []byte, ok bool) {
	prefix := SealedSecretPlaintext(workloadID, s, nil)
	if len(plain) < len(prefix) || string(plain[:len(prefix)]) != string(prefix) {
		return nil, false
	}
	return plain[len(prefix):], true
}

// HealthCheck is an HTTP GET probe; zero fields take the defaults of section 6.3
// ([HealthCheck.WithDefaults]).
type HealthCheck struct {
	Path      string `json:"path,omitempty"`
	IntervalS int    `json:"interval_s,omitempty"`
	TimeoutS  int    `json:"timeout_s,omitempty"`
	Failures  int    `json:"failures,omitempty"`
}

// Defaults of a health check (section 6.3): what a zero field of [HealthCheck] means. The
// agent probes with them and the core shows them to policies; both read them here.
const (
	DefaultHealthPath      = "/"
	DefaultHealthIntervalS = 10
	DefaultHealthTimeoutS  = 2
	DefaultHealthFailures  = 3
)

// WithDefaults returns h with each zero (or negative) field replaced by its default of
// section 6.3: the probe a node runs for h.
func (h HealthCheck) WithDefaults() HealthCheck {
	if h.Path == "" {
		h.Path = DefaultHealthPath
	}
	if h.IntervalS <= 0 {
		h.IntervalS = DefaultHealthIntervalS
	}
	if h.TimeoutS <= 0 {
		h.TimeoutS = DefaultHealthTimeoutS
	}
	if h.Failures <= 0 {
		h.Failures = DefaultHealthFailures
	}
	return h
}

// RouteSpec is a hostname served by workloads of this node.
type RouteSpec struct {
	Hostname    string   `json:"hostname"`
	ServiceID   string   `json:"service_id"`
	WorkloadIDs []string `json:"workload_ids"`
	TLSMode     string   `json:"tls_mode"` // "none" for now
}

// Network is the node's workload network. For the process driver, Address is the
// node address workloads bind to.
type Network struct {
	Address string `json:"address,omitempty"`
	Subnet  string `json:"subnet,omitempty"`
	Gateway string `json:"gateway,omitempty"`
}

// ValidVolumeName reports whether s names a volume: 1 to 63 of [a-z0-9-], starting with a
// letter and not ending with '-'.
func ValidVolumeName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
