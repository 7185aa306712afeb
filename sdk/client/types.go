// Package client is the Go client of Berth's HTTP API (/api/v1) and the types of
// its requests and answers (docs/api.md).
package client

import (
	"time"

	"github.com/berthhq/berth/abi/routes"
)

// Problem is an application/problem+json error answer. Code is stable
// (abi/errors); Detail is for humans.
type Problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
	// Reasons are an admission policy's reasons, with code "policy_denied".
	Reasons []string `json:"reasons,omitempty"`
}

// JoinTokenRequest creates a one-time join token. TTLSeconds zero means one hour.
type JoinTokenRequest struct {
	TTLSeconds int `json:"ttl_seconds,omitempty"`
	// Cluster names the cluster the node joins; empty is the default cluster.
	Cluster string `json:"cluster,omitempty"`
}

// JoinToken is shown once. JoinCommand is the berth-agent command line that
// enrolls a node; it carries the server URL, the token and Fingerprint, the pin
// of the server's TLS certificate ("sha256:<64 hex>", docs/node-protocol.md section 2.2).
type JoinToken struct {
	Cluster     string    `json:"cluster,omitempty"`
	Token       string    `json:"token"`
	JoinCommand string    `json:"join_command"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// JoinCodeRequest creates a join code (docs/joining.md section 1). TTLSeconds
// zero means 30 minutes, at most 24 hours; Labels are given to the node it
// enrolls.
type JoinCodeRequest struct {
	TTLSeconds int               `json:"ttl_seconds,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// JoinCode is shown once: the code, the id the node it enrolls will have, the
// one-line command that sets a host up with it (curl ... | sh) and the setup
// script's URL.
type JoinCode struct {
	Code        string    `json:"code"`
	NodeID      string    `json:"node_id"`
	JoinCommand string    `json:"join_command"`
	SetupURL    string    `json:"setup_url"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// EnrollRequest is sent by a node with its join token (docs/node-protocol.md section 2.3).
// PublicKey is the node's Ed25519 public key, base64 std encoding. Address is the
// host address the node's workloads are reachable on (default "127.0.0.1").
type EnrollRequest struct {
	JoinToken string `json:"join_token"`
	PublicKey string `json:"public_key"`
	// BoxPublicKey is the node's X25519 public key (base64, 32 bytes) that workload secrets are
	// sealed to (docs/node-protocol.md section 6.6); empty for an agent that receives none.
	BoxPublicKey string            `json:"box_public_key,omitempty"`
	Hostname     string            `json:"hostname"`
	Region       string            `json:"region,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Address      string            `json:"address,omitempty"`
	Capacity     Capacity          `json:"capacity"`
	// Allocatable is what the node can give to workloads (docs/node-protocol.md section 5.1);
	// nil from agents older than the field.
	Allocatable *Resources `json:"allocatable,omitempty"`
}

// Resources is an amount of resources: CPU in thousandths of a CPU (cpu_m), memory and disk in
// MiB, and extended resources (gpu, ...) by name in the units the nodes declare them in. A zero
// field is not stated. A node's capacity uses every field; what one replica of a service
// reserves (ServiceSpec.Resources) states no disk (volumes are sized apart).
type Resources struct {
	CPUMilli  int64            `json:"cpu_m,omitempty"`
	MemoryMiB int64            `json:"memory_mib,omitempty"`
	DiskMiB   int64            `json:"disk_mib,omitempty"`
	Extended  map[string]int64 `json:"extended,omitempty"`
}

// NodeDrain is a node's drain as the API shows it (docs/operating.md, "Cordon and drain").
type NodeDrain struct {
	StartedAt time.Time  `json:"started_at"`
	Deadline  *time.Time `json:"deadline,omitempty"`
	// State is "draining" while replicas or leases remain on the node, "drained" once none does;
	// Late reports whether the deadline passed with some remaining.
	State string `json:"state"`
	Late  bool   `json:"late,omitempty"`
	// Remaining lists what still has to leave the node.
	Remaining []DrainItem `json:"remaining"`
}

// DrainItem is one replica or lease still on a draining node.
type DrainItem struct {
	// Kind is "replica" (a scheduled replica the rollout moves) or "lease" (a stateful
	// service's lease handed over in order).
	Kind       string `json:"kind"`
	Service    string `json:"service"` // "project/name"
	Replica    string `json:"replica,omitempty"`
	WorkloadID string `json:"workload_id,omitempty"`
	LeaseID    string `json:"lease_id,omitempty"`
}

// NodeCapacityRequest is the body of PUT /api/v1/nodes/{id}/capacity: the operator's capacity
// override. Each stated (non-zero) field replaces what the node reports; an extended resource
// listed replaces the reported one, 0 included. Clear, or a request stating nothing, removes
// the override.
type NodeCapacityRequest struct {
	Resources
	Clear bool `json:"clear,omitempty"`
}

// NodeDrainRequest is the body of POST /api/v1/nodes/{id}/drain. DeadlineS is how long the drain
// should take, in seconds; 0 sets no deadline.
type NodeDrainRequest struct {
	DeadlineS int64 `json:"deadline_s,omitempty"`
}

// Capacity of a node.
type Capacity struct {
	CPUs     int   `json:"cpus"`
	MemoryMB int64 `json:"memory_mb"`
}

// EnrollResponse carries the node credential, shown once, and the cluster's
// Ed25519 public key (base64 std) that signs desired state.
type EnrollResponse struct {
	NodeID           string `json:"node_id"`
	Credential       string `json:"credential"`
	ClusterPublicKey string `json:"cluster_public_key"`
	ClusterID        string `json:"cluster_id"`
}

// Node statuses.
const (
	NodePending      = "pending"
	NodeConnected    = "connected"
	NodeDisconnected = "disconnected"
	NodeDraining     = "draining"
	NodeRemoved      = "removed"
)

// Node is an enrolled machine.
type Node struct {
	ID         string            `json:"id"`
	Hostname   string            `json:"hostname"`
	Region     string            `json:"region,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Address    string            `json:"address"`
	Capacity   Capacity          `json:"capacity"`
	Status     string            `json:"status"`
	DesiredRev int64             `json:"desired_rev"`
	AppliedRev int64             `json:"applied_rev"`
	Workloads  int               `json:"workloads"`
	EnrolledAt time.Time         `json:"enrolled_at"`
	LastSeenAt *time.Time        `json:"last_seen_at,omitempty"`
	// AgentVersion is the berth-agent version of the node's newest hello
	// ("" before its first session).
	AgentVersion string `json:"agent_version,omitempty"`
	// Retirement is "<disposition>/<state>" ("withdrawn/retiring", "lost/retired") once the node
	// was retired (docs/reconciliation.md section 10), "" otherwise.
	Retirement string `json:"retirement,omitempty"`
	// Session is the node's session status (connected, disconnected, pending, removed); Status
	// shows draining instead while the node drains.
	Session string `json:"session,omitempty"`
	// Allocatable is what the node's agent reported it can give to workloads; CapacityOverride
	// is the operator's override (nil: none); Schedulable is the two merged, what placement
	// reads.
	Allocatable      Resources  `json:"allocatable"`
	CapacityOverride *Resources `json:"capacity_override,omitempty"`
	Schedulable      Resources  `json:"schedulable"`
	// ResourceLimits says how the node enforces workload memory and CPU limits ("cgroup2",
	// "cgroup1", "container", "none: <why>"); "" when its agent did not say.
	ResourceLimits string `json:"resource_limits,omitempty"`
	// Cordoned reports whether new placements on the node are stopped.
	Cordoned bool `json:"cordoned,omitempty"`
	// Drain is the node's drain and its progress; nil when it is not draining.
	Drain *NodeDrain `json:"drain,omitempty"`
}

// Project is the tenancy unit.
type Project struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// HealthCheck is an HTTP GET probe of a service's workloads; zero fields take
// defaults (path "/", interval 10 s, timeout 2 s, 3 failures).
type HealthCheck struct {
	Path      string `json:"path,omitempty"`
	IntervalS int    `json:"interval_s,omitempty"`
	TimeoutS  int    `json:"timeout_s,omitempty"`
	Failures  int    `json:"failures,omitempty"`
}

// BackupSpec is a service's `backup:` block: Cron a standard five-field cron expression in
// UTC ("0 3 * * *"; empty: no scheduled backups), Keep how many settled backups of each
// binding stay (0: 24; 0 to 1,000), Drill "daily", "weekly" or empty: how often the latest
// backup is proven by a restore drill (docs/backups.md sections 4.3 and 5).
type BackupSpec struct {
	Cron  string `json:"cron,omitempty"`
	Keep  int    `json:"keep,omitempty"`
	Drill string `json:"drill,omitempty"`
}

// TLS is a service's TLS at the gateway (docs/certificates.md section 1):
// Mode "none" (also when empty), "acme" (a certificate from the configured
// ACME CA for each domain), "manual" (the PEM certificate chain and private
// key held in the project secret named Secret) or "passthrough" (TLS goes
// to the workloads unterminated).
type TLS struct {
	Mode   string `json:"mode,omitempty"`
	Secret string `json:"secret,omitempty"`
}

// Timeouts are a service's gateway timeouts in milliseconds
// (docs/plugins.md section 5.4); it is the route table's own type.
type Timeouts = routes.Timeouts

// ServiceSpec is the body of PUT /api/v1/projects/{project}/services/{name}.
// Bundle is a digest ("sha256:<hex>") or the name of a bundle pushed with a name,
// resolved to its digest at apply time. ExpectedRevision, when set, makes the
// write a compare-and-set: 0 means "must not exist yet".
type ServiceSpec struct {
	Bundle  string            `json:"bundle"`
	Command []string          `json:"command"`
	Env     map[string]string `json:"env,omitempty"`
	// Secrets maps environment variables (or, with as: file, file names) to secrets of the
	// project; SecretSets attaches sets of them (docs/api.md section 10). Changing either is a
	// change of what the service runs: a rollout, like an env change.
	Secrets     map[string]SecretRef `json:"secrets,omitempty"`
	SecretSets  []string             `json:"secret_sets,omitempty"`
	Port        int                  `json:"port,omitempty"`
	Domains     []string             `json:"domains,omitempty"`
	Replicas    *int                 `json:"replicas,omitempty"`
	HealthCheck HealthCheck          `json:"health_check,omitempty"`
	// Timeouts bound the gateway's exchanges with the service's workloads
	// (connect_ms, response_header_ms, idle_ms; zero fields take the
	// defaults 5,000, 60,000 and 90,000; each at most 3,600,000). A change
	// reroutes without restarting workloads (docs/plugins.md section 5.4).
	Timeouts Timeouts `json:"timeouts,omitzero"`
	// TLS says how the gateway serves the service's domains over TLS; a
	// change reroutes without restarting workloads. Refused at apply (422):
	// an unknown mode or manual without a secret (tls_mode_invalid), a
	// manual secret that is not a matching certificate and key for every
	// domain (tls_certificate_invalid), an acme domain no challenge can
	// prove (tls_domain_unverifiable).
	TLS TLS `json:"tls,omitzero"`
	// Stream makes the gateway send every write of the service's responses on at once, not in
	// full buffers (docs/plugins.md section 5.2); a change reroutes without restarting workloads.
	Stream bool `json:"stream,omitempty"`
	// Labels are free key/value pairs that admission policies may require.
	Labels map[string]string `json:"labels,omitempty"`
	// CapacityUnits is what one replica uses, in the operator's own units;
	// admission policies may cap a project's total. Kept as an alias for sizing:
	// with no Resources, one unit reserves 100 millicores and 128 MiB per replica
	// (docs/placement.md).
	CapacityUnits int `json:"capacity_units,omitempty"`
	// Resources is what one replica reserves on its node (docs/placement.md):
	// cpu_m (millicores; default the container's cpu_millis, else 100 per
	// capacity unit), memory_mib (default memory_mb, else 128 per unit) and
	// extended resources the nodes declare (no default).
	Resources *Resources `json:"resources,omitempty"`
	// Scheduling is where the replicas may run and how they spread (docs/placement.md).
	Scheduling
	// PlacementMode is "portable" (the default) or "stateful": a stateful service has at most
	// one replica, runs on one node at a time under a lease with a fencing token, and cannot
	// change its mode later (docs/api.md "Leases").
	PlacementMode string `json:"placement_mode,omitempty"`
	// Lease configures the lease of a stateful service; nil means a local lease.
	Lease *LeaseSpec `json:"lease,omitempty"`
	// ProgressDeadlineS is how long, in seconds (1 to 86400), a rollout may go without a slot
	// becoming ready on the new release before it is failed with refused(progress-deadline); 0
	// means 600. AutoRollback restores the previous release, slot by slot, when a rollout fails
	// so (docs/reconciliation.md section 7.2).
	ProgressDeadlineS int  `json:"progress_deadline_s,omitempty"`
	AutoRollback      bool `json:"auto_rollback,omitempty"`
	// Rollout bounds how many replicas a rollout moves at once; nil takes the defaults
	// (max_surge 1, max_unavailable 0).
	Rollout *RolloutSpec `json:"rollout,omitempty"`
	// Volumes are persistent directories owned by the service, kept across rollouts and agent
	// restarts on the node that runs it, removed only by a delete with purge_volumes. Name is
	// 1 to 63 of [a-z0-9-]; Path (absolute) is where a container sees it, a process workload gets
	// its directory in BERTH_VOLUME_<NAME>. At most 16.
	Volumes []Volume `json:"volumes,omitempty"`
	// Bindings are databases and buckets the service uses, made by the Corestore provider
	// (docs/bindings.md): Name a DNS label unique in the service, Kind postgres, mongodb or s3.
	// Their credentials reach the workloads as BERTH_BINDING_<NAME>_* secrets once ready.
	Bindings []BindingSpec `json:"bindings,omitempty"`
	// Backup schedules, keeps and drills the bindings' backups (docs/backups.md section 4.3);
	// nil: backups on demand only. A bad cron, keep or drill is 422 backup_schedule_invalid.
	Backup *BackupSpec `json:"backup,omitempty"`
	// DNS is "managed" for Berth to write the domains' A and AAAA records, pointing at the edge
	// addresses, and withdraw them when the domains or the service go; empty (or "none") leaves
	// DNS to the operator (docs/dns.md section 7).
	DNS string `json:"dns,omitempty"`

	// Kind is "service" (also when empty: kept running) or "job" (runs to completion, once per
	// fire time of Job.Schedule or when asked: docs/jobs.md section 7).
	Kind string `json:"kind,omitempty"`
	// Job is a job's schedule and run policy; only with kind job, where nil means a job run
	// only when asked (berth job run).
	Job *JobSpec `json:"job,omitempty"`

	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
	// Container is the container part of the spec (docs/api.md; docs/plugins.md section 3).
	Container
}

// JobSpec is what a job adds to its spec (docs/jobs.md section 7). Zero fields take the
// defaults named.
type JobSpec struct {
	// Schedule is a cron expression, a descriptor or "@every <duration>" (docs/jobs.md section
	// 1); empty: the job runs only when asked.
	Schedule string `json:"schedule,omitempty"`
	// TimeZone is the IANA zone the schedule is read in; empty means UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Concurrency says what a fire time does while a run of the job is live: "forbid" (the
	// default: it is recorded missed), "replace" (the live run is stopped first) or "allow".
	Concurrency string `json:"concurrency,omitempty"`
	// TimeoutS bounds each attempt of a run, in seconds; 0 means none.
	TimeoutS int `json:"timeout_s,omitempty"`
	// Retries is how many times a failed attempt starts again, after the slot backoff (0 to 10).
	Retries int `json:"retries,omitempty"`
	// StartingDeadlineS is how late a fire time may still start (default 300).
	StartingDeadlineS int `json:"starting_deadline_s,omitempty"`
	// KeepHistory is how many ended runs are kept (default 20, at most 1000).
	KeepHistory int `json:"keep_history,omitempty"`
}

// Container is what a service on the containerd runtime adds to its spec.
// Runtime is "process" (also when empty) or "containerd". Image is pinned by
// digest: "host/repo@sha256:<hex>", or "sha256:<hex>" naming an image of the
// OCI image layout in Bundle (pushed with 'berth image push'); with an image,
// Command may be empty (the image's entrypoint). MemoryMB (mebibytes) and
// CPUMillis (thousandths of a CPU) limit each replica; zero means no limit.
type Container struct {
	Runtime   string `json:"runtime,omitempty"`
	Image     string `json:"image,omitempty"`
	User      string `json:"user,omitempty"`
	MemoryMB  int64  `json:"memory_mb,omitempty"`
	CPUMillis int64  `json:"cpu_millis,omitempty"`
	// DeployOnPush makes the service follow a tag of a Berth repository: Image then names it
	// ("<project>/<repo>:<tag>", optionally after the registry host), the apply pins the digest
	// the tag names, and every later push that moves the tag rolls the service to the new digest
	// (docs/registry.md section 8). False: pushes are only recorded.
	DeployOnPush bool `json:"deploy_on_push,omitempty"`
	// ImageTag is, in answers, the "<project>/<repo>:<tag>" a DeployOnPush service follows
	// while Image holds the digest it resolved to; ignored in a spec.
	ImageTag string `json:"image_tag,omitempty"`
}

// BindingSpec is one entry of ServiceSpec.Bindings.
type BindingSpec struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
}

// ServiceBinding is a service binding as GET /projects/{p}/bindings answers it (docs/bindings.md):
// State pending, ready, failed, released or purged; Endpoint credential-free; LastError the
// reason of the last failure; Secrets the environment variables it provides, by secret name.
type ServiceBinding struct {
	Service     string            `json:"service"`
	Name        string            `json:"name"`
	Kind        string            `json:"kind"`
	Generation  int64             `json:"generation"`
	State       string            `json:"state"`
	Endpoint    string            `json:"endpoint,omitempty"`
	Database    string            `json:"database,omitempty"`
	User        string            `json:"user,omitempty"`
	Users       string            `json:"users,omitempty"`
	LastError   string            `json:"last_error,omitempty"`
	OperationID string            `json:"operation_id,omitempty"`
	Secrets     map[string]string `json:"secrets,omitempty"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

// Volume is one persistent directory of a service (ServiceSpec.Volumes).
type Volume struct {
	Name string `json:"name"`
	Path string `json:"path,omitempty"`
}

// LeaseSpec is a stateful service's lease: Mode "local" (moves only when its node is declared
// lost, acknowledged or revoked) or "expiring" (moves DurationMS + 2 margins after its holder went
// silent; DurationMS at least 3000, default 15000).
type LeaseSpec struct {
	Mode       string `json:"mode,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
}

// Service is a stored service. BundleDigest is the pinned digest; Bundle is what
// the operator wrote.
type Service struct {
	ID           string            `json:"id"`
	Project      string            `json:"project"`
	Name         string            `json:"name"`
	Revision     int64             `json:"revision"`
	Bundle       string            `json:"bundle"`
	BundleDigest string            `json:"bundle_digest"`
	Command      []string          `json:"command"`
	Env          map[string]string `json:"env,omitempty"`
	// ResolvedSecrets is every secret the workloads receive (Secrets and the sets' entries) with
	// the version it resolved to when the service last changed; read-only.
	ResolvedSecrets map[string]SecretRef `json:"resolved_secrets,omitempty"`
	// Secrets and SecretSets are as in ServiceSpec: names and versions, never values.
	Secrets     map[string]SecretRef `json:"secrets,omitempty"`
	SecretSets  []string             `json:"secret_sets,omitempty"`
	Port        int                  `json:"port"`
	Domains     []string             `json:"domains"`
	Replicas    int                  `json:"replicas"`
	HealthCheck HealthCheck          `json:"health_check"`
	// Timeouts and Stream are as in ServiceSpec.
	Timeouts Timeouts `json:"timeouts,omitzero"`
	// TLS is as in ServiceSpec.
	TLS TLS `json:"tls,omitzero"`
	// Certificates is the certificate status of each domain when TLS.Mode is
	// acme or manual (GET of one service only).
	Certificates []CertificateStatus `json:"certificates,omitempty"`
	Stream       bool                `json:"stream,omitempty"`
	// Kind and Job are as in ServiceSpec, Job with its defaults filled in; for a job, Suspended
	// says whether its schedule is held and NextFire is its next fire time (absent when it has
	// no schedule or is suspended). docs/jobs.md section 7.
	Kind      string     `json:"kind,omitempty"`
	Job       *JobSpec   `json:"job,omitempty"`
	Suspended bool       `json:"suspended,omitempty"`
	NextFire  *time.Time `json:"next_fire,omitempty"`
	// Labels and CapacityUnits are as in ServiceSpec.
	Labels        map[string]string `json:"labels,omitempty"`
	CapacityUnits int               `json:"capacity_units,omitempty"`
	// Resources is what one replica reserves, its defaults filled in; Scheduling is as in
	// ServiceSpec.
	Resources Resources `json:"resources"`
	Scheduling
	// PlacementMode and Lease are as in ServiceSpec (Lease is set for stateful services).
	PlacementMode string     `json:"placement_mode,omitempty"`
	Lease         *LeaseSpec `json:"lease,omitempty"`
	// ProgressDeadlineS and AutoRollback are as in ServiceSpec; RollbackOf is set on a revision
	// an automatic rollback wrote: the revision whose failed rollout it undid.
	ProgressDeadlineS int   `json:"progress_deadline_s,omitempty"`
	AutoRollback      bool  `json:"auto_rollback,omitempty"`
	RollbackOf        int64 `json:"rollback_of,omitempty"`
	// Rollout is as in ServiceSpec; RolloutPaused reports whether `berth rollout pause` holds
	// the rollout; RestartGeneration counts `berth rollout restart`s.
	Rollout           *RolloutSpec  `json:"rollout,omitempty"`
	RolloutPaused     bool          `json:"rollout_paused,omitempty"`
	RestartGeneration int64         `json:"restart_generation,omitempty"`
	Bindings          []BindingSpec `json:"bindings,omitempty"`
	Backup            *BackupSpec   `json:"backup,omitempty"`
	Volumes           []Volume      `json:"volumes,omitempty"`
	CreatedAt         time.Time     `json:"created_at"`
	UpdatedAt         time.Time     `json:"updated_at"`
	// Ready counts workloads that are running and healthy; filled on reads.
	Ready int `json:"ready"`
	// Verdict is the service's production verdict (docs/reconciliation.md section 7); nil
	// before the first sweep decided one.
	Verdict *Verdict `json:"verdict,omitempty"`
	// Deleting reports whether the service is being deleted: its slots are settling and it
	// disappears once they have (docs/reconciliation.md section 9).
	Deleting bool `json:"deleting,omitempty"`
	// PurgeVolumes reports whether the deletion removes the service's volumes from the nodes that
	// hold its workloads ([WithPurgeVolumes]); false keeps them.
	PurgeVolumes bool `json:"purge_volumes,omitempty"`
	// Changed is set only in the answer of an apply ([Client.ApplyService]): true when the apply
	// created or updated the service, false when the stored service already declared exactly
	// this and nothing was written (the revision is the current one). Nil elsewhere.
	Changed *bool `json:"changed,omitempty"`
	// PolicyWarnings is set only by [Client.ApplyService]: each Berth-Policy-Warning header of
	// the answer, in order (a policy that failed under failure_policy ignore, or one that warned;
	// docs/wasm-abi.md section 5.3). The server's JSON never carries it; it is here so that a caller
	// printing the answer keeps the warnings beside the service they concern.
	PolicyWarnings []string `json:"policy_warnings,omitempty"`
	// DNS is as in ServiceSpec ("managed" or empty).
	DNS string `json:"dns,omitempty"`
	// Container is as in ServiceSpec.
	Container
}

// Workload is one slot of a service placed on a node.
type Workload struct {
	ID             string     `json:"id"`
	Project        string     `json:"project"`
	Service        string     `json:"service"`
	Slot           int        `json:"slot"`
	NodeID         string     `json:"node_id"`
	DesiredStatus  string     `json:"desired_status"`
	ObservedStatus string     `json:"observed_status"`
	Health         string     `json:"health"`
	Address        string     `json:"address,omitempty"`
	RestartCount   int        `json:"restart_count"`
	Message        string     `json:"message,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	ObservedAt     *time.Time `json:"observed_at,omitempty"`
	// LastFailure is the newest failure of the workload's slot, this attempt's or an earlier
	// one's; nil when none failed.
	LastFailure *Failure `json:"last_failure,omitempty"`
}

// Bundle is a stored release bundle: a tar.gz content-addressed by SHA-256.
type Bundle struct {
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	Name      string    `json:"name,omitempty"`
	Project   string    `json:"project"`
	CreatedAt time.Time `json:"created_at"`
}

// List is the shape of every list answer.
type List[T any] struct {
	Items []T `json:"items"`
}

// Scheduling restricts and ranks the nodes a service's replicas may use (docs/placement.md).
// NodeSelector labels must be on a node with these exact values; Region, when set, must be its
// region; SpreadBy is "node" (default), "region" or "label:<key>"; MaxPerNode (positive) bounds
// the replicas on one node; AntiAffinity names services of the project a node must not run;
// Preferences are labels that rank a node higher without excluding others.
type Scheduling struct {
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	Region       string            `json:"region,omitempty"`
	SpreadBy     string            `json:"spread_by,omitempty"`
	MaxPerNode   int               `json:"max_per_node,omitempty"`
	AntiAffinity []string          `json:"anti_affinity,omitempty"`
	Preferences  map[string]string `json:"preferences,omitempty"`
}

// PlacementExplanation is GET /projects/{p}/services/{s}/placement (docs/placement.md section 6):
// for each replica, the node it stands on or would go to, and the decider's word about every
// node. Note says why there is nothing to explain (pinned or every-node placement) or what rules
// a stateful service's replica follows.
type PlacementExplanation struct {
	Service  string             `json:"service"`
	Note     string             `json:"note,omitempty"`
	Replicas []ReplicaPlacement `json:"replicas"`
}

// ReplicaPlacement is one replica of a PlacementExplanation: NodeID is where it stands
// (Standing) or where the next sweep puts it, empty when it fits nowhere (Reason says why).
// Considered lists every node: the one taken first, then feasible nodes by rank (code
// outranked), then refused nodes with their code (unavailable, cordoned, region,
// node_selector, endpoint, anti_affinity, max_per_node, capacity) and text.
type ReplicaPlacement struct {
	Replica    string        `json:"replica"`
	NodeID     string        `json:"node_id,omitempty"`
	Standing   bool          `json:"standing,omitempty"`
	Reason     string        `json:"reason,omitempty"`
	Considered []NodeVerdict `json:"considered,omitempty"`
}

// NodeVerdict is the placement decider's word about one node for one replica.
type NodeVerdict struct {
	NodeID string `json:"node_id"`
	Code   string `json:"code"`
	Text   string `json:"text"`
}
