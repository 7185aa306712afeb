package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/berthhq/berth/sdk/runtime"
)

// pluginEnv makes the test binary serve fakeDriver as a plugin process.
const pluginEnv = "BERTH_SDK_RUNTIME_TEST_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(pluginEnv) != "" {
		runtime.Serve(&fakeDriver{states: map[string]*runtime.WorkloadState{}})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeDriver keeps workloads in memory; it stands for a real driver on the
// other side of the wire.
type fakeDriver struct {
	mu     sync.Mutex
	states map[string]*runtime.WorkloadState
}

var _ runtime.Driver = (*fakeDriver)(nil)

func (f *fakeDriver) Describe(context.Context) (*runtime.DescribeResponse, error) {
	return &runtime.DescribeResponse{Name: "fake", Version: "1.2.3", APIVersions: []int{runtime.APIVersion},
		Capabilities: runtime.Capabilities{OutlivesDriver: true, Isolation: "none"}}, nil
}

func (f *fakeDriver) Start(_ context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Command[0] == "fail" {
		return nil, errors.New("cannot start")
	}
	st := &runtime.WorkloadState{WorkloadID: req.WorkloadID, State: runtime.StateRunning, PID: 42,
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), ExitCode: -1}
	f.states[req.WorkloadID] = st
	return &runtime.StartResponse{State: st}, nil
}

func (f *fakeDriver) Stop(_ context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.states[req.WorkloadID]
	if !ok {
		return nil, fmt.Errorf("stop %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	st.State, st.ExitCode = runtime.StateExited, int(req.Timeout/time.Second)
	st.ExitedAt = st.StartedAt.Add(time.Hour)
	delete(f.states, req.WorkloadID)
	return &runtime.StopResponse{State: st}, nil
}

func (f *fakeDriver) Inspect(_ context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.states[req.WorkloadID]
	if !ok {
		return nil, fmt.Errorf("inspect %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	return st, nil
}

func (f *fakeDriver) List(context.Context) ([]*runtime.WorkloadState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtime.WorkloadState
	for _, st := range f.states {
		out = append(out, st)
	}
	return out, nil
}

// launch starts the test binary as a driver plugin process.
func launch(t *testing.T) (runtime.Driver, *plugin.Client) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), pluginEnv+"=1")
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  runtime.HandshakeConfig(),
		VersionedPlugins: runtime.PluginSets(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	raw, err := rpc.Dispense(runtime.PluginName)
	if err != nil {
		t.Fatalf("dispense: %v", err)
	}
	if v := client.NegotiatedVersion(); v != runtime.APIVersion {
		t.Fatalf("negotiated version %d, want %d", v, runtime.APIVersion)
	}
	return raw.(runtime.Driver), client
}

func TestRoundTrip(t *testing.T) {
	d, _ := launch(t)
	ctx := context.Background()

	desc, err := d.Describe(ctx)
	if err != nil || desc.Name != "fake" || desc.Version != "1.2.3" || len(desc.APIVersions) != 1 || !desc.Capabilities.OutlivesDriver {
		t.Fatalf("Describe = %+v, %v", desc, err)
	}
	r, err := d.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_a", Command: []string{"app"}, Env: map[string]string{"PORT": "1"}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	want := runtime.WorkloadState{WorkloadID: "wl_a", State: runtime.StateRunning, PID: 42,
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), ExitCode: -1}
	if *r.State != want {
		t.Fatalf("Start state = %+v, want %+v", *r.State, want)
	}
	if _, err := d.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_b", Command: []string{"fail"}}); err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("failing Start err = %v", err)
	}
	list, err := d.List(ctx)
	if err != nil || len(list) != 1 || *list[0] != want {
		t.Fatalf("List = %+v, %v", list, err)
	}
	st, err := d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: "wl_a"})
	if err != nil || *st != want {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	stop, err := d.Stop(ctx, &runtime.StopRequest{WorkloadID: "wl_a", Timeout: 7 * time.Second})
	if err != nil || stop.State.State != runtime.StateExited || stop.State.ExitCode != 7 || !stop.State.ExitedAt.Equal(want.StartedAt.Add(time.Hour)) {
		t.Fatalf("Stop = %+v, %v", stop, err)
	}
	// ErrNotFound survives the wire.
	if _, err := d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: "wl_a"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Inspect of a stopped workload err = %v, want ErrNotFound", err)
	}
	if _, err := d.Stop(ctx, &runtime.StopRequest{WorkloadID: "wl_a"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Stop of an unknown workload err = %v, want ErrNotFound", err)
	}
}

func TestCallsFailWhenPluginExits(t *testing.T) {
	d, client := launch(t)
	client.Kill()
	done := d.(*runtime.GRPCClient).Done()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the plugin exited")
	}
	if _, err := d.List(context.Background()); err == nil {
		t.Fatal("List on an exited plugin succeeded")
	}
}
