package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	runtimev1 "github.com/berthhq/berth/abi/proto/runtime/v1"
	"github.com/berthhq/berth/abi/runtime"
)

// Marker is what the default conformance workload prints first.
const Marker = "berth-conformance-ready"

// RuntimeConfig says which runtime driver to check. Exactly one of Binary
// and Factory is set.
type RuntimeConfig struct {
	// Binary is a built driver. Each case launches it afresh over go-plugin
	// (subprocess mode), with a fresh state directory.
	Binary string
	// Args returns the binary's arguments for a case's state directory;
	// nil means none.
	Args func(stateDir string) []string
	// Factory returns a fresh in-process driver on stateDir, served over a
	// real gRPC connection and closed at the end of the case when it has a
	// Close method. Cases that need a process are skipped.
	Factory func(stateDir string) (runtime.Driver, error)
	// Command is the workload: it must print Marker on stdout and then run
	// until stopped. nil means /bin/sh printing Marker and sleeping.
	Command []string
	// Env is the workload's environment; nil means PATH only.
	Env map[string]string
	// Stderr receives the plugin's stderr in subprocess mode; nil discards it.
	Stderr io.Writer
	// Prepare, when set, adjusts every StartRequest the suite sends, e.g.
	// to name the image a container driver runs Command in.
	Prepare func(req *runtime.StartRequest)
	// RequireCapabilities names capabilities (of [RuntimeCapabilities])
	// whose cases must run: a case skipped because the driver does not
	// advertise one of them fails instead. The CLI's --require-capability.
	RequireCapabilities []string
}

func (c RuntimeConfig) prepare(req *runtime.StartRequest) *runtime.StartRequest {
	if c.Prepare != nil {
		c.Prepare(req)
	}
	return req
}

func (c RuntimeConfig) validate() error {
	if (c.Binary == "") == (c.Factory == nil) {
		return errors.New("conformance: set exactly one of Binary and Factory")
	}
	return checkRequired("runtime", c.RequireCapabilities, RuntimeCapabilities)
}

func (c RuntimeConfig) command() []string {
	if len(c.Command) > 0 {
		return c.Command
	}
	return []string{"/bin/sh", "-c", "echo " + Marker + "; exec sleep 300"}
}

func (c RuntimeConfig) env() map[string]string {
	if c.Env != nil {
		return c.Env
	}
	return map[string]string{"PATH": os.Getenv("PATH")}
}

var runtimeKind = kind{
	cookie:  pluginapi.RuntimeCookieValue,
	name:    pluginapi.RuntimePluginName,
	version: runtime.APIVersion,
	newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
		return runtime.NewClient(life, conn)
	},
	register: func(s *grpc.Server, impl any) {
		runtimev1.RegisterRuntimeDriverServer(s, runtime.NewServer(impl.(runtime.Driver)))
	},
}

// RunRuntimeDriver runs the runtime-driver suite as subtests of t.
func RunRuntimeDriver(t *testing.T, cfg RuntimeConfig) {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	runTesting(t, cfg.cases())
}

// CheckRuntimeDriver runs the runtime-driver suite outside `go test` and
// returns the report; the error is for an invalid cfg only.
func CheckRuntimeDriver(ctx context.Context, cfg RuntimeConfig) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return runReport(ctx, "runtime", cfg.Binary, cfg.cases()), nil
}

// cases are the suite's cases for cfg: on a binary, the launch case first
// (docs/plugins.md section 6).
func (cfg RuntimeConfig) cases() []testCase {
	if cfg.Binary == "" {
		return runtimeCases(cfg)
	}
	return gated(func(t T) error {
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(t.TempDir())
		}
		return probe(t, cfg.Binary, args, runtimeKind, cfg.Stderr)
	}, runtimeCases(cfg))
}

// RuntimeCaseNames lists the runtime-driver suite's cases in order.
func RuntimeCaseNames() []string {
	var out []string
	for _, c := range runtimeCases(RuntimeConfig{}) {
		out = append(out, c.name)
	}
	return out
}

type rtSession struct {
	cfg  RuntimeConfig
	in   *instance
	d    *runtime.Client
	desc *runtime.DescribeResponse
	next int
}

