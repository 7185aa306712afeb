// Package runtime is what a runtime-driver author links: the Go contract of a
// driver and Serve, which runs it as a go-plugin process (docs/plugins.md).
package runtime

import (
	"context"
	"time"
)

// Driver runs workloads on one node. The agent calls it; implementations must be
// safe for concurrent use. Every method is idempotent: starting a workload that
// is already running returns its current handle, stopping or inspecting a
// workload that does not exist returns an error wrapping ErrNotFound (Stop
// treats that as success at the caller).
//
// Lifecycle: the agent calls Describe once after launch, then List to find the
// workloads that survived an agent or driver restart, then Start, Stop and
// Inspect as its reconcile loop decides. Workloads must outlive the driver
// process when Capabilities.OutlivesDriver is true.
type Driver interface {
	Describe(ctx context.Context) (*DescribeResponse, error)
	Start(ctx context.Context, req *StartRequest) (*StartResponse, error)
	Stop(ctx context.Context, req *StopRequest) (*StopResponse, error)
	Inspect(ctx context.Context, req *InspectRequest) (*WorkloadState, error)
	List(ctx context.Context) ([]*WorkloadState, error)
}

// APIVersion is the runtime-driver contract version of this package.
//
// Changelog: 1 (2026-11-29) Describe, Start, Stop, Inspect, List.
const APIVersion = 1

// DescribeResponse names the driver and what it can do.
type DescribeResponse struct {
	Name         string       // e.g. "process"
	Version      string       // the driver's own version
	APIVersions  []int        // contract versions it speaks
	Capabilities Capabilities // static
}

// Capabilities is what a driver can do; static for the life of the process.
type Capabilities struct {
	OutlivesDriver bool // reports whether workloads keep running when the driver exits
	Isolation      string
}

// StartRequest starts one workload. WorkDir exists and holds the extracted
// bundle; Command[0] is resolved relative to WorkDir when it has no slash
// prefix. Env is the complete environment (the agent includes PORT). LogPath is
// the file stdout and stderr go to; the driver keeps it at most LogMaxBytes
// (zero means 1 MiB) by dropping the oldest half when it grows past that.
type StartRequest struct {
	WorkloadID  string
	Command     []string
	Env         map[string]string
	WorkDir     string
	LogPath     string
	LogMaxBytes int64
}

// StartResponse carries the started workload's state.
type StartResponse struct {
	State *WorkloadState
}

// StopRequest stops one workload: SIGTERM to its process group, then SIGKILL
// after Timeout (zero means 10 s); Force sends SIGKILL at once.
type StopRequest struct {
	WorkloadID string
	Timeout    time.Duration
	Force      bool
}

// StopResponse carries the final state of a stopped workload.
type StopResponse struct {
	State *WorkloadState
}

// InspectRequest names a workload.
type InspectRequest struct {
	WorkloadID string
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
	PID        int
	StartedAt  time.Time
	ExitedAt   time.Time // zero while running
	ExitCode   int       // -1 when unknown (the driver did not reap it)
}
