// Package services owns projects, services (the desired state an operator
// declares) and workloads (the slots the scheduler placed on nodes).
package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// Errors of [Catalog] methods.
var (
	ErrProjectNotFound = errors.New("berth: project not found")
	ErrServiceNotFound = errors.New("berth: service not found")
	// ErrRevisionConflict is returned when expected_revision is stale, or when a
	// concurrent writer won the compare-and-set.
	ErrRevisionConflict = errors.New("berth: revision conflict")
	// ErrDomainTaken is returned by PutService for a domain another service routes, or whose
	// route claim another service holds (docs/routes.md section 2).
	ErrDomainTaken = errors.New("berth: domain already routed to another service")
	// ErrPlacementModeImmutable is returned by PutService when an update asks for another
	// placement_mode than the service was created with.
	ErrPlacementModeImmutable = errors.New("berth: a service's placement_mode cannot change")
	// ErrServiceDeleting is returned by writes to a service marked deleting
	// (docs/reconciliation.md section 9).
	ErrServiceDeleting = errors.New("berth: service is being deleted")
	// ErrNoPreviousRelease is returned by [Undone] for a service whose release and
	// configuration never changed.
	ErrNoPreviousRelease = errors.New("berth: service has no previous release")
)

// Placement modes of a service (DESIGN.md section 3).
const (
	// PlacementPortable services may run anywhere and move freely; the default.
	PlacementPortable = "portable"
	// PlacementStateful services run on one node at a time, under a lease with a fencing token
	// (docs/node-protocol.md section 8); they have at most one replica.
	PlacementStateful = "stateful"
)

// Environment limits of a service (docs/api.md section 4, "Limits"). The node runtime passes
// each variable to execve as one "KEY=VALUE" string with a terminating NUL; Linux refuses a
// string longer than MAX_ARG_STRLEN (131072 bytes) and the whole argument and environment
// block over ARG_MAX with "argument list too long", after which the workload never starts.
// The API refuses such a spec at apply instead.
const (
	// MaxEnvEntryBytes bounds one variable: len(KEY) + 1 + len(VALUE) + 1 (the '=' and the
	// NUL), which is Linux's MAX_ARG_STRLEN.
	MaxEnvEntryBytes = 128 << 10
	// MaxEnvBytes bounds the sum of every variable's len(KEY) + 1 + len(VALUE) + 1. It is well
	// under the smallest ARG_MAX Linux allows (a quarter of an 8 MiB stack, 2 MiB) so that the
	// command's arguments and the variables the node agent adds (PORT, HOST, BERTH_*) fit too.
	MaxEnvBytes = 256 << 10
	// MaxArgBytes bounds one command argument with its NUL: Linux's MAX_ARG_STRLEN again.
	MaxArgBytes = 128 << 10
	// MaxArgsBytes bounds the sum of every command argument's length plus its NUL; with
	// MaxEnvBytes it keeps argv and the environment together under the smallest ARG_MAX.
	MaxArgsBytes = 256 << 10
)

// EnvEntryBytes is what one variable occupies in a process's environment block: KEY=VALUE and
// its NUL, in bytes.
func EnvEntryBytes(key, value string) int { return len(key) + 1 + len(value) + 1 }

// DNSManaged is the value of Service.DNS for a service whose domains' records Berth writes.
const DNSManaged = "managed"

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName reports whether s is a DNS label: 1 to 63 of [a-z0-9-], not starting
// or ending with '-'. Project and service names must be.
func ValidName(s string) bool { return labelRE.MatchString(s) }

// Project is a document in collection "projects".
type Project struct {
	ID        string    `bson:"_id"`
	Name      string    `bson:"name"`
	CreatedAt time.Time `bson:"created_at"`
	// LogOutbox holds the project's change not yet in the change log,
	// written with the project (docs/node-protocol.md section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
}

// TLS is a service's tls block: Mode none (also ""), acme, manual or
// passthrough, and for manual the project secret holding the PEM
// certificate chain and private key.
type TLS struct {
	Mode   string `bson:"mode,omitempty"`
	Secret string `bson:"secret,omitempty"`
}

// HealthCheck is a service's HTTP probe.
type HealthCheck struct {
	Path      string `bson:"path" json:"path"`
	IntervalS int    `bson:"interval_s" json:"interval_s"`
	TimeoutS  int    `bson:"timeout_s" json:"timeout_s"`
	Failures  int    `bson:"failures" json:"failures"`
}

