// Package runtime is the Go contract of runtime drivers: the Driver interface,
// its request and response types, and their gRPC wire adapters (docs/plugins.md section 3).
//
// Driver authors implement [Driver] (and any optional interfaces) and serve it
// with github.com/berthhq/berth/sdk/runtime; hosts reach a driver through
// [Client]. Both sides share the adapters here, so the wire form is defined once.
package runtime

import (
	"context"
	"io"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
)

// APIVersion is the runtime-driver contract version of this package.
//
// Changelog:
//   - 1 (2026-11-29) Describe, Start, Stop, Inspect, List.
//   - 1 (2026-12-06, before any release) reshaped: Health, Recover with
//     opaque handles, Logs, Stats, stop modes, isolation modes and the
//     mutation fields on Start and Stop.
//   - 1 (2026-12-13, additive) container fields on Start: image, image
//     archive, user, memory and CPU limits, network namespace, cwd.
//   - 1 (2026-12-20, additive) fence_resource on Start and Stop: the lease a
//     stateful workload's fencing token is about.
//   - 1 (2026-12-27, additive) registry_credentials on Start: what a
//     container driver pulls Image with.
const APIVersion = 1

// Driver runs workloads on one node. The agent calls it; implementations
// must be safe for concurrent use.
//
// Vocabulary: a workload is one replica's process (or container) named by a
// workload id; a handle is the driver's opaque, versioned reference to it,
// returned in every [WorkloadState] and persisted by the host, which gives it
// back to Recover after a restart of the agent or of the driver.
//
// Lifecycle, as the agent drives it:
//
//  1. Describe once after launch (name, versions, [Capabilities]).
//  2. Recover for every workload whose handle the agent persisted, then List
//     to find any others.
//  3. Start, Stop and Inspect as the reconcile loop decides; List on every pass.
//
// Every method is idempotent. Start of a running workload returns its state;
// Stop, Inspect and Recover of an unknown workload return an error wrapping
// [ErrNotFound] (callers of Stop treat that as success). Mutating requests
// embed [pluginapi.Mutation]: a fencing token lower than the highest seen
// for the request's FenceResource (the workload itself when empty) is
// refused, and a repeated idempotency key returns the recorded result
// (docs/plugins.md section 3.4).
//
// Optional interfaces: [pluginapi.HealthReporter], [LogStreamer],
// [StatsReporter]. A driver advertises Logs and Stats in its capabilities
// exactly when it implements them.
//
// Example, a host starting and later recovering a workload:
//
//	r, err := d.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_1", Command: []string{"./app"}, ...})
//	persist(r.State.Handle)
//	// after a restart:
//	st, err := d.Recover(ctx, &runtime.RecoverRequest{WorkloadID: "wl_1", Handle: loaded})
type Driver interface {
	// Describe names the driver. Cheap; called once per launch.
	Describe(ctx context.Context) (*DescribeResponse, error)
	// Start starts one workload, or returns the state of the running one
	// with the same id (the request is not compared).
	Start(ctx context.Context, req *StartRequest) (*StartResponse, error)
	// Stop stops one workload, forgets it and returns its final state.
	Stop(ctx context.Context, req *StopRequest) (*StopResponse, error)
	// Inspect reports the state of one workload.
	Inspect(ctx context.Context, req *InspectRequest) (*WorkloadState, error)
	// List reports every workload the driver knows, sorted by id.
	List(ctx context.Context) ([]*WorkloadState, error)
	// Recover finds a workload again from its handle: running, or exited
	// while nobody watched. ErrNotFound when the handle names nothing the
	// driver can find. A handle of an unknown version is refused with an
	// error of code validation_failed.
	Recover(ctx context.Context, req *RecoverRequest) (*WorkloadState, error)
}

// LogStreamer is the optional interface of a driver that serves workload
// output. Logs writes the kept output of req.WorkloadID to w (the last
// TailBytes when positive) and, with Follow, keeps writing new output until
// ctx ends, then returns nil. ErrNotFound for an unknown workload.
type LogStreamer interface {
	Logs(ctx context.Context, req *LogsRequest, w io.Writer) error
}

// StatsReporter is the optional interface of a driver that measures its
// workloads. ErrNotFound for an unknown or exited workload.
type StatsReporter interface {
	Stats(ctx context.Context, req *StatsRequest) (*Stats, error)
}

// ErrNotFound is returned (wrapped) by Stop, Inspect, Recover, Logs and Stats
// for a workload the driver does not know. It carries code not_found, so
// errors.Is holds on both sides of the wire.
var ErrNotFound = abierrors.New(abierrors.NotFound, "workload not found")