func (cfg RuntimeConfig) launch(t T, stateDir string) *rtSession {
	t.Helper()
	var in *instance
	var err error
	if cfg.Factory != nil {
		var impl runtime.Driver
		if impl, err = cfg.Factory(stateDir); err != nil {
			t.Fatalf("factory: %v", err)
		}
		if c, ok := impl.(interface{ Close() error }); ok {
			t.Cleanup(func() { _ = c.Close() })
		}
		in, err = startInProcess(t, impl, runtimeKind)
	} else {
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(stateDir)
		}
		in, err = startBinary(t, cfg.Binary, args, runtimeKind, runtimeKind.cookie, cfg.Stderr)
	}
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	s := &rtSession{cfg: cfg, in: in, d: in.raw.(*runtime.Client)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if s.desc, err = s.d.Describe(ctx); err != nil {
		t.Fatalf("%s", failure("Describe after launch", "a description", gotErr(err)))
	}
	return s
}

func (s *rtSession) ctx(t T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callBudget)
	t.Cleanup(cancel)
	return ctx
}

func (s *rtSession) key(p string) string {
	s.next++
	return fmt.Sprintf("conformance-%s-%d", p, s.next)
}

// start starts a workload and registers its cleanup.
func (s *rtSession) start(t T, id string, token uint64) *runtime.WorkloadState {
	t.Helper()
	work := t.TempDir()
	r, err := s.d.Start(s.ctx(t), s.cfg.prepare(&runtime.StartRequest{
		WorkloadID: id, Command: s.cfg.command(), Env: s.cfg.env(), WorkDir: work,
		LogPath:  filepath.Join(work, "out.log"),
		Mutation: pluginapi.Mutation{IdempotencyKey: s.key("start"), FencingToken: token},
	}))
	if err != nil {
		t.Fatalf("%s", failure(fmt.Sprintf("Start %s (fencing token %d)", id, token), "a running workload", gotErr(err)))
	}
	if r.State == nil {
		t.Fatalf("%s", failure("Start "+id, "a state", "none"))
	}
	s.cleanupWorkload(t, id, r.State.PID)
	return r.State
}

// cleanupWorkload makes sure the workload is gone when t ends: a forced Stop
// through the driver (a container outlives the kill of its process), then
// SIGKILL to the process group of pid.
func (s *rtSession) cleanupWorkload(t T, id string, pid int) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = s.d.Stop(ctx, &runtime.StopRequest{WorkloadID: id, Mode: runtime.StopForced,
			Mutation: pluginapi.Mutation{IdempotencyKey: s.key("cleanup"), FencingToken: math.MaxUint32}})
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
}

func (s *rtSession) stop(t T, id string, mode runtime.StopMode, token uint64) (*runtime.WorkloadState, error) {
	r, err := s.d.Stop(s.ctx(t), &runtime.StopRequest{WorkloadID: id, Mode: mode, Timeout: 5 * time.Second,
		Mutation: pluginapi.Mutation{IdempotencyKey: s.key("stop"), FencingToken: token}})
	if err != nil {
		return nil, err
	}
	return r.State, nil
}

func showState(s *runtime.WorkloadState) string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s %s pid=%d exit=%d", s.WorkloadID, s.State, s.PID, s.ExitCode)
}

