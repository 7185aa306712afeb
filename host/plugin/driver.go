package plugin

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
)

// Driver is a supervised runtime-driver plugin process. It implements
// runtime.Driver, runtime.LogStreamer and runtime.StatsReporter by
// forwarding each call to the current process under a deadline; calls fail
// with an error wrapping ErrUnavailable while the process is down. Responses
// that break the contract (a missing state, another workload's state, an
// unknown state) are refused with an error naming the plugin. Safe for
// concurrent use.
type Driver struct {
	s    *supervisor
	desc *runtime.DescribeResponse // from the latest launch; s.mu must be held
}

var (
	_ runtime.Driver        = (*Driver)(nil)
	_ runtime.LogStreamer   = (*Driver)(nil)
	_ runtime.StatsReporter = (*Driver)(nil)
)

// LaunchDriver starts the driver plugin at cfg.Path, negotiates
// runtime.APIVersion over go-plugin's gRPC protocol, calls Describe, and
// supervises the process until Close. ctx bounds only this first launch. It
// returns an error wrapping ErrChecksum when the binary does not match
// cfg.SHA256, or the launch error (the process is killed).
func LaunchDriver(ctx context.Context, cfg Config) (*Driver, error) {
	s, err := newSupervisor(cfg, kindSpec{
		kind:     pluginapi.KindRuntime,
		cookie:   pluginapi.RuntimeCookieValue,
		name:     pluginapi.RuntimePluginName,
		versions: []int{runtime.APIVersion},
		newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
			return runtime.NewClient(life, conn)
		},
	})
	if err != nil {
		return nil, err
	}
	d := &Driver{s: s}
	s.ready = func(ctx context.Context, impl any, negotiated int) (string, error) {
		desc, err := impl.(runtime.Driver).Describe(ctx)
		if err != nil {
			return "", fmt.Errorf("describe: %w", err)
		}
		if err := s.checkVersions(desc.Name, desc.APIVersions, negotiated); err != nil {
			return "", err
		}
		if len(desc.Capabilities.IsolationModes) == 0 {
			return "", s.bug("Describe lists no isolation mode")
		}
		s.mu.Lock()
		d.desc = desc
		s.mu.Unlock()
		s.log.Info("runtime driver ready", "name", desc.Name, "version", desc.Version,
			"outlives_driver", desc.Capabilities.OutlivesDriver, "isolation", desc.Capabilities.IsolationModes)
		return desc.Version, nil
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// Close kills the plugin process (gracefully, then with SIGKILL after 2 s) and
// stops relaunching it; it returns once the process is gone. Workloads are not
// touched. Later calls return errors wrapping ErrUnavailable. Idempotent.
func (d *Driver) Close() error { return d.s.close() }

// Status returns a snapshot of the handle.
func (d *Driver) Status() Status { return d.s.Status() }

// PID returns the pid of the current plugin process, or 0 while it is down.
func (d *Driver) PID() int { return d.s.Status().PID }

// Launches reports how many times the plugin process was launched
// successfully, the first launch included.
func (d *Driver) Launches() int { return d.s.Status().Launches }

func (d *Driver) impl() (*runtime.Client, error) {
	impl, err := d.s.current()
	if err != nil {
		return nil, err
	}
	return impl.(*runtime.Client), nil
}

// Describe implements runtime.Driver: the answer of the current process.
func (d *Driver) Describe(ctx context.Context) (*runtime.DescribeResponse, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
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
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Start(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	if err := d.checkState(r.State, req.WorkloadID, "Start"); err != nil {
		return nil, err
	}
	return r, nil
}

// Stop implements runtime.Driver. Its deadline, when ctx has none, is the
// call timeout plus req.Timeout.
func (d *Driver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	extra := req.Timeout
	if extra <= 0 {
		extra = 10 * time.Second
	}
	ctx, cancel := d.s.callCtx(ctx, extra)
	defer cancel()
	r, err := impl.Stop(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
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
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
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
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
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

// Recover implements runtime.Driver.
func (d *Driver) Recover(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Recover(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
	}
	if err := d.checkState(r, req.WorkloadID, "Recover"); err != nil {
		return nil, err
	}
	return r, nil
}

// Logs implements runtime.LogStreamer. With Follow it runs until ctx ends,
// without a deadline of its own; otherwise under the call timeout.
func (d *Driver) Logs(ctx context.Context, req *runtime.LogsRequest, w io.Writer) error {
	impl, err := d.impl()
	if err != nil {
		return err
	}
	if !req.Follow {
		var cancel context.CancelFunc
		ctx, cancel = d.s.callCtx(ctx, 0)
		defer cancel()
	}
	if err := impl.Logs(ctx, req, w); err != nil {
		return d.s.callErr(impl, err)
	}
	return nil
}

// Stats implements runtime.StatsReporter.
func (d *Driver) Stats(ctx context.Context, req *runtime.StatsRequest) (*runtime.Stats, error) {
	impl, err := d.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := d.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Stats(ctx, req)
	if err != nil {
		return nil, d.s.callErr(impl, err)
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
