// Package containerd is the "containerd" runtime driver: it runs each workload
// as an OCI container through a containerd daemon, in its own containerd namespace.
//
// State lives in containerd, not in the driver: a workload is the container
// whose id is the workload id, in Config.Namespace (default "berth"), labelled
// with LabelWorkload. Its task is run by a containerd shim, so it keeps running
// when the driver or the agent exits, and a new driver finds it again by id
// (List, Inspect) or from its handle (Recover). The only files the driver keeps
// are the fencing and idempotency records of sdk/guard under Config.StateDir.
//
// Images are pinned by digest: StartRequest.Image is "host/repo@sha256:<hex>"
// (pulled from that registry, with the StartRequest.RegistryCredentials entry
// of its host, if any) or "sha256:<hex>" naming a manifest or index of
// the OCI image layout tar at StartRequest.ImageArchive (imported). Both are
// kept in containerd's content store under the digest and unpacked into the
// snapshotter once; later starts reuse them.
//
// The driver refuses Docker's containerd: a socket at one of Docker's paths,
// one that is the same file as those, or a daemon that holds Docker's "moby"
// namespace. See docs/plugins.md section 3, "The containerd driver".
package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	ctd "github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/runtime"
)

// Defaults applied when a Config or request field is zero.
const (
	DefaultAddress     = "/run/containerd/containerd.sock"
	DefaultNamespace   = "berth"
	DefaultRuntime     = "io.containerd.runc.v2"
	DefaultLogMaxBytes = 1 << 20          // bytes, StartRequest.LogMaxBytes
	DefaultStopTimeout = 10 * time.Second // StopRequest.Timeout
)

// Container labels the driver sets on every workload container.
const (
	LabelWorkload    = "berth.workload"      // the workload id
	LabelLogPath     = "berth.log-path"      // StartRequest.LogPath
	LabelLogMaxBytes = "berth.log-max-bytes" // decimal bytes
	LabelStartedAt   = "berth.started-at"    // RFC 3339 with nanoseconds, UTC
	LabelImage       = "berth.image"         // StartRequest.Image
	LabelLogDir      = "berth.log-dir"       // the log writer's directory; absent when output goes to LabelLogPath
)

const (
	killWait        = 5 * time.Second  // how long Stop waits after SIGKILL before failing
	cpuPeriod       = 100_000          // CFS period, microseconds
	idempotencyKept = 24 * time.Hour   // idempotency records older than this are pruned at start
	dialTimeout     = 10 * time.Second // how long New waits for the daemon
)

// dockerSockets are the paths of Docker's own containerd sockets.
var dockerSockets = []string{
	"/run/docker/containerd/containerd.sock",
	"/var/run/docker/containerd/containerd.sock",
}

// dockerNamespace is the containerd namespace Docker's engine uses.
const dockerNamespace = "moby"

// ErrInvalidRequest is returned (wrapped) by Start for a request it cannot
// run: an isolation mode other than "container", an unsafe workload id, no
// image, an image not pinned by digest, or a missing log path. It carries code
// validation_failed, so errors.Is holds across the wire.
var ErrInvalidRequest = abierrors.New(abierrors.ValidationFailed, "invalid container workload request")

// ErrDockerSocket is returned (wrapped) by New when Config.Address is Docker's
// containerd: Berth never shares a daemon with Docker.
var ErrDockerSocket = errors.New("containerd driver: refusing Docker's containerd; run a containerd for Berth on its own socket")

// Config configures a Driver. The zero value, with StateDir set, runs against
// the node's containerd at DefaultAddress.
type Config struct {
	// Address is the containerd socket; empty means DefaultAddress.
	Address string
	// Namespace is the containerd namespace of Berth's workloads; empty
	// means DefaultNamespace. "moby" is refused.
	Namespace string
	// StateDir holds the fencing and idempotency records (created 0700 if
	// missing). Required.
	StateDir string
	// Snapshotter names the containerd snapshotter; empty means the
	// daemon's default (overlayfs).
	Snapshotter string
	// Runtime names the containerd runtime; empty means DefaultRuntime.
	Runtime string
	// PlainHTTPRegistries lists registry hosts ("host:port") pulled over
	// plain HTTP. Loopback hosts always are; nil means none other.
	PlainHTTPRegistries []string
	// Logger receives the driver's own logs; nil discards them.
	Logger *slog.Logger
	// LogWriter is the absolute path of a binary that runs the log writer
	// when containerd's shim starts it as a binary logger (a driver binary
	// whose main runs logwriter.Main when logwriter.StartedByShim): each
	// workload's output is then stamped into segments in the directory
	// logseg.DirOf(LogPath) (docs/logs.md section 4). Empty: the shim appends
	// stdout and stderr to StartRequest.LogPath, trimmed to its limit.
	LogWriter string
}