func runtimeCases(cfg RuntimeConfig) []testCase {
	needProcess := func(t T) {
		if cfg.Factory != nil {
			t.Skipf("needs a plugin process; run the suite on the binary")
		}
	}
	return []testCase{
		{"handshake", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir())
			if s.in.negotiated != runtime.APIVersion {
				t.Errorf("%s", failure("the go-plugin handshake", fmt.Sprintf("API version %d negotiated", runtime.APIVersion), fmt.Sprintf("version %d", s.in.negotiated)))
			}
			if _, err := startBinary(t, cfg.Binary, nil, runtimeKind, pluginapi.ProviderCookieValue, nil); err == nil {
				t.Errorf("%s", failure("a handshake with the providers' cookie", "the driver refuses another kind's cookie", "the handshake completed"))
			}
		}},
		{"describe", func(t T) {
			s := cfg.launch(t, t.TempDir())
			d := s.desc
			if !dnsLabel.MatchString(d.Name) {
				t.Errorf("%s", failure("Describe", "a name that is a DNS label", fmt.Sprintf("name %q", d.Name)))
			}
			if d.Version == "" {
				t.Errorf("%s", failure("Describe", "a version", "none"))
			}
			if !slices.Contains(d.APIVersions, s.in.negotiated) {
				t.Errorf("%s", failure("Describe", fmt.Sprintf("API versions listing the negotiated %d", s.in.negotiated), fmt.Sprintf("%v", d.APIVersions)))
			}
			if len(d.Capabilities.IsolationModes) == 0 {
				t.Errorf("%s", failure("Describe", "at least one isolation mode", "none"))
			}
			if lim := d.Capabilities.ResourceLimits; lim != "" && lim != runtime.LimitsCgroup2 && lim != runtime.LimitsCgroup1 && lim != runtime.LimitsContainer &&
				(!strings.HasPrefix(lim, "none: ") || len(lim) == len("none: ")) {
				t.Errorf("%s", failure("Describe", `resource_limits empty, "cgroup2", "cgroup1", "container" or "none: <why>"`, fmt.Sprintf("%q", lim)))
			}
		}},
		{"health", func(t T) { checkHealth(t, cfg.launch(t, t.TempDir()).d) }},
		{"start_inspect_list", func(t T) {
			s := cfg.launch(t, t.TempDir())
			st := s.start(t, "wl_conf_a", 1)
			if st.WorkloadID != "wl_conf_a" || st.State != runtime.StateRunning || st.Handle.IsZero() {
				t.Errorf("Start state = %s handle=%+v; want running with a handle", showState(st), st.Handle)
			}
			in, err := s.d.Inspect(s.ctx(t), &runtime.InspectRequest{WorkloadID: "wl_conf_a"})
			if err != nil || in.WorkloadID != "wl_conf_a" || in.State != runtime.StateRunning {
				t.Errorf("Inspect = %s, %v; want running", showState(in), err)
			}
			list, err := s.d.List(s.ctx(t))
			if err != nil {
				t.Fatalf("%s", failure("List", "the workloads", gotErr(err)))
			}
			if !slices.ContainsFunc(list, func(w *runtime.WorkloadState) bool { return w.WorkloadID == "wl_conf_a" }) {
				t.Errorf("%s", failure("List after Start", "the started workload among them", "not listed"))
			}
			if _, err := s.d.Inspect(s.ctx(t), &runtime.InspectRequest{WorkloadID: "wl_conf_unknown"}); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("%s", failure("Inspect a workload never started", "an error of code not_found", gotErr(err)))
			}
		}},
		{"start_idempotent", func(t T) {
			s := cfg.launch(t, t.TempDir())
			work := t.TempDir()
			req := cfg.prepare(&runtime.StartRequest{WorkloadID: "wl_conf_b", Command: cfg.command(), Env: cfg.env(), WorkDir: work,
				LogPath: filepath.Join(work, "out.log"), Mutation: pluginapi.Mutation{IdempotencyKey: "conformance-start-b", FencingToken: 1}})
			r1, err := s.d.Start(s.ctx(t), req)
			if err != nil {
				t.Fatalf("%s", failure("Start", "a running workload", gotErr(err)))
			}
			s.cleanupWorkload(t, "wl_conf_b", r1.State.PID)
			r2, err := s.d.Start(s.ctx(t), req)
			if err != nil {
				t.Fatalf("%s", failure("Start again with the same idempotency key", "the recorded result", gotErr(err)))
			}
			if r2.State.PID != r1.State.PID || r2.State.StartedAt != r1.State.StartedAt {
				t.Errorf("repeated Start returned another workload:\n first  %s\n repeat %s", showState(r1.State), showState(r2.State))
			}
			req.IdempotencyKey = "conformance-start-b2"
			r3, err := s.d.Start(s.ctx(t), req)
			if err != nil || r3.State.PID != r1.State.PID {
				t.Errorf("Start of a running workload with a new key = %s, %v; want the running one", showState(r3.State), err)
			}
		}},
		{"stale_fencing_token", func(t T) {
			s := cfg.launch(t, t.TempDir())
			s.start(t, "wl_conf_c", 10)
			_, err := s.stop(t, "wl_conf_c", runtime.StopForced, 5)
			if err == nil {
				t.Errorf("%s", failure("Stop with fencing token 5 after 10", "a refusal of code stale_fencing_token", "success"))
			} else if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Stop with fencing token 5 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			in, err := s.d.Inspect(s.ctx(t), &runtime.InspectRequest{WorkloadID: "wl_conf_c"})
			if err != nil || in.State != runtime.StateRunning {
				t.Errorf("after a refused Stop, Inspect = %s, %v; want running", showState(in), err)
			}
		}},
		{"stop_then_gone", func(t T) {
			s := cfg.launch(t, t.TempDir())
			s.start(t, "wl_conf_d", 1)
			st, err := s.stop(t, "wl_conf_d", runtime.StopGraceful, 1)
			if err != nil {
				t.Fatalf("%s", failure("Stop, graceful", "an exited workload", gotErr(err)))
			}
			if st == nil || st.State != runtime.StateExited {
				t.Errorf("Stop returned %s; want exited", showState(st))
			}
			if _, err := s.d.Inspect(s.ctx(t), &runtime.InspectRequest{WorkloadID: "wl_conf_d"}); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("%s", failure("Inspect after Stop", "an error of code not_found", gotErr(err)))
			}
			if _, err := s.stop(t, "wl_conf_d", runtime.StopGraceful, 1); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("%s", failure("Stop a stopped workload", "an error of code not_found", gotErr(err)))
			}
			s.start(t, "wl_conf_e", 1)
			if st, err := s.stop(t, "wl_conf_e", runtime.StopForced, 1); err != nil || st == nil || st.State != runtime.StateExited {
				t.Errorf("forced Stop = %s, %v; want exited", showState(st), err)
			}
		}},
		{"recover", func(t T) {
			s := cfg.launch(t, t.TempDir())
			st := s.start(t, "wl_conf_f", 1)
			got, err := s.d.Recover(s.ctx(t), &runtime.RecoverRequest{WorkloadID: "wl_conf_f", Handle: st.Handle})
			if err != nil || got.State != runtime.StateRunning || got.PID != st.PID {
				t.Errorf("Recover of a running workload = %s, %v; want %s", showState(got), err, showState(st))
			}
			_, err = s.d.Recover(s.ctx(t), &runtime.RecoverRequest{WorkloadID: "wl_conf_unknown", Handle: runtime.Handle{Version: 1 << 20, Data: []byte("?")}})
			if err == nil {
				t.Errorf("%s", failure("Recover with a handle of an unknown version", "a refusal", "success"))
			}
		}},
		{"deadline", func(t T) {
			s := cfg.launch(t, t.TempDir())
			checkDeadline(t, func(ctx context.Context) error {
				_, err := s.d.List(ctx)
				return err
			})
		}},
		{"crash_mid_call", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir())
			checkCrash(t, s.in, s.d, func(ctx context.Context) error {
				_, err := s.d.List(ctx)
				return err
			})
		}},
		{"outlives_driver", func(t T) {
			needProcess(t)
			dir := t.TempDir()
			s := cfg.launch(t, dir)
			needCapability(t, cfg.RequireCapabilities, "outlives_driver", s.desc.Capabilities.OutlivesDriver)
			st := s.start(t, "wl_conf_g", 1)
			if err := s.in.crash(); err != nil {
				t.Fatalf("kill the driver: %v", err)
			}
			<-s.d.Done()
			s2 := cfg.launch(t, t.TempDir()) // a fresh state directory: only the handle is left
			got, err := s2.d.Recover(s2.ctx(t), &runtime.RecoverRequest{WorkloadID: "wl_conf_g", Handle: st.Handle})
			if err != nil || got.State != runtime.StateRunning || got.PID != st.PID {
				t.Fatalf("Recover after the driver's crash = %s, %v; want %s running", showState(got), err, showState(st))
			}
			if got, err := s2.stop(t, "wl_conf_g", runtime.StopForced, 1); err != nil || got.State != runtime.StateExited {
				t.Errorf("Stop of the recovered workload = %s, %v", showState(got), err)
			}
		}},
		{"restart_recover", func(t T) {
			// The host stops the driver (its own restart) and launches it again
			// on the same state directory, then gives it every stored handle.
			dir := t.TempDir()
			s := cfg.launch(t, dir)
			ids := []string{"wl_conf_j1", "wl_conf_j2", "wl_conf_j3"}
			started := make([]*runtime.WorkloadState, len(ids))
			for i, id := range ids {
				started[i] = s.start(t, id, 1)
			}
			s.in.shutdown()
			s2 := cfg.launch(t, dir)
			for i, id := range ids {
				s2.cleanupWorkload(t, id, started[i].PID)
			}
			if s.desc.Capabilities.OutlivesDriver {
				checkRecoversAll(t, s2, ids, started)
			} else {
				checkEndedWithDriver(t, s2, ids, started)
			}
		}},
		{"logs", func(t T) {
			s := cfg.launch(t, t.TempDir())
			needCapability(t, cfg.RequireCapabilities, "logs", s.desc.Capabilities.Logs)
			s.start(t, "wl_conf_h", 1)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			w := &markerWriter{want: []byte(Marker), found: cancel}
			if err := s.d.Logs(ctx, &runtime.LogsRequest{WorkloadID: "wl_conf_h", Follow: true}, w); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s", failure("Logs of the workload", "its output", gotErr(err)))
			}
			if !w.ok() {
				t.Errorf("Logs did not carry the workload's output %q within 10 s (got %q)", Marker, w.String())
			}
		}},
		{"stats", func(t T) {
			s := cfg.launch(t, t.TempDir())
			needCapability(t, cfg.RequireCapabilities, "stats", s.desc.Capabilities.Stats)
			s.start(t, "wl_conf_i", 1)
			// A process that was just started may not have run yet (its resident set is
			// still empty on a loaded machine): ask again until it has, for at most 10 s.
			deadline := time.Now().Add(10 * time.Second)
			for {
				st, err := s.d.Stats(s.ctx(t), &runtime.StatsRequest{WorkloadID: "wl_conf_i"})
				if err != nil {
					t.Fatalf("%s", failure("Stats of the workload", "its statistics", gotErr(err)))
				}
				if !st.At.IsZero() && st.MemoryBytes > 0 && st.CPUSeconds >= 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("Stats = %+v for 10 s; want a time, memory > 0 and CPU >= 0", st)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}},
	}
}

