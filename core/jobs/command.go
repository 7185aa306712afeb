package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/services"
)

// Limits of a one-off command (docs/jobs.md section 9).
const (
	// CommandOutputLinger is how long the workload of a one-off command stays on its node after
	// the run ended (ended, never started again), so that whoever follows its output reads the
	// rest of it from the node's log records; then the next pass removes it.
	CommandOutputLinger = time.Minute
	// CommandKeepHistory is how many ended one-off runs are kept per service.
	CommandKeepHistory = 20
	// MaxCommandArgs and MaxCommandBytes bound a one-off command's argument count and size.
	MaxCommandArgs  = 256
	MaxCommandBytes = 64 << 10
	// MaxCommandTimeoutS bounds CommandRequest.TimeoutS: one week.
	MaxCommandTimeoutS = 7 * 24 * 3600
)

// ErrStatefulCommand is returned by [Controller.RunCommand] for a stateful service: its volume
// is held by one node under a lease, and a second process beside its workload is not fenced.
var ErrStatefulCommand = abierrors.New(abierrors.ValidationFailed, "a one-off command cannot run in a stateful service's environment")

// CommandRequest is a one-off command to run in a service's environment (berth run).
type CommandRequest struct {
	// Command is the program and its arguments; required, at most [MaxCommandArgs] of them and
	// [MaxCommandBytes] in all.
	Command []string
	// TimeoutS bounds the run in seconds, as a job's timeout_s does; 0 means no bound, negative
	// or more than [MaxCommandTimeoutS] is refused.
	TimeoutS int
}

// Validate checks req; errors are abi/errors validation_failed.
func (req CommandRequest) Validate() error {
	if len(req.Command) == 0 || req.Command[0] == "" {
		return abierrors.New(abierrors.ValidationFailed, "command must name a program to run")
	}
	if len(req.Command) > MaxCommandArgs {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("command has more than %d arguments", MaxCommandArgs))
	}
	n := 0
	for _, a := range req.Command {
		n += len(a)
	}
	if n > MaxCommandBytes {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("command is longer than %d bytes", MaxCommandBytes))
	}
	if req.TimeoutS < 0 || req.TimeoutS > MaxCommandTimeoutS {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("timeout_s must be from 0 (no bound) to %d", MaxCommandTimeoutS))
	}
	return nil
}

// RunCommand records a one-off run of req.Command in the environment of svc (a service or a
// job: its release, env, secrets, bindings and volumes, its resources and node constraints)
// and places it at once with the one placement decider, like a manual run of a job (docs/jobs.md
// section 9); a run no node fits stays pending and a later pass places it. The caller has had
// the command admitted. The run is never retried, ignores any concurrency policy, and is
// bounded by req.TimeoutS. It returns the run as recorded. Errors: validation_failed for a bad
// request and [ErrStatefulCommand], or the store's.
func (c *Controller) RunCommand(ctx context.Context, svc *services.Service, req CommandRequest) (*Run, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if svc.Stateful() {
		return nil, fmt.Errorf("%w: %s/%s", ErrStatefulCommand, svc.Project, svc.Name)
	}
	r := c.newRun(ctx, svc, TriggerCommand)
	r.Command, r.TimeoutS = append([]string(nil), req.Command...), req.TimeoutS
	return c.record(ctx, svc, r)
}

// commandInvocation makes workload w run one-off command run r: the service's invocation with
// r's command, no port, no health check, no retry and r's timeout. The release, env and secrets
// stay the service's.
func commandInvocation(w *services.Workload, r *Run) {
	inv := *w.Run
	inv.Command = append([]string(nil), r.Command...)
	inv.Port = 0
	inv.HealthCheck = services.HealthCheck{}
	w.Run = &inv
	w.JobTimeoutS, w.JobRetries = r.TimeoutS, 0
}

// collect removes the workloads of runs that ended but still stand in the desired state: a
// one-off command's once [CommandOutputLinger] has passed since it ended, and any whose end
// was recorded by a pass that stopped before removing it. isLive names the live runs this
// pass read; every other run's state is read by _id.
func (c *Controller) collect(ctx context.Context, p *pass, isLive map[string]bool) error {
	var errs []error
	for id, w := range p.byWl {
		if isLive[id] {
			continue
		}
		r, err := c.Get(ctx, id)
		switch {
		case errors.Is(err, ErrRunNotFound): // pruned, or its record never written
		case err != nil:
			errs = append(errs, err)
			continue
		case !r.State.Final():
			continue // placed after this pass read the live runs
		case r.Trigger == TriggerCommand && p.now.Sub(r.EndedAt) < CommandOutputLinger:
			continue
		}
		if err := c.cfg.Catalog.RemoveWorkload(ctx, w.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(p.byWl, id)
		c.wake(w.NodeID)
	}
	return errors.Join(errs...)
}