// Driver is the containerd runtime driver. It implements runtime.Driver,
// runtime.LogStreamer and runtime.StatsReporter and is safe for concurrent
// use. Close releases its connection; workloads keep running.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	client *ctd.Client
	guards *guard.Guards

	imageMu sync.Mutex // serialises image import and pull
	stopBg  context.CancelFunc
	bg      sync.WaitGroup // the log trimmer

	// mu serialises Start and Stop (they create and delete containers): a
	// graceful Stop holds it for up to its timeout.
	mu     sync.Mutex
	closed bool // mu must be held
}

var (
	_ runtime.Driver        = (*Driver)(nil)
	_ runtime.LogStreamer   = (*Driver)(nil)
	_ runtime.StatsReporter = (*Driver)(nil)
)

// New connects to the containerd at cfg.Address and returns a driver. It
// returns an error wrapping ErrDockerSocket for Docker's containerd, and an
// error when StateDir is empty or the daemon does not answer within 10 s.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("containerd driver: StateDir is required")
	}
	if cfg.Address == "" {
		cfg.Address = DefaultAddress
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.Namespace == dockerNamespace {
		return nil, fmt.Errorf("namespace %q: %w", cfg.Namespace, ErrDockerSocket)
	}
	if err := identifiers.Validate(cfg.Namespace); err != nil {
		return nil, fmt.Errorf("containerd driver: namespace: %w", err)
	}
	if isDockerSocket(cfg.Address) {
		return nil, fmt.Errorf("%s: %w", cfg.Address, ErrDockerSocket)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("containerd driver: create state directory: %w", err)
	}
	guards, err := guard.Open(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("containerd driver: %w", err)
	}
	if _, err := guards.Idempotency.Prune(time.Now().Add(-idempotencyKept)); err != nil {
		log.Warn("could not prune idempotency records", "error", err)
	}
	client, err := ctd.New(cfg.Address, ctd.WithDefaultNamespace(cfg.Namespace), ctd.WithTimeout(dialTimeout))
	if err != nil {
		return nil, fmt.Errorf("containerd driver: connect to %s: %w", cfg.Address, err)
	}
	nss, err := client.NamespaceService().List(ctx)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("containerd driver: list namespaces of %s: %w", cfg.Address, err)
	}
	for _, ns := range nss {
		if ns == dockerNamespace {
			_ = client.Close()
			return nil, fmt.Errorf("%s holds namespace %q: %w", cfg.Address, dockerNamespace, ErrDockerSocket)
		}
	}
	d := &Driver{cfg: cfg, log: log, client: client, guards: guards}
	life, stop := context.WithCancel(namespaces.WithNamespace(context.Background(), cfg.Namespace))
	d.stopBg = stop
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		d.trimLogs(life)
	}()
	return d, nil
}

// isDockerSocket reports whether addr is one of Docker's containerd sockets,
// by path or by file identity.
func isDockerSocket(addr string) bool {
	clean := filepath.Clean(addr)
	if real, err := filepath.EvalSymlinks(clean); err == nil {
		clean = real
	}
	fi, statErr := os.Stat(clean)
	for _, p := range dockerSockets {
		if clean == p {
			return true
		}
		if statErr == nil {
			if dfi, err := os.Stat(p); err == nil && os.SameFile(fi, dfi) {
				return true
			}
		}
	}
	return false
}

// Close closes the connection to containerd. Workloads keep running; a new
// driver on the same namespace finds them. Calls after Close fail. Idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.stopBg()
	d.bg.Wait()
	return d.client.Close()
}

// errClosed is returned by calls on a closed Driver.
var errClosed = errors.New("containerd driver: closed")