// checkRecoversAll checks that a driver declaring outlives_driver, launched
// again after the host stopped it, recovers each workload started before
// from its handle, running as it was, and lists each exactly once.
func checkRecoversAll(t T, s *rtSession, ids []string, started []*runtime.WorkloadState) {
	t.Helper()
	for i, id := range ids {
		got, err := s.d.Recover(s.ctx(t), &runtime.RecoverRequest{WorkloadID: id, Handle: started[i].Handle})
		if err != nil || got.State != runtime.StateRunning || got.PID != started[i].PID {
			t.Errorf("%s", failure("Recover "+id+" after the host stopped and relaunched the driver",
				showState(started[i])+" running", fmt.Sprintf("%s, %s", showState(got), gotErr(err))))
		}
	}
	list, err := s.d.List(s.ctx(t))
	if err != nil {
		t.Fatalf("%s", failure("List after Recover", "the workloads", gotErr(err)))
	}
	for _, id := range ids {
		n := 0
		for _, w := range list {
			if w != nil && w.WorkloadID == id && w.State == runtime.StateRunning {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s", failure("List after Recover", id+" running, listed once", fmt.Sprintf("listed running %d times", n)))
		}
	}
}

// checkEndedWithDriver checks that a driver declaring outlives_driver false
// ended its workloads when the host stopped it: each workload's process is
// gone (within 10 s), and the relaunched driver neither recovers nor lists
// any of them as running.
func checkEndedWithDriver(t T, s *rtSession, ids []string, started []*runtime.WorkloadState) {
	t.Helper()
	for i, id := range ids {
		pid := started[i].PID
		if pid <= 0 {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for !processGone(pid) {
			if time.Now().After(deadline) {
				t.Errorf("%s", failure("stopping a driver that declares outlives_driver false",
					"its workloads end with it", fmt.Sprintf("%s still runs (pid %d) 10 s later", id, pid)))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i, id := range ids {
		got, err := s.d.Recover(s.ctx(t), &runtime.RecoverRequest{WorkloadID: id, Handle: started[i].Handle})
		if err == nil && got != nil && got.State == runtime.StateRunning {
			t.Errorf("%s", failure("Recover "+id+" after the host stopped and relaunched the driver (outlives_driver false)",
				"not_found or an exited workload", showState(got)))
		}
	}
	list, err := s.d.List(s.ctx(t))
	if err != nil {
		t.Fatalf("%s", failure("List after relaunch", "the workloads", gotErr(err)))
	}
	for _, w := range list {
		if w != nil && slices.Contains(ids, w.WorkloadID) && w.State == runtime.StateRunning {
			t.Errorf("%s", failure("List after relaunch (outlives_driver false)", "no workload of the stopped driver running", showState(w)))
		}
	}
}

// processGone reports whether pid no longer runs: no such process, or a
// zombie nobody reaped yet.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command name in parentheses, which may hold any byte.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// markerWriter collects output and calls found once it holds want.
type markerWriter struct {
	want  []byte
	found func()

	mu  sync.Mutex
	buf bytes.Buffer
	hit bool
}

func (w *markerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.hit && bytes.Contains(w.buf.Bytes(), w.want) {
		w.hit = true
		w.found()
	}
	return len(p), nil
}

func (w *markerWriter) ok() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hit
}

func (w *markerWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(w.buf.String())
}
