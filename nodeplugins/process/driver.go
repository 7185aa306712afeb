// Package process is the "process" runtime driver: it runs each workload as a
// plain process in its own session, supervised through /proc and a state directory.
//
// Workloads outlive the driver: a workload is started with Setsid in its own
// session and process group and is never tied to the driver's life, so it keeps
// running when the driver or the agent is killed. The driver persists one record
// per workload under Config.StateDir (pid, the process start time from
// /proc/<pid>/stat field 22, command, start time), so a restarted driver finds
// its workloads again and tells a live workload from a reused pid.
//
// Exit codes are known only for workloads the driver started in its current
// life (it reaps them); for the others ExitCode is -1. A workload killed by a
// signal reports 128 + the signal number, as a shell does.
//
// Logs: with Config.LogWriter set, stdout and stderr go through pipes to a
// log writer process of the workload's own (logwriter.go), which stamps each
// line when written and keeps segments in the directory logseg.DirOf(LogPath)
// (docs/logs.md); Logs renders them as the plain output. Without it, stdout
// and stderr are appended (O_APPEND) to StartRequest.LogPath. While
// the driver runs it keeps the file at most about LogMaxBytes by dropping the
// oldest half once the file grows past it (checked every quarter second, so the
// file may briefly exceed the limit by what the workload writes in that time).
// While the driver is down nobody trims the file and it can grow without bound.
//
// Every state carries a handle (version 1: pid, process start time, log path,
// see handle.go) that the agent persists; Recover adopts a workload from it
// even when the record under StateDir was lost. Start and Stop are fenced per
// workload and deduplicated by idempotency key through sdk/guard, with their
// records under StateDir/fence and StateDir/idempotency.
//
// Process groups: Stop signals the workload's whole process group (its
// leader's pid, persisted in the record and the handle), and a workload counts
// as stopped only when no live member of the group is left, so children a
// killed leader left behind are ended too. A Start that replaces an exited
// run first kills what is left of the old group (group.go). As root each
// workload also gets its own cgroup (cgroup v2, or the memory and cpu
// hierarchies of cgroup v1), which catches children that left the group
// (cgroup.go, cgroup1.go); without one the process group alone decides.
//
// Limits: with the memory and cpu controllers of cgroup v2, or else of
// cgroup v1, StartRequest.MemoryBytes and CPUMillis become the limits of the
// workload's cgroups before the process runs, and a run the kernel's OOM
// killer ended exits with ExitReason "oom". Capabilities.ResourceLimits says
// which ("cgroup2", "cgroup1"); without either the driver says why once in its
// log and there ("none: <why>") and runs workloads unlimited.
//
// Stop is also how the agent forgets a workload: once the workload has exited,
// Stop removes its record and returns the final state; a later Stop or Inspect
// of that id returns ErrNotFound, which callers treat as success. A workload
// that exits on its own keeps its record (State exited) until it is stopped or
// started again.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/runtime"
)

// Defaults applied when a request leaves a field zero.
const (
	DefaultLogMaxBytes = 1 << 20          // bytes, StartRequest.LogMaxBytes
	DefaultStopTimeout = 10 * time.Second // StopRequest.Timeout
)

const (
	logCheckInterval = 250 * time.Millisecond // how often the log trimmer looks at a file
	procPollInterval = 20 * time.Millisecond  // how often Stop looks at /proc while waiting
	killWait         = 5 * time.Second        // how long Stop waits after SIGKILL before failing
	reapWait         = time.Second            // how long to wait for our own child's exit code
	idempotencyKept  = 24 * time.Hour         // idempotency records older than this are pruned at start
)

// ErrInvalidRequest is returned (wrapped) by Start for a request it cannot
// run: an isolation mode other than "none", an unsafe workload id, an empty
// command, a missing log path, or a command that cannot be found. It carries
// code validation_failed, so errors.Is holds across the wire.
var ErrInvalidRequest = abierrors.New(abierrors.ValidationFailed, "invalid workload request")