// Describe implements runtime.Driver.
func (d *Driver) Describe(context.Context) (*runtime.DescribeResponse, error) {
	return &runtime.DescribeResponse{
		Name:        "containerd",
		Version:     version.Version,
		APIVersions: []int{runtime.APIVersion},
		Capabilities: runtime.Capabilities{
			OutlivesDriver: true,
			IsolationModes: []string{"container"},
			Logs:           true,
			Stats:          true,
			ResourceLimits: runtime.LimitsContainer,
		},
	}, nil
}

// validID is what both the agent's workload ids and containerd's identifiers
// allow; maxIDLen is containerd's limit on an identifier's length.
var validID = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

const maxIDLen = 76

// Start implements runtime.Driver: it makes the image ready (pull or import,
// then unpack), creates the container with the request's command, env,
// working directory, user, limits and network namespace, and starts its task
// with stdout and stderr appended to LogPath by the shim. A running workload
// with the same id is returned as it is; an exited one is deleted and created
// anew. Errors wrap ErrInvalidRequest for a request that cannot run.
func (d *Driver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if req == nil {
		return nil, fmt.Errorf("start workload: no request: %w", ErrInvalidRequest)
	}
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StartResponse, error) {
		return d.start(ctx, req)
	})
}

func (d *Driver) start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if req.Isolation != "" && req.Isolation != "container" {
		return nil, fmt.Errorf("start workload %s: isolation %q: the containerd driver offers only \"container\": %w", req.WorkloadID, req.Isolation, ErrInvalidRequest)
	}
	if !validID.MatchString(req.WorkloadID) || len(req.WorkloadID) > maxIDLen {
		return nil, fmt.Errorf("start workload: bad workload id %q: %w", req.WorkloadID, ErrInvalidRequest)
	}
	id := req.WorkloadID
	if req.Image == "" {
		return nil, fmt.Errorf("start workload %s: no image: %w", id, ErrInvalidRequest)
	}
	if req.LogPath == "" || !filepath.IsAbs(req.LogPath) {
		return nil, fmt.Errorf("start workload %s: log path %q is not absolute: %w", id, req.LogPath, ErrInvalidRequest)
	}
	if req.MemoryBytes < 0 || req.CPUMillis < 0 {
		return nil, fmt.Errorf("start workload %s: negative limit: %w", id, ErrInvalidRequest)
	}
	maxBytes := req.LogMaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultLogMaxBytes
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("start workload %s: %w", id, errClosed)
	}
	if c, err := d.client.LoadContainer(ctx, id); err == nil {
		if labels, err := c.Labels(ctx); err != nil || labels[LabelWorkload] != id {
			return nil, fmt.Errorf("start workload %s: a container of that id exists in namespace %s and is not this workload's: %w", id, d.cfg.Namespace, ErrInvalidRequest)
		}
		st, err := d.state(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
		if st.State == runtime.StateRunning {
			return &runtime.StartResponse{State: st}, nil
		}
		if _, err := d.remove(ctx, c); err != nil {
			return nil, fmt.Errorf("start workload %s: clear the exited run: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("start workload %s: load container: %w", id, err)
	}

	img, err := d.ensureImage(ctx, req.Image, req.ImageArchive, req.RegistryCredentials)
	if err != nil {
		return nil, fmt.Errorf("start workload %s: %w", id, err)
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithHostResolvconf, oci.WithHostHostsFile}
	if len(req.Command) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(req.Command...))
	}
	if len(req.Env) > 0 {
		specOpts = append(specOpts, oci.WithEnv(envList(req.Env)))
	}
	if req.Cwd != "" {
		specOpts = append(specOpts, oci.WithProcessCwd(req.Cwd))
	}
	if req.User != "" {
		specOpts = append(specOpts, oci.WithUser(req.User))
	}
	if req.MemoryBytes > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(req.MemoryBytes)))
	}
	if req.CPUMillis > 0 {
		specOpts = append(specOpts, oci.WithCPUCFS(req.CPUMillis*cpuPeriod/1000, cpuPeriod))
	}
	if req.NetworkNamespace != "" {
		specOpts = append(specOpts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: req.NetworkNamespace}))
	} else {
		specOpts = append(specOpts, oci.WithHostNamespace(specs.NetworkNamespace))
	}
	startedAt := time.Now().UTC()
	labels := map[string]string{
		LabelWorkload:    id,
		LabelLogPath:     req.LogPath,
		LabelLogMaxBytes: strconv.FormatInt(maxBytes, 10),
		LabelStartedAt:   startedAt.Format(time.RFC3339Nano),
		LabelImage:       req.Image,
	}
	if d.cfg.LogWriter != "" {
		labels[LabelLogDir] = logseg.DirOf(req.LogPath)
	}
	c, err := d.client.NewContainer(ctx, id,
		ctd.WithImage(img),
		ctd.WithSnapshotter(d.cfg.Snapshotter),
		ctd.WithNewSnapshot(id, img),
		ctd.WithRuntime(d.cfg.Runtime, nil),
		ctd.WithContainerLabels(labels),
		ctd.WithNewSpec(specOpts...),
	)
	if err != nil {
		return nil, fmt.Errorf("start workload %s: create container: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Dir(req.LogPath), 0o750); err != nil {
		d.cleanup(c)
		return nil, fmt.Errorf("start workload %s: create log directory: %w", id, err)
	}
	output := cio.LogFile(req.LogPath)
	if d.cfg.LogWriter != "" {
		// The shim starts the log writer with stdout and stderr as fds 3 and 4
		// and waits for it to close fd 5; the writer outlives this driver and
		// the agent as the container does.
		if err := os.MkdirAll(labels[LabelLogDir], 0o750); err != nil {
			d.cleanup(c)
			return nil, fmt.Errorf("start workload %s: create log directory: %w", id, err)
		}
		output = cio.BinaryIO(d.cfg.LogWriter, map[string]string{"--dir": labels[LabelLogDir], "--ready-fd": "5"})
	}
	task, err := c.NewTask(ctx, output)
	if err != nil {
		d.cleanup(c)
		return nil, fmt.Errorf("start workload %s: create task: %w", id, err)
	}
	if err := task.Start(ctx); err != nil {
		d.cleanup(c)
		return nil, fmt.Errorf("start workload %s: start task: %w", id, err)
	}
	st, err := d.state(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("start workload %s: %w", id, err)
	}
	d.log.Info("started workload", "workload", id, "pid", st.PID, "image", req.Image)
	return &runtime.StartResponse{State: st}, nil
}