// Service is a document in collection "services". Revision increases by one on
// every write; it is the compare-and-set guard.
type Service struct {
	ID           string            `bson:"_id"`
	ProjectID    string            `bson:"project_id"`
	Project      string            `bson:"project"`
	Name         string            `bson:"name"`
	Revision     int64             `bson:"revision"`
	Bundle       string            `bson:"bundle"`
	BundleDigest string            `bson:"bundle_digest"`
	Command      []string          `bson:"command"`
	Env          map[string]string `bson:"env,omitempty"`
	// Secrets maps environment variables (or secret file names) to the project's secrets, and
	// SecretSets attaches secret sets; names and versions only, never values (docs/api.md
	// section 10). They are part of what the workloads run.
	Secrets    map[string]secrets.Ref `bson:"secrets,omitempty"`
	SecretSets []string               `bson:"secret_sets,omitempty"`
	// ResolvedSecrets is every secret the workloads receive (Secrets and the sets' entries), each
	// with the version it resolved to when the service last changed: what a rollout delivers. A
	// new version of a secret a reference leaves unpinned is rolled out by updating it.
	ResolvedSecrets map[string]secrets.Ref `bson:"resolved_secrets,omitempty"`
	Port            int                    `bson:"port"`
	Domains         []string               `bson:"domains"`
	Replicas        int                    `bson:"replicas"`
	HealthCheck     HealthCheck            `bson:"health_check"`
	// Timeouts are the gateway's timeouts towards the service's workloads,
	// copied onto its routes (docs/plugins.md section 5.4); zero fields take
	// the gateway's defaults. Not part of the invocation: a change reroutes
	// without a rollout.
	Timeouts routes.Timeouts `bson:"timeouts,omitempty"`
	// TLS is how the gateway serves the service's domains over TLS
	// (docs/certificates.md section 1); like Timeouts, a change reroutes
	// without a rollout.
	TLS TLS `bson:"tls,omitempty"`
	// Stream asks the gateway to send every write of the service's responses on at once
	// (server-sent events, long polls), as a route compiler may ask per route (docs/plugins.md
	// section 5.2); copied onto its routes like Timeouts, without a rollout.
	Stream bool `bson:"stream,omitempty"`
	// Labels and CapacityUnits (per replica) are read by admission policies. CapacityUnits is
	// also the older way to size a replica: with no Resources, one unit reserves
	// [UnitCPUMilli] and [UnitMemoryMiB] ([Service.ReplicaResources]).
	Labels        map[string]string `bson:"labels,omitempty"`
	CapacityUnits int               `bson:"capacity_units,omitempty"`
	// Resources is what one replica reserves on its node (docs/placement.md); zero fields take
	// their defaults in [Service.ReplicaResources].
	Resources Resources `bson:"resources,omitempty"`
	// Scheduling restricts and ranks the nodes the replicas may use (docs/placement.md).
	Scheduling Scheduling `bson:"scheduling,omitempty"`
	// PlacementMode is PlacementPortable (also when empty) or PlacementStateful; it cannot
	// change after creation.
	PlacementMode string `bson:"placement_mode,omitempty"`
	// LeaseMode is the lease mode of a stateful service: "local" (also when empty) or
	// "expiring"; LeaseDurationMS is D for expiring leases (at least 3000).
	LeaseMode       string    `bson:"lease_mode,omitempty"`
	LeaseDurationMS int64     `bson:"lease_duration_ms,omitempty"`
	CreatedAt       time.Time `bson:"created_at"`
	UpdatedAt       time.Time `bson:"updated_at"`
	// Deleting marks a service whose deletion began: it accepts no writes, its routes are
	// withdrawn, it desires nothing, and the deletion finalizer removes it once its slots
	// settled (docs/reconciliation.md section 9).
	Deleting bool `bson:"deleting,omitempty"`
	// PurgeVolumes reports whether the deletion also removes the service's volumes: written with
	// Deleting (`berth delete service --purge-volumes`), carried in the desired state of every
	// node that holds a workload of the service while it settles (docs/node-protocol.md section
	// 6.7). False keeps them.
	PurgeVolumes bool `bson:"purge_volumes,omitempty"`
	// Previous is what the service ran before the latest change of what it runs (release,
	// command, environment, port, limits, health check), for `rollout undo`; nil when that
	// never changed.
	Previous *Invocation `bson:"previous,omitempty"`
	// Volumes are the service's persistent directories on the node that runs it, kept across
	// rollouts and agent restarts (docs/node-protocol.md section 6.6).
	Volumes []Volume `bson:"volumes,omitempty"`
	// Bindings are the platform resources the service uses (docs/bindings.md); their
	// credentials reach it as secrets named in Secrets once each binding is ready.
	Bindings []bindings.Spec `bson:"bindings,omitempty"`
	// Backup is the service's backup block (docs/backups.md section 4.3): schedule, retention
	// and drill frequency of its bindings' backups; nil: backups on demand only, keeping 24.
	Backup *BackupSchedule `bson:"backup,omitempty"`
	// Kind is KindJob for a job (docs/jobs.md section 7), empty for a service: a job has no
	// replicas, and its runs are placed one by one by core/jobs.
	Kind string `bson:"kind,omitempty"`
	// Job is a job's schedule and run policy; nil for a service.
	Job *JobSettings `bson:"job,omitempty"`
	// ProgressDeadlineS is how long, in seconds, a rollout may go without progress before it
	// is failed (0: the default, 600); AutoRollback says whether a failed rollout restores
	// Previous (docs/reconciliation.md section 7.2).
	ProgressDeadlineS int  `bson:"progress_deadline_s,omitempty"`
	AutoRollback      bool `bson:"auto_rollback,omitempty"`
	// RollbackOf is the revision whose failed rollout an automatic rollback undid, set on the
	// revision that rollback wrote (0 otherwise); a rollback is never itself rolled back.
	RollbackOf int64 `bson:"rollback_of,omitempty"`
	// Rollout bounds how many replicas a rollout moves at once (docs/reconciliation.md section
	// 5.2); nil takes the defaults (surge 1, unavailable 0; a stateful service always replaces
	// stop-before-start).
	Rollout *slots.RolloutSpec `bson:"rollout,omitempty"`
	// RolloutPaused reports whether an operator paused the service's rollout (`berth rollout
	// pause`); RestartGeneration counts `berth rollout restart`s, each a new desired attempt
	// for every replica. Neither is declared by an apply, which keeps them.
	RolloutPaused     bool  `bson:"rollout_paused,omitempty"`
	RestartGeneration int64 `bson:"restart_generation,omitempty"`
	// Rebalance is the latest `berth rebalance` of the service (docs/placement.md section 7):
	// the replica moves the rollout carries out while each stays feasible. Not declared by an
	// apply, which keeps it; nil: never rebalanced.
	Rebalance *Rebalance `bson:"rebalance,omitempty"`

	// Runtime is the node runtime driver: "process" (also when empty) or
	// "containerd"; Image, User, MemoryMB and CPUMillis are the container
	// fields of docs/plugins.md section 3 (zero: the image's user, no limit).
	Runtime   string `bson:"runtime,omitempty"`
	Image     string `bson:"image,omitempty"`
	User      string `bson:"user,omitempty"`
	MemoryMB  int64  `bson:"memory_mb,omitempty"`
	CPUMillis int64  `bson:"cpu_millis,omitempty"`
	// DeployOnPush says whether a push that moves ImageTag ("<project>/<repo>:<tag>") rolls the
	// service to the new digest; Image always holds a digest, the one the tag named when the
	// service was applied or last followed it (docs/registry.md section 8).
	DeployOnPush bool   `bson:"deploy_on_push,omitempty"`
	ImageTag     string `bson:"image_tag,omitempty"`

	// DNS is DNSManaged when Berth writes the domains' A and AAAA records, pointing at the edge
	// addresses (docs/dns.md section 7); empty leaves DNS to the operator. Not part of the
	// invocation: a change rewrites records without a rollout.
	DNS string `bson:"dns,omitempty"`

	// LogOutbox holds this service's changes not yet in the change log,
	// oldest first, written in the same compare-and-set as the change
	// (docs/node-protocol.md section 7.2); not part of the service.
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`

	// Reconcile is the service's pending reconcile request: every write of what the service
	// declares (create, update, delete mark, undo, rollback) sets it in the same compare-and-set,
	// and the reconciler clears it once a pass acted on that revision ([Catalog.ClearReconcile]);
	// nil when no change waits for the reconciler (docs/reconciliation.md section 6). Not part of
	// the service.
	Reconcile *ReconcileRequest `bson:"reconcile,omitempty" json:"-"`
}

// ReconcileRequest is the durable wake-up of the reconciler written with a change of a service:
// the write that sets it and the change are one compare-and-set, so no change is left without
// one, whatever happens to the process that wrote it.
type ReconcileRequest struct {
	// Revision is the service revision the request was written with; the reconciler clears the
	// request only while the service is still at it, so a newer request is never cleared by a
	// pass that did not see it.
	Revision int64 `bson:"revision" json:"revision"`
	// Cause names the write: one of the Cause constants.
	Cause string `bson:"cause" json:"cause"`
	// At is when the request was written (the core's clock, UTC).
	At time.Time `bson:"at" json:"at"`
}

// Causes of a [ReconcileRequest]: the kind of write that asked for it.
const (
	CauseCreated   = "service.created"       // ApplyService inserted the service (no cause named)
	CauseUpdated   = "service.updated"       // ApplyService replaced it (no cause named; core/deploy names its change's)
	CauseDeleting  = "service.deleting"      // MarkDeleting began its deletion
	CauseUndo      = "rollout.undo"          // an undo returned it to its previous release
	CauseRollback  = "rollout.auto_rollback" // the automatic rollback undid a failed rollout
	CauseRebalance = "rollout.rebalance"     // an operator's rebalance recorded replica moves
	CauseSpec      = "spec.written"          // an operator wrote the service's runtime spec (core/rollout)
	// A pause, resume or restart of the rollout ([Catalog.ControlRollout]) is "rollout." and the
	// action: "rollout.pause", "rollout.resume", "rollout.restart".
)

// causeOf is the cause of the reconcile request of a write of s: the one the caller named in
// s.Reconcile (core/deploy names its change's cause there), else def.
func causeOf(s *Service, def string) string {
	if s.Reconcile != nil && s.Reconcile.Cause != "" {
		return s.Reconcile.Cause
	}
	return def
}

// newRequest returns the reconcile request of a write of cause that leaves the service at rev.
func newRequest(cause string, rev int64, at time.Time) *ReconcileRequest {
	return &ReconcileRequest{Revision: rev, Cause: cause, At: at}
}

// logChange prepares the change-log item of a write of s (nil payload for
// a delete) when ctx carries the actor (changelog.WithActor); ok is false
// when it carries none. Errors: changelog.ErrEntryTooLarge, wrapped.
func logChange(ctx context.Context, id, op string, s *Service) (p changelog.Pending, ok bool, err error) {
	a, ok := changelog.ActorFrom(ctx)
	if !ok {
		return changelog.Pending{}, false, nil
	}
	ch := changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: "service", EntityID: id, Op: op}
	if s != nil {
		ch.Payload = s
	}
	if p, err = changelog.Prepare(ch); err != nil {
		return changelog.Pending{}, false, fmt.Errorf("service %s: %w", id, err)
	}
	return p, true, nil
}

// Release names what a service runs: a release bundle (Bundle as written, BundleDigest pinned)
// or a container image reference.
type Release struct {
	Bundle       string `bson:"bundle,omitempty"`
	BundleDigest string `bson:"bundle_digest,omitempty"`
	Image        string `bson:"image,omitempty"`
}

// Digest returns the release's content identity: the bundle digest, else the image reference.
func (r Release) Digest() string {
	if r.BundleDigest != "" {
		return r.BundleDigest
	}
	return r.Image
}

// Release returns the release s runs now.
func (s *Service) Release() Release {
	return Release{Bundle: s.Bundle, BundleDigest: s.BundleDigest, Image: s.Image}
}

// InvocationDigest returns "sha256:<hex>" over what s's workloads run besides the release and
// the environment (driver, command, port, user, health check, limits): the invocation part of a
// slot's desired attempt key (docs/reconciliation.md section 2).
func (s *Service) InvocationDigest() string {
	inv := InvocationOf(s)
	inv.BundleDigest, inv.Image, inv.Env = "", "", nil
	raw, _ := json.Marshal(inv)
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Stateful reports whether s runs under a lease (placement mode stateful).
func (s *Service) Stateful() bool { return s.PlacementMode == PlacementStateful }

// BackupSchedule is a service's `backup:` block: Cron a five-field cron expression in UTC
// (empty: no scheduled backups), Keep the settled backups kept per binding (0: 24; at most
// 1,000), Drill "daily", "weekly" or empty (docs/backups.md section 4.3).
type BackupSchedule struct {
	Cron  string `bson:"cron,omitempty"`
	Keep  int    `bson:"keep,omitempty"`
	Drill string `bson:"drill,omitempty"`
}

// SpecHash identifies what the service's workloads run: a workload whose hash
// differs is replaced. Replicas and domains are not part of it.
func (s *Service) SpecHash() string {
	raw, _ := json.Marshal(struct {
		D string
		C []string
		E map[string]string
		P int
		H HealthCheck
		// Container fields: absent when empty, so a process service keeps its hash.
		R string `json:",omitempty"`
		I string `json:",omitempty"`
		U string `json:",omitempty"`
		M int64  `json:",omitempty"`
		L int64  `json:",omitempty"`
		// Secret references: absent when none, so a service without secrets keeps its hash.
		S  map[string]secrets.Ref `json:",omitempty"`
		SS []string               `json:",omitempty"`
		SR map[string]secrets.Ref `json:",omitempty"`
	}{s.BundleDigest, s.Command, s.Env, s.Port, s.HealthCheck, s.Runtime, s.Image, s.User, s.MemoryMB, s.CPUMillis, s.Secrets, s.SecretSets, s.ResolvedSecrets})
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// Workload is a document in collection "workloads": one slot of a service
// placed on a node. Observed fields come from the node's status reports.
type Workload struct {
	ID             string     `bson:"_id"`
	ProjectID      string     `bson:"project_id"`
	Project        string     `bson:"project"`
	ServiceID      string     `bson:"service_id"`
	Service        string     `bson:"service"`
	Slot           int        `bson:"slot"`
	NodeID         string     `bson:"node_id"`
	SpecHash       string     `bson:"spec_hash"`
	DesiredStatus  string     `bson:"desired_status"`
	ObservedStatus string     `bson:"observed_status"`
	Health         string     `bson:"health"`
	Address        string     `bson:"address,omitempty"`
	RestartCount   int        `bson:"restart_count"`
	Message        string     `bson:"message,omitempty"`
	CreatedAt      time.Time  `bson:"created_at"`
	ObservedAt     *time.Time `bson:"observed_at,omitempty"`
	// Replica and AttemptID name the slot and attempt this workload runs (empty for workloads
	// of stateful services, which are placed under their lease instead).
	Replica   string `bson:"replica,omitempty"`
	AttemptID string `bson:"attempt_id,omitempty"`
	// StatusRev is a revision of the node's desired state that carries DesiredStatus (0 until
	// one was written); a node that applied it acknowledged the status
	// (docs/reconciliation.md section 3).
	StatusRev int64 `bson:"status_rev"`
	// Run is what the attempt runs, copied from the service when the attempt was admitted, so
	// a workload keeps running its own release while a rollout replaces the others one by one;
	// nil for workloads of stateful services, which run the service as it is.
	Run *Invocation `bson:"run,omitempty"`
	// MemoryBytes, CPUMillis and Probe come from the runtime spec the attempt was admitted
	// under; zero values leave the service's own settings in force.
	MemoryBytes int64        `bson:"memory_bytes,omitempty"`
	CPUMillis   int64        `bson:"cpu_millis,omitempty"`
	Probe       *HealthCheck `bson:"probe,omitempty"`
	// EverReady latches once the node reported the workload running and passing.
	EverReady bool `bson:"ever_ready,omitempty"`
	// FailedAt is the core's time when the node first reported the run crashed (or stopped on
	// its own) since it was last ready; nil while it is not failed. The failure backoff counts
	// from it.
	FailedAt *time.Time `bson:"failed_at,omitempty"`
	// LastFailure is the newest failure the node reported of this attempt
	// (docs/node-protocol.md section 5.3.1); nil while it reported none.
	LastFailure *Failure `bson:"last_failure,omitempty"`
	// FailureBase is the failure count of the slot's earlier attempts, added to the counts the
	// node reports of this one; a successor starts with its slot's carried failure as
	// LastFailure, so the slot's last failure stays visible across attempts.
	FailureBase int `bson:"failure_base,omitempty"`
	// JobRun is the id of the job run this workload runs (docs/jobs.md section 7), empty for
	// a service's workload; such a workload has no slot and runs to completion. JobTimeoutS and
	// JobRetries are the job's, copied when the run was placed.
	JobRun      string `bson:"job_run,omitempty"`
	JobTimeoutS int    `bson:"job_timeout_s,omitempty"`
	JobRetries  int    `bson:"job_retries,omitempty"`
	// JobOutcome is the node's newest report of the run (nil before the first).
	JobOutcome *JobOutcome `bson:"job_outcome,omitempty"`
}

// JobOutcome is a job run's workload as its node reported it (abi/node JobOutcome).
type JobOutcome struct {
	Result     string    `bson:"result"`
	Attempts   int       `bson:"attempts"`
	ExitCode   *int      `bson:"exit_code,omitempty"`
	Signal     int       `bson:"signal,omitempty"`
	StartedAt  time.Time `bson:"started_at,omitempty"`
	EndedAt    time.Time `bson:"ended_at,omitempty"`
	OutputTail string    `bson:"output_tail,omitempty"`
}

// KindJob is [Service.Kind] of a job.
const KindJob = "job"

// IsJob reports whether s is a job rather than a service.
func (s *Service) IsJob() bool { return s.Kind == KindJob }

// Concurrency policies of a job (docs/jobs.md section 7).
const (
	ConcurrencyForbid  = "forbid"
	ConcurrencyReplace = "replace"
	ConcurrencyAllow   = "allow"
)

// JobSettings is a job's schedule and run policy as stored, defaults written out
// (docs/jobs.md section 7).
type JobSettings struct {
	// Schedule and TimeZone say when it fires (docs/jobs.md sections 1 to 3); an empty
	// Schedule runs only when asked.
	Schedule string `bson:"schedule,omitempty"`
	TimeZone string `bson:"time_zone,omitempty"`
	// Concurrency is ConcurrencyForbid, ConcurrencyReplace or ConcurrencyAllow.
	Concurrency string `bson:"concurrency"`
	// TimeoutS bounds each attempt in seconds (0: none); Retries counts the attempts after
	// the first.
	TimeoutS int `bson:"timeout_s,omitempty"`
	Retries  int `bson:"retries,omitempty"`
	// StartingDeadlineS is how late a fire time may still start, in seconds.
	StartingDeadlineS int `bson:"starting_deadline_s"`
	// KeepHistory is how many ended runs are kept.
	KeepHistory int `bson:"keep_history"`
	// Suspended reports whether an operator suspended the schedule (berth job suspend); an
	// apply keeps it.
	Suspended bool `bson:"suspended,omitempty"`
}

// Volume is one persistent directory of a service: a name unique within it and, for
// containers, the path it is mounted at.
type Volume struct {
	Name string `bson:"name" json:"name"`
	Path string `bson:"path,omitempty" json:"path,omitempty"`
}

// Failure is one failure of a workload as the core keeps it: the node's
// report (docs/node-protocol.md section 5.3.1). Kind is exit, signal, probe,
// start or image; ExitCode is set for exit, Signal for signal, ProbeURL and
// ProbeStatus (0: no HTTP answer) for probe; At is the node's clock; Count
// is how many failures of the attempt (or, on a slot, of the slot's attempts
// so far) were reported.
type Failure struct {
	Kind        string    `bson:"kind" json:"kind"`
	ExitCode    *int      `bson:"exit_code,omitempty" json:"exit_code,omitempty"`
	Signal      int       `bson:"signal,omitempty" json:"signal,omitempty"`
	ProbeURL    string    `bson:"probe_url,omitempty" json:"probe_url,omitempty"`
	ProbeStatus int       `bson:"probe_status,omitempty" json:"probe_status,omitempty"`
	Message     string    `bson:"message,omitempty" json:"message,omitempty"`
	At          time.Time `bson:"at" json:"at"`
	Count       int       `bson:"count" json:"count"`
}

// Equal reports whether f and g (either may be nil) describe the same failure.
func (f *Failure) Equal(g *Failure) bool {
	if f == nil || g == nil {
		return f == nil && g == nil
	}
	sameCode := (f.ExitCode == nil) == (g.ExitCode == nil) && (f.ExitCode == nil || *f.ExitCode == *g.ExitCode)
	return sameCode && f.Kind == g.Kind && f.Signal == g.Signal && f.ProbeURL == g.ProbeURL &&
		f.ProbeStatus == g.ProbeStatus && f.Message == g.Message && f.At.Equal(g.At) && f.Count == g.Count
}

// Invocation is what a workload runs: the release and everything the service says about running
// it.
type Invocation struct {
	Runtime string `bson:"runtime,omitempty"`
	// Bundle is the bundle name as the operator wrote it; BundleDigest is what runs.
	Bundle       string            `bson:"bundle,omitempty"`
	BundleDigest string            `bson:"bundle_digest,omitempty"`
	Image        string            `bson:"image,omitempty"`
	Command      []string          `bson:"command,omitempty"`
	Env          map[string]string `bson:"env,omitempty"`
	// Secrets and SecretSets are the service's secret references ([Service.Secrets]).
	Secrets    map[string]secrets.Ref `bson:"secrets,omitempty" json:",omitempty"`
	SecretSets []string               `bson:"secret_sets,omitempty" json:",omitempty"`
	// ResolvedSecrets is [Service.ResolvedSecrets] when the attempt was admitted.
	ResolvedSecrets map[string]secrets.Ref `bson:"resolved_secrets,omitempty" json:",omitempty"`
	Port            int                    `bson:"port"`
	User            string                 `bson:"user,omitempty"`
	MemoryMB        int64                  `bson:"memory_mb,omitempty"`
	CPUMillis       int64                  `bson:"cpu_millis,omitempty"`
	HealthCheck     HealthCheck            `bson:"health_check"`
}

// InvocationOf returns what s's workloads run now.
func InvocationOf(s *Service) *Invocation {
	return &Invocation{Runtime: s.Runtime, Bundle: s.Bundle, BundleDigest: s.BundleDigest, Image: s.Image, Command: s.Command, Env: s.Env,
		Secrets: s.Secrets, SecretSets: s.SecretSets, ResolvedSecrets: s.ResolvedSecrets, Port: s.Port, User: s.User, MemoryMB: s.MemoryMB, CPUMillis: s.CPUMillis, HealthCheck: s.HealthCheck}
}

// Release returns the release of inv.
func (inv *Invocation) Release() Release {
	return Release{Bundle: inv.Bundle, BundleDigest: inv.BundleDigest, Image: inv.Image}
}

// same reports whether a and b run the same thing (the bundle name aside).
func (inv *Invocation) same(b *Invocation) bool {
	x, y := *inv, *b
	x.Bundle, y.Bundle = "", ""
	rx, _ := json.Marshal(x)
	ry, _ := json.Marshal(y)
	return string(rx) == string(ry)
}

// Desired statuses of a workload document. DesiredRemoved workloads are left out of the node's
// desired state, so the node removes them.
const (
	DesiredRunning = "running"
	DesiredStopped = "stopped"
	DesiredRemoved = "removed"
)

// Catalog reads and writes projects, services and workloads.
type Catalog struct {
	st        *store.Store
	projects  *mongo.Collection
	services  *mongo.Collection
	workloads *mongo.Collection
	now       func() time.Time
}

// NewCatalog returns a Catalog over s. now may be nil (time.Now).
func NewCatalog(s *store.Store, now func() time.Time) *Catalog {
	if now == nil {
		now = time.Now
	}
	return &Catalog{st: s, projects: s.Collection("projects"), services: s.Collection("services"), workloads: s.Collection("workloads"), now: now}
}

// EnsureIndexes creates the unique indexes on project names and (project,
// service name); idempotent.
func (c *Catalog) EnsureIndexes(ctx context.Context) error {
	if _, err := c.projects.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "name", Value: 1}}, Options: options.Index().SetUnique(true).SetName("name")}); err != nil {
		return fmt.Errorf("create project index: %w", err)
	}
	if _, err := c.services.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "project_id", Value: 1}, {Key: "name", Value: 1}}, Options: options.Index().SetUnique(true).SetName("project_name")}); err != nil {
		return fmt.Errorf("create service index: %w", err)
	}
	return nil
}

// EnsureProject returns the project named name, creating it when absent
// (idempotent; two concurrent creators get the same project).
func (c *Catalog) EnsureProject(ctx context.Context, name string) (*Project, bool, error) {
	if p, err := c.GetProject(ctx, name); err == nil {
		return p, false, nil
	} else if !errors.Is(err, ErrProjectNotFound) {
		return nil, false, err
	}
	p := &Project{ID: identity.NewID("prj_"), Name: name, CreatedAt: c.now().UTC()}
	if a, ok := changelog.ActorFrom(ctx); ok {
		// The payload is the project as the API shows it.
		pend, err := changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: "project", EntityID: p.ID, Op: node.OpCreate,
			Payload: client.Project{ID: p.ID, Name: p.Name, CreatedAt: p.CreatedAt}})
		if err != nil {
			return nil, false, fmt.Errorf("create project %s: %w", name, err)
		}
		p.LogOutbox = []changelog.Pending{pend}
	}
	if _, err := c.projects.InsertOne(ctx, p); err != nil {
		if store.IsDuplicateKey(err) {
			p, err := c.GetProject(ctx, name)
			return p, false, err
		}
		return nil, false, fmt.Errorf("create project %s: %w", name, err)
	}
	return p, true, nil
}

// GetProject returns the project named name or ErrProjectNotFound.
func (c *Catalog) GetProject(ctx context.Context, name string) (*Project, error) {
	ps, err := findAll[Project](ctx, c.st, c.projects, bson.M{"name": name}, nil)
	if err != nil {
		return nil, fmt.Errorf("get project %s: %w", name, err)
	}
	if len(ps) == 0 {
		return nil, ErrProjectNotFound
	}
	p := ps[0]
	return &p, nil
}

// ListProjects returns every project by name.
func (c *Catalog) ListProjects(ctx context.Context) ([]Project, error) {
	return findAll[Project](ctx, c.st, c.projects, bson.M{}, bson.D{{Key: "name", Value: 1}})
}

// PutService is [Catalog.ApplyService] that reports only whether it created the service.
func (c *Catalog) PutService(ctx context.Context, p *Project, s *Service, expected *int64) (*Service, bool, error) {
	out, outcome, err := c.ApplyService(ctx, p, s, expected)
	return out, outcome == PutCreated, err
}

// PutOutcome says what [Catalog.ApplyService] did.
type PutOutcome int

// Outcomes of [Catalog.ApplyService].
const (
	// PutCreated: the service did not exist and was inserted at revision 1.
	PutCreated PutOutcome = iota + 1
	// PutUpdated: the stored service differed and was replaced at the next revision.
	PutUpdated
	// PutUnchanged: the stored service already declares exactly s; nothing was written and the
	// stored service (at its current revision) is returned.
	PutUnchanged
)

// ApplyService creates or replaces a service. expected, when not nil, is the revision the
// caller read (0: must not exist); it is checked also when nothing would change, so a stale
// expected revision is a conflict either way. A service identical to the stored one in
// everything the operator declares ([SameDeclaration]) is not written (PutUnchanged). Before
// it, the service takes the route claim of each of its domains (one insert or compare-and-set
// per hostname, docs/routes.md section 2). A write is one compare-and-set on the service
// document. Errors: ErrRevisionConflict, ErrDomainTaken,
// ErrServiceDeleting, ErrPlacementModeImmutable.
func (c *Catalog) ApplyService(ctx context.Context, p *Project, s *Service, expected *int64) (*Service, PutOutcome, error) {
	if err := c.checkDomains(ctx, p, s); err != nil {
		return nil, 0, err
	}
	if err := c.claimDomains(ctx, p, s); err != nil {
		return nil, 0, err
	}
	now := c.now().UTC()
	cur, err := c.GetService(ctx, p, s.Name)
	switch {
	case errors.Is(err, ErrServiceNotFound):
		if expected != nil && *expected != 0 {
			return nil, 0, fmt.Errorf("%w: service %s/%s does not exist (expected revision %d)", ErrRevisionConflict, p.Name, s.Name, *expected)
		}
		s.ID, s.ProjectID, s.Project, s.Revision, s.CreatedAt, s.UpdatedAt = identity.NewID("svc_"), p.ID, p.Name, 1, now, now
		s.LogOutbox, s.Reconcile = nil, newRequest(causeOf(s, CauseCreated), 1, now)
		if pend, ok, err := logChange(ctx, s.ID, node.OpCreate, s); err != nil {
			return nil, 0, err
		} else if ok {
			s.LogOutbox = []changelog.Pending{pend}
		}
		if _, err := c.services.InsertOne(ctx, s); err != nil {
			if store.IsDuplicateKey(err) {
				return nil, 0, fmt.Errorf("%w: service %s/%s was created concurrently", ErrRevisionConflict, p.Name, s.Name)
			}
			return nil, 0, fmt.Errorf("create service: %w", err)
		}
		return s, PutCreated, nil
	case err != nil:
		return nil, 0, err
	}
	if expected != nil && *expected != cur.Revision {
		return nil, 0, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", ErrRevisionConflict, p.Name, s.Name, cur.Revision, *expected)
	}
	if cur.Deleting {
		return nil, 0, fmt.Errorf("%w: %s/%s", ErrServiceDeleting, p.Name, s.Name)
	}
	if cur.Stateful() != s.Stateful() {
		return nil, 0, fmt.Errorf("%w: service %s/%s is %s", ErrPlacementModeImmutable, p.Name, s.Name, placementOf(cur))
	}
	if s.Rebalance == nil {
		s.Rebalance = cur.Rebalance // an apply declares none and keeps it; a rebalance writes its own
	}
	if SameDeclaration(cur, s) && SameRebalance(cur, s) {
		return cur, PutUnchanged, nil
	}
	s.Previous = cur.Previous
	s.RolloutPaused, s.RestartGeneration = cur.RolloutPaused, cur.RestartGeneration
	if was := InvocationOf(cur); !was.same(InvocationOf(s)) {
		s.Previous = was
	}
	s.ID, s.ProjectID, s.Project, s.Revision, s.CreatedAt, s.UpdatedAt = cur.ID, p.ID, p.Name, cur.Revision+1, cur.CreatedAt, now
	// The reconcile request of this revision replaces any older one still pending: the pass
	// that acts on this revision acts on everything before it.
	s.Reconcile = newRequest(causeOf(s, CauseUpdated), s.Revision, now)
	// Changes still pending in the outbox stay there: the appender clears
	// each by value once it is in the log.
	s.LogOutbox = cur.LogOutbox
	if pend, ok, err := logChange(ctx, s.ID, node.OpUpdate, s); err != nil {
		return nil, 0, err
	} else if ok {
		s.LogOutbox = append(slices.Clip(s.LogOutbox), pend)
	}
	matched, err := c.st.ReplaceIfRevision(ctx, c.services, cur.ID, cur.Revision, s)
	if err != nil {
		return nil, 0, fmt.Errorf("update service: %w", err)
	}
	if !matched {
		return nil, 0, fmt.Errorf("%w: service %s/%s changed concurrently", ErrRevisionConflict, p.Name, s.Name)
	}
	return s, PutUpdated, nil
}

// SameDeclaration reports whether a and b declare the same service: equal in every field the
// operator sets through an apply (release, command, environment, port, domains, replicas, health
// check, labels, capacity, placement, lease, container fields), ignoring identity, revision,
// timestamps, the deletion mark, Previous, the rollout's pause and restart generation and the
// latest rebalance. Nil
// and empty maps and lists are equal.
func SameDeclaration(a, b *Service) bool {
	norm := func(s *Service) Service {
		n := *s
		n.ID, n.ProjectID, n.Project, n.Revision = "", "", "", 0
		n.CreatedAt, n.UpdatedAt, n.Deleting, n.Previous, n.LogOutbox, n.Reconcile = time.Time{}, time.Time{}, false, nil, nil, nil
		n.RollbackOf, n.PurgeVolumes, n.RolloutPaused, n.RestartGeneration, n.Rebalance = 0, false, false, 0, nil
		if len(n.Env) == 0 {
			n.Env = nil
		}
		if len(n.Secrets) == 0 {
			n.Secrets = nil
		}
		if len(n.SecretSets) == 0 {
			n.SecretSets = nil
		}
		if len(n.ResolvedSecrets) == 0 {
			n.ResolvedSecrets = nil
		}
		if len(n.Labels) == 0 {
			n.Labels = nil
		}
		n.Resources, n.Scheduling = n.Resources.normal(), n.Scheduling.normal()
		if len(n.Volumes) == 0 {
			n.Volumes = nil
		}
		if len(n.Bindings) == 0 {
			n.Bindings = nil
		}
		if len(n.Command) == 0 {
			n.Command = nil
		}
		if len(n.Domains) == 0 {
			n.Domains = nil
		}
		if n.PlacementMode == "" {
			n.PlacementMode = PlacementPortable
		}
		return n
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func placementOf(s *Service) string {
	if s.Stateful() {
		return PlacementStateful
	}
	return PlacementPortable
}

func (c *Catalog) checkDomains(ctx context.Context, p *Project, s *Service) error {
	if len(s.Domains) == 0 {
		return nil
	}
	var other Service
	err := c.services.FindOne(ctx, bson.M{"domains": bson.M{"$in": s.Domains}, "$or": bson.A{
		bson.M{"project_id": bson.M{"$ne": p.ID}}, bson.M{"name": bson.M{"$ne": s.Name}},
	}}).Decode(&other)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check domains: %w", err)
	}
	return fmt.Errorf("%w: a domain of %v is routed to %s/%s", ErrDomainTaken, s.Domains, other.Project, other.Name)
}

// GetServiceByID returns the service with id, or an error wrapping ErrServiceNotFound.
func (c *Catalog) GetServiceByID(ctx context.Context, id string) (*Service, error) {
	var s Service
	err := c.st.View().Get(ctx, c.services, id, &s)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no service with id %q", ErrServiceNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// MarkDeleting marks a service deleting with one compare-and-set on its revision (expected,
// when not nil, is the revision the caller read) and returns it after the write; marking a
// service already deleting returns it unchanged (idempotent). Errors: ErrServiceNotFound,
// ErrRevisionConflict.
func (c *Catalog) MarkDeleting(ctx context.Context, p *Project, name string, expected *int64) (*Service, error) {
	return c.MarkDeletingWith(ctx, p, name, expected, false)
}

// MarkDeletingWith is [Catalog.MarkDeleting] that also writes purgeVolumes
// ([Service.PurgeVolumes]) in the same compare-and-set. Asking again with purgeVolumes of a
// service already deleting without it sets it (one more compare-and-set, logged as the delete
// is); it never clears it, and any other repeat returns the service unchanged.
func (c *Catalog) MarkDeletingWith(ctx context.Context, p *Project, name string, expected *int64, purgeVolumes bool) (*Service, error) {
	cur, err := c.GetService(ctx, p, name)
	if err != nil {
		return nil, err
	}
	if cur.Deleting && (cur.PurgeVolumes || !purgeVolumes) {
		cur.LogOutbox = nil // nothing written, nothing to log
		return cur, nil
	}
	if expected != nil && *expected != cur.Revision {
		return nil, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", ErrRevisionConflict, p.Name, name, cur.Revision, *expected)
	}
	now := c.now().UTC()
	req := newRequest(CauseDeleting, cur.Revision+1, now)
	set := bson.M{"deleting": true, "updated_at": now, reconcileField: req}
	if purgeVolumes {
		set["purge_volumes"] = true
	}
	update := bson.M{"$set": set}
	pend, logged, err := logChange(ctx, cur.ID, node.OpDelete, nil)
	if err != nil {
		return nil, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
	}
	if _, err := c.st.UpdateIfRevision(ctx, c.services, cur.ID, cur.Revision, update); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: service %s/%s changed concurrently", ErrRevisionConflict, p.Name, name)
		}
		return nil, fmt.Errorf("mark service deleting: %w", err)
	}
	cur.Deleting, cur.PurgeVolumes, cur.Revision, cur.UpdatedAt, cur.Reconcile = true, cur.PurgeVolumes || purgeVolumes, cur.Revision+1, now, req
	if logged {
		cur.LogOutbox = append(cur.LogOutbox, pend)
	}
	return cur, nil
}

// Undone returns the service cur becomes when it returns to what it ran before its latest
// change of what it runs (release, command, environment, secrets, port, user, limits, health
// check; the current becomes the previous), for an undo or, with auto, the automatic rollback
// of a failed rollout, which records RollbackOf (docs/reconciliation.md section 7.2). Replicas,
// domains and the runtime spec are not touched. cur is not modified. Errors:
// ErrServiceDeleting, ErrNoPreviousRelease.
func Undone(cur *Service, auto bool) (*Service, error) {
	switch {
	case cur.Deleting:
		return nil, fmt.Errorf("%w: %s/%s", ErrServiceDeleting, cur.Project, cur.Name)
	case cur.Previous == nil || cur.Previous.Release().Digest() == "":
		return nil, fmt.Errorf("%w: %s/%s", ErrNoPreviousRelease, cur.Project, cur.Name)
	}
	back, now := *cur.Previous, InvocationOf(cur)
	next := *cur
	next.Runtime, next.Bundle, next.BundleDigest, next.Image = back.Runtime, back.Bundle, back.BundleDigest, back.Image
	next.Command, next.Env, next.Port, next.User = back.Command, back.Env, back.Port, back.User
	next.Secrets, next.SecretSets, next.ResolvedSecrets = back.Secrets, back.SecretSets, back.ResolvedSecrets
	next.MemoryMB, next.CPUMillis, next.HealthCheck, next.Previous = back.MemoryMB, back.CPUMillis, back.HealthCheck, now
	next.RollbackOf, next.LogOutbox = 0, nil
	if auto {
		next.RollbackOf = cur.Revision
	}
	return &next, nil
}

// Followers returns the services of project p that follow repoTag ("<project>/<repo>:<tag>")
// with deploy_on_push (docs/registry.md section 8). It scans the project's services.
func (c *Catalog) Followers(ctx context.Context, p *Project, repoTag string) ([]Service, error) {
	return findAll[Service](ctx, c.st, c.services, bson.M{"project_id": p.ID, "image_tag": repoTag, "deploy_on_push": true}, nil)
}

// reconcileField is the service document field that holds [Service.Reconcile].
const reconcileField = "reconcile"

// ClearReconcile removes the reconcile request of service id while the service is still at
// revision rev, the revision a reconcile pass acted on, with one compare-and-set on the service
// document that leaves its revision as it is (a client's expected revision stays valid). It
// reports whether it cleared: false when the service moved on (the newer write carries its own
// request, which stays) or is gone. Only the reconciler calls it.
func (c *Catalog) ClearReconcile(ctx context.Context, id string, rev int64) (bool, error) {
	ok, err := c.st.UpdateIf(ctx, c.services, id, bson.D{{Key: store.RevisionField, Value: rev}},
		bson.M{"$unset": bson.M{reconcileField: ""}})
	if err != nil {
		return false, fmt.Errorf("clear reconcile request of service %s at revision %d: %w", id, rev, err)
	}
	return ok, nil
}

// WatchServices returns a subscription to the writes of service documents, by any path of this
// process and, on a MongoDB replica set, of every other berthd ([store.View.Subscribe]), holding
// at most limit ids (limit < 1: the store's default). The caller closes it.
func (c *Catalog) WatchServices(limit int) *store.Subscription {
	return c.st.View().Subscribe(c.services.Name(), limit)
}

// DeleteServiceByID removes the service document with id; a missing one is not an error. Only
// the deletion finalizer calls it, once every slot settled.
func (c *Catalog) DeleteServiceByID(ctx context.Context, id string) error {
	s, err := c.GetServiceByID(ctx, id)
	if errors.Is(err, ErrServiceNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete service %s: %w", id, err)
	}
	if _, err := c.services.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		return fmt.Errorf("delete service %s: %w", id, err)
	}
	// Its route claims go with it (docs/routes.md section 2); a claim left by
	// a death here has lapsed anyway, as its service is gone.
	return c.releaseClaims(ctx, s.ProjectID, s.Name)
}

// GetService returns a service or ErrServiceNotFound.
func (c *Catalog) GetService(ctx context.Context, p *Project, name string) (*Service, error) {
	ss, err := findAll[Service](ctx, c.st, c.services, bson.M{"project_id": p.ID, "name": name}, nil)
	if err != nil {
		return nil, fmt.Errorf("get service %s/%s: %w", p.Name, name, err)
	}
	if len(ss) == 0 {
		return nil, fmt.Errorf("%w: no service %q in project %q", ErrServiceNotFound, name, p.Name)
	}
	return &ss[0], nil
}

// ListServices returns a project's services by name, or every service when p is nil.
func (c *Catalog) ListServices(ctx context.Context, p *Project) ([]Service, error) {
	filter := bson.M{}
	if p != nil {
		filter["project_id"] = p.ID
	}
	return findAll[Service](ctx, c.st, c.services, filter, bson.D{{Key: "project", Value: 1}, {Key: "name", Value: 1}})
}

// DeleteService removes a service (compare-and-set on expected when not nil).
// Its workloads are removed by the next reconcile, which finds them orphaned.
func (c *Catalog) DeleteService(ctx context.Context, p *Project, name string, expected *int64) error {
	_, err := c.RemoveService(ctx, p, name, expected)
	return err
}

// RemoveService is [Catalog.DeleteService] that also returns the service it
// deleted, so callers can name it by id (the change log does).
func (c *Catalog) RemoveService(ctx context.Context, p *Project, name string, expected *int64) (*Service, error) {
	cur, err := c.GetService(ctx, p, name)
	if err != nil {
		return nil, err
	}
	if expected != nil && *expected != cur.Revision {
		return nil, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", ErrRevisionConflict, p.Name, name, cur.Revision, *expected)
	}
	res, err := c.services.DeleteOne(ctx, bson.M{"_id": cur.ID, "revision": cur.Revision})
	if err != nil {
		return nil, fmt.Errorf("delete service: %w", err)
	}
	if res.DeletedCount == 0 {
		return nil, fmt.Errorf("%w: service %s/%s changed concurrently", ErrRevisionConflict, p.Name, name)
	}
	if err := c.releaseClaims(ctx, cur.ProjectID, cur.Name); err != nil {
		return nil, err
	}
	return cur, nil
}

// ListWorkloads returns workloads matching filter (nil: all), ordered by service and slot.
func (c *Catalog) ListWorkloads(ctx context.Context, filter bson.M) ([]Workload, error) {
	if filter == nil {
		filter = bson.M{}
	}
	return findAll[Workload](ctx, c.st, c.workloads, filter, bson.D{{Key: "project", Value: 1}, {Key: "service", Value: 1}, {Key: "slot", Value: 1}})
}

// CreateWorkload records a newly placed slot.
func (c *Catalog) CreateWorkload(ctx context.Context, s *Service, slot int, nodeID string) (*Workload, error) {
	w := &Workload{
		ID: identity.NewID("wl_"), ProjectID: s.ProjectID, Project: s.Project, ServiceID: s.ID, Service: s.Name,
		Slot: slot, NodeID: nodeID, SpecHash: s.SpecHash(), DesiredStatus: "running",
		ObservedStatus: "creating", Health: "unknown", CreatedAt: c.now().UTC(),
	}
	if _, err := c.workloads.InsertOne(ctx, w); err != nil {
		return nil, fmt.Errorf("create workload: %w", err)
	}
	return w, nil
}

// InsertWorkload stores w under its own id; a workload already stored under that id is left
// as it is (the insert is idempotent, so a sweep that died after committing a slot creates the
// same workload again).
func (c *Catalog) InsertWorkload(ctx context.Context, w *Workload) error {
	if w.CreatedAt.IsZero() {
		w.CreatedAt = c.now().UTC()
	}
	if _, err := c.workloads.InsertOne(ctx, w); err != nil && !store.IsDuplicateKey(err) {
		return fmt.Errorf("create workload %s: %w", w.ID, err)
	}
	return nil
}

// GetWorkload reads one workload by id; errors wrap store.ErrNotFound when there is none.
func (c *Catalog) GetWorkload(ctx context.Context, id string) (*Workload, error) {
	var w Workload
	if err := c.st.View().Get(ctx, c.workloads, id, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// SetDesiredStatus sets a workload's desired status (DesiredRunning, DesiredStopped or
// DesiredRemoved) and clears its StatusRev, unless it already has that status. It reports
// whether it wrote.
func (c *Catalog) SetDesiredStatus(ctx context.Context, id, status string) (bool, error) {
	var w Workload
	if err := c.st.View().Get(ctx, c.workloads, id, &w); err != nil {
		return false, err
	}
	if w.DesiredStatus == status {
		return false, nil
	}
	ok, err := c.st.UpdateIf(ctx, c.workloads, id, bson.D{{Key: "desired_status", Value: w.DesiredStatus}},
		bson.M{"$set": bson.M{"desired_status": status, "status_rev": int64(0)}})
	if err != nil {
		return false, fmt.Errorf("set desired status of %s: %w", id, err)
	}
	return ok, nil
}

// RecordStatusRev records rev, a revision of the node's desired state that carries the
// workload's desired status, when none is recorded and the status is still status.
func (c *Catalog) RecordStatusRev(ctx context.Context, id, status string, rev int64) error {
	if _, err := c.st.UpdateIf(ctx, c.workloads, id, bson.D{{Key: "desired_status", Value: status}, {Key: "status_rev", Value: int64(0)}},
		bson.M{"$set": bson.M{"status_rev": rev}}); err != nil {
		return fmt.Errorf("record status revision of %s: %w", id, err)
	}
	return nil
}

// RemoveWorkload deletes a workload record; removing one that is gone is not an error.
func (c *Catalog) RemoveWorkload(ctx context.Context, id string) error {
	if _, err := c.workloads.DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("remove workload %s: %w", id, err)
	}
	return nil
}

// Observation is what a node reported of one of its workloads.
type Observation struct {
	WorkloadID     string
	ObservedStatus string
	Health         string
	Address        string
	RestartCount   int
	Message        string
	// LastFailure is the node's newest failure of the workload; nil keeps
	// the one stored (a failure is never forgotten by a report that omits it).
	LastFailure *Failure
	// Job is the node's report of a job run's workload; nil keeps the one stored.
	Job *JobOutcome
}

// Observe records a node's report of its workloads. Only workloads placed on
// nodeID are touched, so a report cannot write another node's workloads. It
// reports whether anything that routing depends on changed.
func (c *Catalog) Observe(ctx context.Context, nodeID string, obs []Observation) (bool, error) {
	changed := false
	now := c.now().UTC()
	for _, o := range obs {
		// Read by _id first: most reports repeat what is stored, and a
		// filter beyond _id would make the embedded store scan every workload.
		var cur Workload
		err := c.st.View().Get(ctx, c.workloads, o.WorkloadID, &cur)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return changed, fmt.Errorf("record observation of %s: %w", o.WorkloadID, err)
		}
		var reported *Failure
		if o.LastFailure != nil {
			f := *o.LastFailure
			f.At, f.Count = f.At.UTC().Truncate(time.Millisecond), f.Count+cur.FailureBase // as stored (BSON keeps milliseconds)
			reported = &f
		}
		newFailure := reported != nil && !reported.Equal(cur.LastFailure)
		var job *JobOutcome
		if o.Job != nil {
			j := *o.Job
			j.StartedAt, j.EndedAt = j.StartedAt.UTC().Truncate(time.Millisecond), j.EndedAt.UTC().Truncate(time.Millisecond)
			if cur.JobOutcome == nil || !reflect.DeepEqual(*cur.JobOutcome, j) {
				job = &j
			}
		}
		if cur.NodeID != nodeID || (cur.ObservedStatus == o.ObservedStatus && cur.Health == o.Health &&
			cur.Address == o.Address && cur.RestartCount == o.RestartCount && cur.Message == o.Message && !newFailure && job == nil) {
			continue
		}
		set := bson.M{"observed_status": o.ObservedStatus, "health": o.Health, "address": o.Address,
			"restart_count": o.RestartCount, "message": o.Message, "observed_at": now}
		if newFailure {
			set["last_failure"] = *reported
		}
		if job != nil {
			set["job_outcome"] = *job
		}
		switch {
		case o.ObservedStatus == "running" && o.Health == "passing":
			set["ever_ready"], set["failed_at"] = true, nil
		case cur.FailedAt == nil && cur.DesiredStatus == DesiredRunning && (o.ObservedStatus == "crashed" || o.ObservedStatus == "stopped"):
			set["failed_at"] = now
		}
		ok, err := c.st.UpdateIf(ctx, c.workloads, o.WorkloadID, bson.D{{Key: "node_id", Value: nodeID}}, bson.M{"$set": set})
		if err != nil {
			return changed, fmt.Errorf("record observation of %s: %w", o.WorkloadID, err)
		}
		changed = changed || ok
	}
	return changed, nil
}

// findAll returns the documents of coll whose fields equal filter's values, ordered by sort, from
// the store's read view. A filter with an operator value (a document) goes to the store.
func findAll[T any](ctx context.Context, st *store.Store, coll *mongo.Collection, filter bson.M, sort bson.D) ([]T, error) {
	eq := bson.D{}
	for k, v := range filter {
		switch v.(type) {
		case bson.M, bson.D, map[string]any:
			return findStore[T](ctx, coll, filter, sort)
		}
		eq = append(eq, bson.E{Key: k, Value: v})
	}
	out := []T{}
	if err := st.View().FindSorted(ctx, coll, eq, sort, &out); err != nil {
		return nil, fmt.Errorf("find in %s: %w", coll.Name(), err)
	}
	return out, nil
}

func findStore[T any](ctx context.Context, coll *mongo.Collection, filter bson.M, sort bson.D) ([]T, error) {
	cur, err := coll.Find(ctx, filter, options.Find().SetSort(sort))
	if err != nil {
		return nil, fmt.Errorf("find in %s: %w", coll.Name(), err)
	}
	out := []T{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("read %s: %w", coll.Name(), err)
	}
	return out, nil
}

// WorkloadFilter selects workloads by equality on the fields that are set; the zero value
// selects every workload.
type WorkloadFilter struct {
	ID        string // the workload's id
	ProjectID string
	ServiceID string
	Service   string // the service's name
	NodeID    string
}

// FindWorkloads is [Catalog.ListWorkloads] with the filter f, sorted by project, service and
// slot.
func (c *Catalog) FindWorkloads(ctx context.Context, f WorkloadFilter) ([]Workload, error) {
	filter := bson.M{}
	for k, v := range map[string]string{"_id": f.ID, "project_id": f.ProjectID, "service_id": f.ServiceID, "service": f.Service, "node_id": f.NodeID} {
		if v != "" {
			filter[k] = v
		}
	}
	return c.ListWorkloads(ctx, filter)
}