// Config configures a Driver.
type Config struct {
	// StateDir holds the driver's workload records (created 0700 if missing).
	// Required. Exactly one driver may use a state directory at a time.
	StateDir string
	// Logger receives the driver's own logs; nil discards them.
	Logger *slog.Logger
	// LogWriter is the command (path and leading arguments) of the
	// per-workload log writer: the driver appends --dir and the segment
	// options and runs it in a session of its own, with the workload's stdout
	// and stderr as fds 3 and 4 (docs/logs.md section 4). The plugin binary
	// runs itself with [logwriter.Command]. Empty: no log writer, and output is
	// appended to StartRequest.LogPath as before.
	LogWriter []string
	// LogSegmentBytes, LogSegmentAge and LogMaxDiskBytes are the log writer's
	// segment size and age and its disk bound per workload (see
	// internal/logseg.WriterOptions); zero means its defaults.
	LogSegmentBytes int64
	LogSegmentAge   time.Duration
	LogMaxDiskBytes int64
}

// Driver is the process runtime driver. It implements runtime.Driver and is
// safe for concurrent use. Close stops its background work; workloads keep running.
type Driver struct {
	cfg  Config
	log  *slog.Logger
	life context.Context
	stop context.CancelFunc

	trimmers sync.WaitGroup // running log trimmers
	guards   *guard.Guards
	// cgroupParent is the directory of the workloads' cgroups (cgroup.go):
	// in the cgroup v2 hierarchy, or in the memory hierarchy of cgroup v1;
	// "" when the driver cannot use cgroups and relies on process groups.
	cgroupParent string
	// cpuParent is the directory of the workloads' groups in the cpu
	// hierarchy of cgroup v1 (cgroup1.go); "" unless limits is cgroup1.
	cpuParent string
	// limits is Capabilities.ResourceLimits: runtime.LimitsCgroup2 or
	// runtime.LimitsCgroup1 when the workloads' cgroups enforce memory and CPU
	// limits, "none: <why>" otherwise.
	limits string

	mu        sync.Mutex
	closed    bool                 // mu must be held
	workloads map[string]*workload // by workload id; mu must be held
}

// workload is one workload the driver knows.
type workload struct {
	rec record // mu of the Driver must be held
	// done is closed when this driver life reaped the process; nil when the
	// process was found after a restart (not our child).
	done chan struct{}
	// stopTrim ends the log trimmer.
	stopTrim context.CancelFunc
	// reaped is set, with reapedCode, once this life's reaper took the process's exit code
	// (before it waits for the log writer to drain). Guarded by the Driver's mu.
	reaped     bool
	reapedCode int
	// deadSince is when refreshLocked first found the process gone while its log writer was
	// still draining the output; zero otherwise.
	deadSince time.Time
}

var _ runtime.Driver = (*Driver)(nil)