// cleanup deletes a container whose start failed, with a context of its own
// so that a cancelled start leaves nothing behind.
func (d *Driver) cleanup(c ctd.Container) {
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), d.cfg.Namespace), killWait*2)
	defer cancel()
	if _, err := d.remove(ctx, c); err != nil {
		d.log.Warn("could not remove the container of a failed start", "workload", c.ID(), "error", err)
	}
}

// remove kills and deletes c's task (if any), then c and its snapshot, and
// returns the task's exit code (-1 when there was no task).
func (d *Driver) remove(ctx context.Context, c ctd.Container) (int, error) {
	code := -1
	task, err := c.Task(ctx, nil)
	switch {
	case err == nil:
		es, err := task.Delete(ctx, ctd.WithProcessKill)
		if err != nil && !errdefs.IsNotFound(err) {
			return code, fmt.Errorf("delete task: %w", err)
		}
		if es != nil {
			code = int(es.ExitCode())
		}
	case !errdefs.IsNotFound(err):
		return code, fmt.Errorf("load task: %w", err)
	}
	if err := c.Delete(ctx, ctd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return code, fmt.Errorf("delete container: %w", err)
	}
	return code, nil
}

// state reports c's workload state from containerd.
func (d *Driver) state(ctx context.Context, c ctd.Container) (*runtime.WorkloadState, error) {
	labels, err := c.Labels(ctx)
	if err != nil {
		return nil, fmt.Errorf("read labels of %s: %w", c.ID(), err)
	}
	st := &runtime.WorkloadState{WorkloadID: c.ID(), State: runtime.StateExited, ExitCode: -1}
	if t, err := time.Parse(time.RFC3339Nano, labels[LabelStartedAt]); err == nil {
		st.StartedAt = t
	}
	st.Handle = encodeHandle(handleV1{Namespace: d.cfg.Namespace, ContainerID: c.ID(), LogPath: labels[LabelLogPath]})
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load task of %s: %w", c.ID(), err)
	}
	st.PID = int(task.Pid())
	status, err := task.Status(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return st, nil
		}
		return nil, fmt.Errorf("task status of %s: %w", c.ID(), err)
	}
	switch status.Status {
	case ctd.Running, ctd.Paused, ctd.Pausing:
		st.State = runtime.StateRunning
	case ctd.Stopped:
		st.ExitCode = int(status.ExitStatus)
		st.ExitedAt = status.ExitTime.UTC()
	}
	return st, nil
}

