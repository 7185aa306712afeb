package plugin

import (
	"context"
	"fmt"

	"github.com/berthhq/berth/sdk/runtime"
)

// Driver is a supervised runtime-driver plugin process. It implements
// runtime.Driver by forwarding each call to the current process; calls fail
// with an error wrapping ErrUnavailable while the process is down. Responses
// that break the contract (a missing state, another workload's state) are
// refused with an error naming the plugin. Safe for concurrent use.
type Driver struct {
	s *supervisor
}

var _ runtime.Driver = (*Driver)(nil)

// LaunchDriver starts the driver plugin at cfg.Path, negotiates
// runtime.APIVersion over go-plugin's gRPC protocol, calls Describe, and
// supervises the process until Close. ctx bounds only this first launch. It
// returns an error wrapping ErrChecksum when the binary does not match
// cfg.SHA256, or the launch error (the process is killed).
func LaunchDriver(ctx context.Context, cfg Config) (*Driver, error) {
	s, err := newSupervisor(cfg, runtime.HandshakeConfig(), runtime.PluginSets(nil), runtime.PluginName)
	if err != nil {
		return nil, err
	}
	s.ready = func(ctx context.Context, impl any) error {
		d, err := impl.(runtime.Driver).Describe(ctx)
		if err != nil {
			return fmt.Errorf("describe: %w", err)
		}
		if d == nil || d.Name == "" {
			return s.bug("Describe without a name")
		}
		s.log.Info("runtime driver ready", "name", d.Name, "version", d.Version, "outlives_driver", d.Capabilities.OutlivesDriver)
		return nil
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return &Driver{s: s}, nil
}

// Close kills the plugin process (gracefully, then with SIGKILL after 2 s) and
// stops relaunching it; it returns once the process is gone. Workloads are not
// touched. Later calls return errors wrapping ErrUnavailable. Idempotent.
func (d *Driver) Close() error { return d.s.close() }

// PID returns the pid of the current plugin process, or 0 while it is down.
func (d *Driver) PID() int { return d.s.PID() }

// Launches reports how many times the plugin process was launched
// successfully, the first launch included.
func (d *Driver) Launches() int { return d.s.Launches() }

func (d *Driver) impl() (runtime.Driver, error) {
	impl, err := d.s.current()
	if err != nil {
		return nil, err
	}
	return impl.(runtime.Driver), nil
}

// Describe implements runtime.Driver.
func (d *Driver) Describe(ctx context.Context) (*runtime.DescribeResponse, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	r, err := impl.Describe(ctx)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	return r, nil
}

// Start implements runtime.Driver.
func (d *Driver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	r, err := impl.Start(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	if r == nil {
		return nil, d.s.bug("Start without a response")
	}
	if err := d.checkState(r.State, req.WorkloadID, "Start"); err != nil {
		return nil, err
	}
	return r, nil
}

// Stop implements runtime.Driver.
func (d *Driver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	r, err := impl.Stop(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	if r == nil {
		return nil, d.s.bug("Stop without a response")
	}
	if err := d.checkState(r.State, req.WorkloadID, "Stop"); err != nil {
		return nil, err
	}
	return r, nil
}

// Inspect implements runtime.Driver.
func (d *Driver) Inspect(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	r, err := impl.Inspect(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	if err := d.checkState(r, req.WorkloadID, "Inspect"); err != nil {
		return nil, err
	}
	return r, nil
}

// List implements runtime.Driver.
func (d *Driver) List(ctx context.Context) ([]*runtime.WorkloadState, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	r, err := impl.List(ctx)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	for _, w := range r {
		if err := d.checkState(w, "", "List"); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// checkState refuses a state that breaks the contract.
func (d *Driver) checkState(st *runtime.WorkloadState, id, call string) error {
	switch {
	case st == nil:
		return d.s.bug("%s without a workload state", call)
	case id != "" && st.WorkloadID != id:
		return d.s.bug("%s for %q returned the state of %q", call, id, st.WorkloadID)
	case st.WorkloadID == "":
		return d.s.bug("%s returned a state without a workload id", call)
	case st.State != runtime.StateRunning && st.State != runtime.StateExited:
		return d.s.bug("%s returned unknown state %q for %s", call, st.State, st.WorkloadID)
	}
	return nil
}