// New returns a driver using cfg.StateDir, loading the records a previous
// driver left there. Workloads found alive get their log trimmer back; dead
// ones are reported exited with ExitCode -1 (unless a previous life recorded
// the code). It returns an error when StateDir is empty or unusable.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("process driver: StateDir is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	life, stop := context.WithCancel(context.Background())
	var err error
	d := &Driver{cfg: cfg, log: log, life: life, stop: stop, workloads: map[string]*workload{}}
	if err := os.MkdirAll(d.recordDir(), 0o700); err != nil {
		stop()
		return nil, fmt.Errorf("process driver: create state directory: %w", err)
	}
	if d.guards, err = guard.Open(cfg.StateDir); err != nil {
		stop()
		return nil, fmt.Errorf("process driver: %w", err)
	}
	if _, err := d.guards.Idempotency.Prune(time.Now().Add(-idempotencyKept)); err != nil {
		d.log.Warn("could not prune idempotency records", "error", err)
	}
	cg := chooseCgroups(cfg.StateDir)
	d.cgroupParent, d.cpuParent, d.limits = cg.parent, cg.cpuParent, cg.limits
	switch {
	case d.cgroupParent == "":
		d.log.Info("no usable cgroups: workloads are stopped by their process group only")
	case d.cpuParent != "":
		d.log.Info("each workload gets its own cgroup v1 groups", "memory_parent", d.cgroupParent, "cpu_parent", d.cpuParent)
	default:
		d.log.Info("each workload gets its own cgroup", "parent", d.cgroupParent)
	}
	if limited(d.limits) {
		d.log.Info("memory and CPU limits of workloads are enforced", "resource_limits", d.limits)
	} else {
		d.log.Warn("memory and CPU limits of workloads are not enforced: they run unlimited", "reason", strings.TrimPrefix(d.limits, "none: "))
	}
	recs, err := d.loadRecords()
	if err != nil {
		stop()
		return nil, fmt.Errorf("process driver: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range recs {
		w := &workload{rec: *r}
		d.workloads[r.WorkloadID] = w
		if d.refreshLocked(w) {
			w.stopTrim = d.startTrimmer(w.rec)
			d.log.Info("found running workload", "workload", r.WorkloadID, "pid", r.PID)
		}
	}
	// What a driver that crashed left: the empty cgroups of workloads that
	// ended meanwhile (their OOM count was read above). A later Start makes
	// its cgroups again.
	for _, parent := range []string{d.cgroupParent, d.cpuParent} {
		if parent != "" {
			if err := removeEmptyCgroups(context.Background(), parent); err != nil {
				d.log.Warn("could not remove the cgroups of ended workloads", "parent", parent, "error", err)
			}
		}
	}
	return d, nil
}

// limited reports whether a Capabilities.ResourceLimits of this driver
// means limits are enforced.
func limited(limits string) bool {
	return limits == runtime.LimitsCgroup2 || limits == runtime.LimitsCgroup1
}

// Close stops the driver's log trimmers and its bookkeeping of exits: once it
// returns the driver writes nothing more under StateDir or to log files.
// Workloads keep running; a new driver on the same StateDir picks them up.
// Calls after Close fail. Idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.stop()
	d.trimmers.Wait()
	// Empty cgroups go (a later Start makes its cgroup again); those of
	// running workloads stay, and with them the parent.
	for _, parent := range []string{d.cgroupParent, d.cpuParent} {
		if parent == "" {
			continue
		}
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if p := filepath.Join(parent, e.Name()); e.IsDir() && !cgroupPopulated(p) {
				_ = os.Remove(p)
			}
		}
		_ = os.Remove(parent)
	}
	return nil
}

// errClosed is returned by calls on a closed Driver.
var errClosed = errors.New("process driver: closed")

// persistExitLocked stores w's exit, unless w was forgotten or the driver
// closed. mu must be held.
func (d *Driver) persistExitLocked(w *workload) {
	if d.closed || d.workloads[w.rec.WorkloadID] != w {
		return
	}
	if err := d.writeRecord(&w.rec); err != nil {
		d.log.Warn("could not persist workload exit", "workload", w.rec.WorkloadID, "error", err)
	}
}

// Describe implements runtime.Driver.
func (d *Driver) Describe(context.Context) (*runtime.DescribeResponse, error) {
	return &runtime.DescribeResponse{
		Name:        "process",
		Version:     version.Version,
		APIVersions: []int{runtime.APIVersion},
		Capabilities: runtime.Capabilities{
			OutlivesDriver: true,
			IsolationModes: []string{"none"},
			Logs:           true,
			Stats:          true,
			ResourceLimits: d.limits,
		},
	}, nil
}

var validID = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Start implements runtime.Driver. A running workload with the same id is
// returned as it is (the request is not compared); an exited one is replaced
// by a new process once nothing of its process group is left (an old group
// that outlives SIGKILL fails the Start with ErrGroupSurvived). Errors wrap
// ErrInvalidRequest for a request that cannot run.
func (d *Driver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if req == nil {
		return nil, fmt.Errorf("start workload: no request: %w", ErrInvalidRequest)
	}
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StartResponse, error) {
		return d.start(ctx, req)
	})
}