// Inspect implements runtime.Driver. It returns an error wrapping
// runtime.ErrNotFound for an unknown (or stopped and forgotten) workload.
func (d *Driver) Inspect(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, errClosed)
	}
	c, err := d.load(ctx, req.WorkloadID)
	if err != nil {
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, err)
	}
	st, err := d.state(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, err)
	}
	return st, nil
}

// load returns the workload container id, or an error wrapping
// runtime.ErrNotFound when containerd has no such container of ours.
func (d *Driver) load(ctx context.Context, id string) (ctd.Container, error) {
	if !validID.MatchString(id) {
		return nil, runtime.ErrNotFound
	}
	c, err := d.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, runtime.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("load container: %w", err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return nil, fmt.Errorf("read labels: %w", err)
	}
	if labels[LabelWorkload] != id {
		return nil, runtime.ErrNotFound // a container someone else made in our namespace
	}
	return c, nil
}

func (d *Driver) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// List implements runtime.Driver: every workload container of the
// namespace, running or exited, sorted by id.
func (d *Driver) List(ctx context.Context) ([]*runtime.WorkloadState, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("list workloads: %w", errClosed)
	}
	cs, err := d.client.Containers(ctx, fmt.Sprintf("labels.%q", LabelWorkload))
	if err != nil {
		return nil, fmt.Errorf("list workloads: %w", err)
	}
	out := make([]*runtime.WorkloadState, 0, len(cs))
	for _, c := range cs {
		st, err := d.state(ctx, c)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list workloads: %w", err)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkloadID < out[j].WorkloadID })
	return out, nil
}

// Stop implements runtime.Driver: SIGTERM to the container's init process,
// up to Timeout (zero means DefaultStopTimeout) for the task to exit, then
// SIGKILL to every process of the container; StopForced sends SIGKILL at
// once. Then the task, the container and its snapshot are deleted and the
// final state returned. An unknown id returns an error wrapping
// runtime.ErrNotFound. If ctx ends first the workload keeps running and
// ctx's error is returned.
func (d *Driver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StopResponse, error) {
		return d.stop(ctx, req)
	})
}

func (d *Driver) stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, errClosed)
	}
	c, err := d.load(ctx, req.WorkloadID)
	if err != nil {
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
	}
	st, err := d.state(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
	}
	if st.State == runtime.StateRunning {
		timeout := req.Timeout
		if timeout <= 0 {
			timeout = DefaultStopTimeout
		}
		if err := d.kill(ctx, c, req.Mode, timeout); err != nil {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
		}
		if st, err = d.state(ctx, c); err != nil {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
		}
	}
	code, err := d.remove(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
	}
	st.State = runtime.StateExited
	if code >= 0 {
		st.ExitCode = code
	}
	if st.ExitedAt.IsZero() {
		st.ExitedAt = time.Now().UTC()
	}
	d.log.Info("stopped workload", "workload", req.WorkloadID, "exit_code", st.ExitCode)
	return &runtime.StopResponse{State: st}, nil
}

// kill ends c's task: SIGTERM and up to timeout for graceful mode, then
// SIGKILL to all its processes and up to killWait.
func (d *Driver) kill(ctx context.Context, c ctd.Container, mode runtime.StopMode, timeout time.Duration) error {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load task: %w", err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait for task: %w", err)
	}
	if mode != runtime.StopForced {
		if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("signal task: %w", err)
		}
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-exited:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if err := task.Kill(ctx, syscall.SIGKILL, ctd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill task: %w", err)
	}
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("task still running %s after SIGKILL", killWait)
	}
}

// envList turns the environment map into a sorted KEY=VALUE list.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