// DescribeResponse names the driver and what it can do.
type DescribeResponse struct {
	Name         string // e.g. "process"; a DNS label
	Version      string // the driver's own version
	APIVersions  []int  // contract versions it speaks; must include the negotiated one
	Capabilities Capabilities
}

// Capabilities is what a driver can do; static for the life of the process.
// The host and the conformance suite read it: an advertised capability must
// pass its conformance cases.
type Capabilities struct {
	// OutlivesDriver reports whether workloads keep running when the driver
	// process exits (and are found again by Recover and List).
	OutlivesDriver bool
	// IsolationModes lists the isolation a workload can get, e.g. "none",
	// "container"; the first is the default. At least one.
	IsolationModes []string
	// Logs reports whether the driver implements [LogStreamer].
	Logs bool
	// Stats reports whether the driver implements [StatsReporter].
	Stats bool
	// ResourceLimits says how the driver enforces a workload's MemoryBytes and CPUMillis:
	// [LimitsCgroup2], [LimitsCgroup1], [LimitsContainer], or "none: <why>" when it runs
	// workloads unlimited (e.g. the process driver without root, or with neither cgroup v2
	// nor cgroup v1 memory and cpu controllers); "" means unknown (a driver older than the
	// field).
	ResourceLimits string
}

// Values of [Capabilities.ResourceLimits] other than "none: <why>".
const (
	LimitsCgroup2   = "cgroup2"   // the memory and cpu controllers of cgroup v2
	LimitsCgroup1   = "cgroup1"   // the memory and cpu hierarchies of cgroup v1
	LimitsContainer = "container" // the container runtime's own
)

// ExitReasonOOM is [WorkloadState.ExitReason] of a workload the kernel's OOM killer ended for
// going over its memory limit.
const ExitReasonOOM = "oom"

// Handle is a driver's opaque, versioned reference to one workload. The host
// persists it as given and never parses Data; the driver decodes Data by
// Version and refuses versions it does not know.
type Handle struct {
	Version int
	Data    []byte
}

// IsZero reports whether h is the empty handle.
func (h Handle) IsZero() bool { return h.Version == 0 && len(h.Data) == 0 }

// StartRequest starts one workload. WorkDir exists and holds the extracted
// bundle; Command[0] is resolved relative to WorkDir when it has no slash.
// Env is the complete environment (the agent includes PORT). LogPath is the
// file stdout and stderr go to, kept at most LogMaxBytes (zero means 1 MiB);
// a driver that stamps output through a log writer keeps it instead as
// records in the directory next to it (docs/logs.md section 3).
// Isolation is one of Capabilities.IsolationModes; empty means the first.
//
// User is who the workload runs as: for a container "uid", "uid:gid" or a
// user name of the image (empty: the image's user); for a process, "uid",
// "uid:gid" or a user name of the host (empty: the driver's own user; the
// process driver sets no supplementary groups and refuses a malformed or
// unknown user as validation_failed).
//
// The other container fields (docs/plugins.md section 3, "The containerd
// driver") are ignored by drivers without the isolation mode "container":
//   - Image is a reference pinned to a digest ("host/repo@sha256:<hex>") or a
//     bare "sha256:<hex>" naming the manifest or index in ImageArchive; with
//     an image, an empty Command means the image's entrypoint and command.
//   - ImageArchive is the path on the node of a tar of an OCI image layout
//     holding Image; empty means pull Image from its registry.
//   - MemoryBytes is the memory limit in bytes and CPUMillis the CPU limit
//     in thousandths of a CPU; zero means no limit.
//   - NetworkNamespace is the path of the network namespace to join (as the
//     node's network plugin made it); empty means the node's own.
//   - Cwd is the working directory inside the container; empty means the
//     image's. WorkDir, the host directory, is not visible in a container.
//   - RegistryCredentials are what Image is pulled with: the one whose Host
//     is Image's registry host is used, none means an anonymous pull.
type StartRequest struct {
	WorkloadID  string
	Command     []string
	Env         map[string]string
	WorkDir     string
	LogPath     string
	LogMaxBytes int64
	Isolation   string
	pluginapi.Mutation

	Image            string
	ImageArchive     string
	User             string
	MemoryBytes      int64
	CPUMillis        int64
	NetworkNamespace string
	Cwd              string
	// RegistryCredentials are never part of the request's idempotency
	// digest (json "-"): a rotated credential does not make a retried start
	// a different request, and no digest of a secret is kept.
	RegistryCredentials []RegistryCredential `json:"-"`

	// FenceResource is what Mutation.FencingToken is about: [FenceLease] of
	// the lease for a stateful workload; empty means the workload itself
	// ([FenceWorkload]). A driver keeps the highest token per fence resource
	// and refuses a lower one with code stale_fencing_token
	// (docs/plugins.md section 3.4).
	FenceResource string
}