func (d *Driver) start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.Isolation != "" && req.Isolation != "none" {
		return nil, fmt.Errorf("start workload %s: isolation %q: the process driver offers only \"none\": %w", req.WorkloadID, req.Isolation, ErrInvalidRequest)
	}
	if !validID.MatchString(req.WorkloadID) {
		return nil, fmt.Errorf("start workload: bad workload id: %w", ErrInvalidRequest)
	}
	id := req.WorkloadID
	if len(req.Command) == 0 || req.Command[0] == "" {
		return nil, fmt.Errorf("start workload %s: empty command: %w", id, ErrInvalidRequest)
	}
	if req.LogPath == "" {
		return nil, fmt.Errorf("start workload %s: no log path: %w", id, ErrInvalidRequest)
	}
	maxBytes := req.LogMaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultLogMaxBytes
	}

	// A restart in place first makes sure nothing of the previous run is
	// left: its leader has exited, but children it left in its group would
	// otherwise run beside the new process.
	d.mu.Lock()
	if w, ok := d.workloads[id]; ok && !d.refreshLocked(w) {
		old, oldRec := w.rec.procs(), w.rec
		d.mu.Unlock()
		if err := old.kill(ctx); err != nil {
			return nil, fmt.Errorf("start workload %s: clear the previous run's process group %d: %w", id, old.pgid, err)
		}
		// The previous run's log writer seals its last segment and lets go
		// of the log directory before the next run's writer takes it.
		awaitLogWriter(ctx, oldRec)
		d.mu.Lock()
	}
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("start workload %s: %w", id, errClosed)
	}
	if w, ok := d.workloads[id]; ok {
		if d.refreshLocked(w) {
			return &runtime.StartResponse{State: w.state()}, nil
		}
		w.stopTrimmer()
	}

	cred, err := credential(req.User)
	if err != nil {
		return nil, fmt.Errorf("start workload %s: %w", id, err)
	}
	path, err := resolveCommand(req.Command[0], req.WorkDir, req.Env["PATH"])
	if err != nil {
		return nil, fmt.Errorf("start workload %s: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Dir(req.LogPath), 0o750); err != nil {
		return nil, fmt.Errorf("start workload %s: create log directory: %w", id, err)
	}
	var stdout, stderr *os.File
	var lw *logWriter
	logDir := ""
	if len(d.cfg.LogWriter) > 0 {
		logDir = logseg.DirOf(req.LogPath)
		if lw, err = d.startLogWriter(logDir); err != nil {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
		// Closed here once the workload holds them: the log writer then sees
		// the end of the output when the workload's last process ends.
		defer lw.stdout.Close()
		defer lw.stderr.Close()
		stdout, stderr = lw.stdout, lw.stderr
	} else {
		logf, err := os.OpenFile(req.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, fmt.Errorf("start workload %s: open log: %w", id, err)
		}
		defer logf.Close()
		stdout, stderr = logf, logf
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("start workload %s: open %s: %w", id, os.DevNull, err)
	}
	defer devnull.Close()

	if req.MemoryBytes < 0 || req.CPUMillis < 0 {
		return nil, fmt.Errorf("start workload %s: memory_bytes and cpu_millis must not be negative: %w", id, ErrInvalidRequest)
	}
	attr := &syscall.SysProcAttr{Setsid: true, Credential: cred}
	cgroup, cgroupCPU := "", ""
	var oomBase int64
	switch {
	case d.limits == runtime.LimitsCgroup1:
		// Limits go in before the process runs; a group that cannot be made or
		// limited fails the start rather than run it unlimited unasked.
		mem, cpu, err := makeCgroup1(d.cgroupParent, d.cpuParent, id)
		if err != nil {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
		if err := setLimits1(mem, cpu, req.MemoryBytes, req.CPUMillis); err != nil {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
		cgroup, cgroupCPU = mem, cpu
		oomBase, _ = oomCount(mem)
		// No CLONE_INTO_CGROUP in v1: the process starts stopped at its exec
		// and is placed before it runs (placeStopped); only the thread that
		// started it may let it go.
		attr.Ptrace = true
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
	case d.cgroupParent != "":
		cg, dir, err := makeCgroup(d.cgroupParent, id)
		if err != nil {
			d.log.Warn("workload runs without its own cgroup", "workload", id, "error", err)
			break
		}
		defer dir.Close()
		cgroup = cg
		attr.UseCgroupFD, attr.CgroupFD = true, int(dir.Fd())
		if d.limits == runtime.LimitsCgroup2 {
			// Limits go in before the process is cloned into the cgroup; a limit that
			// cannot be set fails the start rather than run it unlimited unasked.
			if err := setLimits(cgroup, req.MemoryBytes, req.CPUMillis); err != nil {
				return nil, fmt.Errorf("start workload %s: %w", id, err)
			}
			oomBase, _ = oomCount(cgroup)
		}
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   slices.Clone(req.Command),
		Env:    envList(req.Env),
		Dir:    req.WorkDir,
		Stdin:  devnull,
		Stdout: stdout,
		Stderr: stderr,
		// Own session and process group: no controlling terminal, no signal
		// from the driver's group, and Stop can signal the whole group.
		SysProcAttr: attr,
	}
	if err := cmd.Start(); err != nil {
		if attr.Ptrace {
			return nil, fmt.Errorf("start workload %s (stopped at its exec, to place it in its cgroup v1 groups): %w", id, err)
		}
		if cgroup == "" {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
		// The kernel refused the cgroup (e.g. no clone3): start without.
		d.log.Warn("workload runs without its own cgroup, and so without limits", "workload", id, "cgroup", cgroup, "error", err)
		cgroup, attr.UseCgroupFD, attr.CgroupFD = "", false, 0
		cmd = &exec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Stdin: devnull, Stdout: stdout, Stderr: stderr, SysProcAttr: attr}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
	}
	pid := cmd.Process.Pid
	if attr.Ptrace {
		if err := placeStopped(pid, cgroup, cgroupCPU); err != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL) // stopped before its first instruction: nothing else of it exists
			_ = cmd.Wait()
			return nil, fmt.Errorf("start workload %s: %w", id, err)
		}
	}
	// The child cannot be reaped before cmd.Wait, so its /proc entry exists
	// even if it has already exited.
	st, err := readProcStat(pid)
	if err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, fmt.Errorf("start workload %s: read start time: %w", id, err)
	}
	w := &workload{
		rec: record{
			Version:     recordVersion,
			WorkloadID:  id,
			PID:         pid,
			PGID:        pid, // Setsid: the leader's pid is the group's id
			Cgroup:      cgroup,
			CgroupCPU:   cgroupCPU,
			StartTicks:  st.StartTicks,
			Command:     slices.Clone(req.Command),
			StartedAt:   time.Now().UTC(),
			LogPath:     req.LogPath,
			LogMaxBytes: maxBytes,
			LogDir:      logDir,
			ExitCode:    -1,
			OOMKillBase: oomBase,
		},
		done: make(chan struct{}),
	}
	if lw != nil {
		w.rec.WriterPID, w.rec.WriterTicks = lw.pid, lw.ticks
	}
	if err := d.writeRecord(&w.rec); err != nil {
		// Without a record a restarted driver could not find it: do not leave it running.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, fmt.Errorf("start workload %s: %w", id, err)
	}
	d.workloads[id] = w
	w.stopTrim = d.startTrimmer(w.rec)
	go d.reap(w, cmd)
	d.log.Info("started workload", "workload", id, "pid", pid, "command", req.Command[0])
	return &runtime.StartResponse{State: w.state()}, nil
}

// reap waits for a process this driver life started and records its exit.
func (d *Driver) reap(w *workload, cmd *exec.Cmd) {
	err := cmd.Wait()
	code := exitCode(cmd.ProcessState)
	d.mu.Lock()
	w.reaped, w.reapedCode = true, code
	d.mu.Unlock()
	// The exit is recorded once the workload's output is whole: its log writer drains what the
	// process wrote last and seals it (bounded by writerWait), so whoever reads the output
	// after seeing the exit (a job run's tail, logs --previous) finds all of it.
	d.mu.Lock()
	rec := w.rec
	d.mu.Unlock()
	awaitLogWriter(d.life, rec)
	d.mu.Lock()
	defer d.mu.Unlock()
	defer close(w.done)
	if !w.rec.Exited {
		w.rec.Exited = true
		w.rec.ExitedAt = time.Now().UTC()
	}
	w.rec.ExitCode = code
	w.stopTrimmer()
	w.rec.noteOOM()
	d.log.Info("workload exited", "workload", w.rec.WorkloadID, "pid", w.rec.PID, "exit_code", code, "exit_reason", w.rec.ExitReason, "wait_error", err)
	d.persistExitLocked(w)
}

// exitCode is the process's exit code, or 128 + signal for a signalled process.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Inspect implements runtime.Driver. It returns an error wrapping
// runtime.ErrNotFound for an unknown (or stopped and forgotten) workload.
func (d *Driver) Inspect(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, errClosed)
	}
	w, ok := d.workloads[req.WorkloadID]
	if !ok {
		d.mu.Unlock()
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	running := d.refreshLocked(w)
	d.mu.Unlock()
	if !running {
		d.awaitReap(ctx, w)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return w.state(), nil
}

// List implements runtime.Driver: every workload with a record, running or
// exited, sorted by id.
func (d *Driver) List(ctx context.Context) ([]*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("list workloads: %w", errClosed)
	}
	out := make([]*runtime.WorkloadState, 0, len(d.workloads))
	for _, w := range d.workloads {
		d.refreshLocked(w)
		out = append(out, w.state())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkloadID < out[j].WorkloadID })
	return out, nil
}