// RegistryCredential is how a container driver authenticates to one image
// registry (docs/plugins.md section 3.5). Secret is a credential: drivers
// never log it, and String redacts it.
type RegistryCredential struct {
	// Host is the registry's "host[:port]" as image references name it.
	Host string
	// Username and Secret answer the registry's Basic or token challenge
	// (Berth's registry ignores the user name and takes a Berth bearer, a
	// node's brn_ credential for instance, as the secret).
	Username string
	Secret   string
	// Fingerprint, "sha256:<64 hex>", pins the registry's TLS certificate in
	// place of the system CAs and host name checks; empty means system CAs.
	Fingerprint string
	// PlainHTTP reports whether Host is reached over plain HTTP (tests and
	// a berthd without TLS); false means HTTPS.
	PlainHTTP bool
}

// String returns c with its secret redacted, so that c may be logged.
func (c RegistryCredential) String() string {
	secret := ""
	if c.Secret != "" {
		secret = "<redacted>"
	}
	return "{Host:" + c.Host + " Username:" + c.Username + " Secret:" + secret + " Fingerprint:" + c.Fingerprint + "}"
}

// GoString is String, so that %#v redacts the secret too.
func (c RegistryCredential) GoString() string { return c.String() }

// CredentialFor returns the credential of creds for host, or nil.
func CredentialFor(creds []RegistryCredential, host string) *RegistryCredential {
	for i := range creds {
		if creds[i].Host == host {
			return &creds[i]
		}
	}
	return nil
}

// FenceWorkload is the fence resource of a workload without a lease: the
// agent sends its node's desired-state revision as the token.
func FenceWorkload(workloadID string) string { return "workload/" + workloadID }

// FenceLease is the fence resource of a stateful workload's lease: the
// agent sends the lease's fencing token.
func FenceLease(leaseID string) string { return "lease/" + leaseID }

// StartResponse carries the started workload's state, handle included.
type StartResponse struct {
	State *WorkloadState
}

// StopMode says how Stop ends a workload.
type StopMode string

// Stop modes.
const (
	// StopGraceful asks the workload to stop (SIGTERM for a process) and
	// forces it after StopRequest.Timeout. The default.
	StopGraceful StopMode = "graceful"
	// StopForced ends the workload at once (SIGKILL for a process).
	StopForced StopMode = "forced"
)

// StopRequest stops one workload. Timeout applies to StopGraceful; zero
// means 10 s. An empty Mode means StopGraceful.
type StopRequest struct {
	WorkloadID string
	Mode       StopMode
	Timeout    time.Duration
	pluginapi.Mutation
	// FenceResource is as in [StartRequest].
	FenceResource string
}

// StopResponse carries the final state of a stopped workload.
type StopResponse struct {
	State *WorkloadState
}

// InspectRequest names a workload.
type InspectRequest struct {
	WorkloadID string
}

// RecoverRequest names a workload and the handle its Start returned.
type RecoverRequest struct {
	WorkloadID string
	Handle     Handle
}

// LogsRequest asks for a workload's output. TailBytes zero means everything
// the driver kept.
type LogsRequest struct {
	WorkloadID string
	Follow     bool
	TailBytes  int64
}

// StatsRequest names a workload.
type StatsRequest struct {
	WorkloadID string
}

// Stats is a point-in-time measurement of one workload.
type Stats struct {
	CPUSeconds  float64   // user plus system CPU time consumed so far, seconds
	MemoryBytes int64     // resident memory, bytes
	At          time.Time // when measured
}

// Workload states as a driver reports them.
const (
	StateRunning = "running"
	StateExited  = "exited"
)

// WorkloadState is what the driver knows of one workload.
type WorkloadState struct {
	WorkloadID string
	State      string // StateRunning or StateExited
	PID        int    // zero when not a process
	StartedAt  time.Time
	ExitedAt   time.Time // zero while running
	ExitCode   int       // -1 when unknown (the driver did not reap it)
	Handle     Handle    // to persist and give back to Recover
	// ExitReason is why an exited workload ended when the driver knows more than its exit code:
	// [ExitReasonOOM], or "" (older drivers and ordinary exits).
	ExitReason string
}