// Stop implements runtime.Driver: SIGTERM to the workload's process group, up
// to Timeout (zero means DefaultStopTimeout) for every member of the group to
// exit, then SIGKILL to the group; StopForced sends SIGKILL at once. This
// holds also when the leader has already exited and only its children are
// left. A group that outlives SIGKILL for 5 s fails the Stop with
// ErrGroupSurvived and keeps the record. Once the group is empty the record is removed and the final state
// returned. An unknown id returns an error wrapping
// runtime.ErrNotFound. If ctx ends first the workload keeps its record and
// ctx's error is returned.
func (d *Driver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StopResponse, error) {
		return d.stopWorkload(ctx, req)
	})
}

func (d *Driver) stopWorkload(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, errClosed)
	}
	w, ok := d.workloads[req.WorkloadID]
	if !ok {
		d.mu.Unlock()
		return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	d.refreshLocked(w)
	pid, procs := w.rec.PID, w.rec.procs()
	d.mu.Unlock()

	// The whole group (and cgroup) is stopped, not only its leader: a
	// leader that died (or was killed -9) leaves its children behind.
	if procs.alive() {
		timeout := req.Timeout
		if timeout <= 0 {
			timeout = DefaultStopTimeout
		}
		if req.Mode != runtime.StopForced {
			procs.signal(syscall.SIGTERM)
			if err := procs.waitGone(ctx, timeout, 0); err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
			}
		}
		if err := procs.kill(ctx); err != nil {
			return nil, fmt.Errorf("stop workload %s: process group %d: %w", req.WorkloadID, procs.pgid, err)
		}
	}
	d.awaitReap(ctx, w)
	d.mu.Lock()
	rec := w.rec
	d.mu.Unlock()
	awaitLogWriter(ctx, rec)

	d.mu.Lock()
	defer d.mu.Unlock()
	d.refreshLocked(w)
	st := w.state()
	if !d.closed && d.workloads[req.WorkloadID] == w {
		if err := d.removeRecord(req.WorkloadID); err != nil {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
		}
		delete(d.workloads, req.WorkloadID)
		w.stopTrimmer()
		if err := procs.removeCgroups(ctx); err != nil {
			d.log.Warn("could not remove the workload's cgroup", "workload", req.WorkloadID, "error", err)
		}
	}
	d.log.Info("stopped workload", "workload", req.WorkloadID, "pid", pid, "exit_code", st.ExitCode)
	return &runtime.StopResponse{State: st}, nil
}

// awaitReap waits briefly for this driver's reaper to record the exit code of
// a process it started, so that the state returned after an exit carries it.
func (d *Driver) awaitReap(ctx context.Context, w *workload) {
	if w.done == nil {
		return
	}
	t := time.NewTimer(reapWait)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
	case <-ctx.Done():
	case <-d.life.Done():
	}
}

// refreshLocked reports whether w's process is still running, and records the
// exit of a process found dead (ExitCode stays -1 unless the reaper knows it).
// mu must be held.
func (d *Driver) refreshLocked(w *workload) bool {
	if w.rec.Exited {
		return false
	}
	if alive(w.rec.PID, w.rec.StartTicks) {
		return true
	}
	if w.done != nil && !w.reaped {
		// Our child is dead but this life's reaper has not taken its exit code yet (Wait
		// returns as it ends: its output goes to files): it reads as running until then, so
		// its exit is never reported without its code (a job run that exited 0 was recorded
		// failed when a listing came in between).
		return true
	}
	// The exit is reported once the output is whole: while the log writer still drains what
	// the process wrote last (at most writerWait), the workload reads as running.
	if w.rec.WriterPID > 0 && alive(w.rec.WriterPID, w.rec.WriterTicks) {
		if w.deadSince.IsZero() {
			w.deadSince = time.Now()
		}
		if time.Since(w.deadSince) < writerWait {
			return true
		}
	}
	w.rec.Exited = true
	w.rec.ExitedAt = time.Now().UTC()
	if w.reaped {
		w.rec.ExitCode = w.reapedCode
	}
	w.stopTrimmer()
	w.rec.noteOOM()
	d.persistExitLocked(w)
	return false
}

// state returns the public state of w. The Driver's mu must be held.
func (w *workload) state() *runtime.WorkloadState {
	s := &runtime.WorkloadState{
		WorkloadID: w.rec.WorkloadID,
		State:      runtime.StateRunning,
		PID:        w.rec.PID,
		StartedAt:  w.rec.StartedAt,
		ExitCode:   -1,
		Handle:     encodeHandle(w.rec),
	}
	if w.rec.Exited {
		s.State = runtime.StateExited
		s.ExitedAt = w.rec.ExitedAt
		s.ExitCode = w.rec.ExitCode
		s.ExitReason = w.rec.ExitReason
	}
	return s
}

func (w *workload) stopTrimmer() {
	if w.stopTrim != nil {
		w.stopTrim()
		w.stopTrim = nil
	}
}

// resolveCommand finds the executable of name: a name with a slash is taken
// relative to workDir (or as is when absolute); a bare name is looked up in
// workDir first, then in the directories of path (the workload's PATH, or the
// driver's own when empty).
func resolveCommand(name, workDir, path string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(workDir, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("command %q: %w", name, err)
		}
		return p, nil
	}
	if workDir != "" {
		p := filepath.Join(workDir, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	if path == "" {
		path = os.Getenv("PATH")
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in work directory or PATH: %w", name, ErrInvalidRequest)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file: %w", p, ErrInvalidRequest)
	}
	return nil
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
