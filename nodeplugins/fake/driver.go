// Package fake is the "fake" runtime driver: a deterministic driver for tests
// that runs no process, logs every start and stop with a timestamp, and can be told to fail forced stops.
//
// A workload is a record in the driver's state directory: Start marks it
// running and Stop marks it gone. When the start request's environment has
// PORT (and HOST, default 127.0.0.1), the driver listens there for the
// workload and answers every HTTP request with 200, so that the agent's
// health checks pass. Records live in StateDir/workloads.json, so a
// restarted driver finds its workloads again (Capabilities.OutlivesDriver);
// Recover adopts a workload from its handle alone, unless the state
// directory knows it was stopped.
//
// Driver log. Every transition appends one line to Config.LogPath (default
// StateDir/driver.log), fsynced before the call returns:
//
//	2026-11-29T12:00:00.123456789Z start wl_x key=start/wl_x/1 fence=workload/wl_x@7
//	2026-11-29T12:00:05.000000001Z stop wl_x mode=graceful key=stop/wl_x/1 fence=workload/wl_x@8
//	2026-11-29T12:00:06.000000002Z stop-failed wl_x mode=forced
//
// The time is the wall clock in RFC 3339 with nanoseconds, UTC. Between a
// start line and the next stop line of an id the workload counts as running;
// a stop-failed line leaves it running. key= is the call's idempotency key
// (absent when it has none) and fence= the fence resource and token it was
// admitted with. A call replayed from its idempotency key writes no line, so
// the start lines of one key count how often it really acted.
//
// Fencing and replay go through sdk/guard, durably under StateDir: a Start
// or Stop whose token is lower than the highest seen for its fence resource
// (StartRequest.FenceResource, or the workload) is refused with code
// stale_fencing_token, also after a restart of the driver.
//
// Faults. A forced stop of a workload listed in the file StateDir/fail-forced-stop
// (read on every Stop; one workload id per line, or "*" for every workload)
// or in Config.FailForcedStop fails with code unavailable and leaves the
// workload running. A graceful stop of such a workload is ignored by the
// workload, as SIGTERM would be, for its Timeout (or until ctx ends), and
// then fails the same way, like a driver whose SIGKILL did not take. A
// Start of a workload listed in StateDir/hold-after-start succeeds, logs
// "held <id>" and then does not answer until the file stops listing it (or
// the call's ctx ends): the agent can be killed between the driver's start
// and its record of it.
package fake

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/runtime"
)

// Files in the state directory.
const (
	FailForcedStopFile = "fail-forced-stop" // workload ids (or "*") whose forced stop fails
	HoldAfterStartFile = "hold-after-start" // workload ids (or "*") whose Start blocks after it succeeded
	LogFile            = "driver.log"       // the default start/stop log
	stateFile          = "workloads.json"
)

// EnvFailForcedStop is read by cmd/berth-plugin-fake into
// Config.FailForcedStop: a comma-separated list of workload ids, or "*".
const EnvFailForcedStop = "BERTH_FAKE_FAIL_FORCED_STOP"

// holdPollInterval is how often a held Start looks at its fault file.
const holdPollInterval = 50 * time.Millisecond

// DefaultStopTimeout is the graceful stop's timeout when the request gives none.
const DefaultStopTimeout = 10 * time.Second

// handleVersion is the version of the handles this driver issues.
const handleVersion = 1

// keptTombstones bounds how many stopped workloads the state remembers.
const keptTombstones = 1024

// ErrForcedStopFailed is returned (wrapped) by Stop of a workload the
// driver was told to fail forced stops for. It carries code unavailable.
var ErrForcedStopFailed = abierrors.New(abierrors.Unavailable, "forced stop failed (fault injected)")

// ErrInvalidRequest is returned (wrapped) by Start for a request it cannot
// run. It carries code validation_failed.
var ErrInvalidRequest = abierrors.New(abierrors.ValidationFailed, "invalid workload request")

// Config configures a Driver.
type Config struct {
	// StateDir holds the driver's records, its log and the fault file
	// (created 0700 if missing). Required.
	StateDir string
	// LogPath is the start/stop log; empty means StateDir/driver.log.
	LogPath string
	// FailForcedStop lists workload ids ("*" for all) whose forced stop
	// fails, in addition to those in StateDir/fail-forced-stop.
	FailForcedStop []string
	// Now is the wall clock; nil means time.Now.
	Now func() time.Time
	// Logger receives the driver's own logs; nil discards them.
	Logger *slog.Logger
}

// Driver is the fake runtime driver. Safe for concurrent use.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	guards *guard.Guards

	mu        sync.Mutex
	closed    bool                 // mu must be held
	workloads map[string]*workload // running ones, by id; mu must be held
	stopped   []tombstone          // mu must be held
}

type workload struct {
	rec record
	ln  net.Listener // nil when the workload serves nothing
	srv *http.Server
}

// record is what the state file keeps of a running workload, and the
// handle's content.
type record struct {
	WorkloadID string    `json:"workload_id"`
	StartedAt  time.Time `json:"started_at"`
	Listen     string    `json:"listen,omitempty"` // host:port served for the workload
}

type tombstone struct {
	WorkloadID string    `json:"workload_id"`
	StartedAt  time.Time `json:"started_at"`
}

type stateDoc struct {
	Workloads []record    `json:"workloads"`
	Stopped   []tombstone `json:"stopped"`
}

var _ runtime.Driver = (*Driver)(nil)

// New returns a driver on cfg.StateDir, finding the workloads a previous
// driver left running there.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("fake driver: StateDir is required")
	}
	if cfg.LogPath == "" {
		cfg.LogPath = filepath.Join(cfg.StateDir, LogFile)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("fake driver: create state directory: %w", err)
	}
	g, err := guard.Open(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("fake driver: %w", err)
	}
	d := &Driver{cfg: cfg, log: log, guards: g, workloads: map[string]*workload{}}
	raw, err := os.ReadFile(filepath.Join(cfg.StateDir, stateFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("fake driver: read state: %w", err)
	}
	if err == nil {
		var doc stateDoc
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("fake driver: parse state: %w", err)
		}
		d.stopped = doc.Stopped
		for _, r := range doc.Workloads {
			w := &workload{rec: r}
			d.serve(w)
			d.workloads[r.WorkloadID] = w
		}
	}
	return d, nil
}

// Close stops serving the workloads' ports; the records stay, so a new
// driver on the same StateDir finds them running. Idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	for _, w := range d.workloads {
		d.unserve(w)
	}
	return nil
}

var errClosed = errors.New("fake driver: closed")

// Describe implements runtime.Driver.
func (d *Driver) Describe(context.Context) (*runtime.DescribeResponse, error) {
	return &runtime.DescribeResponse{Name: "fake", Version: version.Version, APIVersions: []int{runtime.APIVersion},
		Capabilities: runtime.Capabilities{OutlivesDriver: true, IsolationModes: []string{"none"},
			ResourceLimits: "none: the fake driver runs no processes"}}, nil
}

var validID = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Start implements runtime.Driver: a running workload with the same id is
// returned as it is; otherwise the workload becomes running, is logged and
// persisted.
func (d *Driver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if req == nil || !validID.MatchString(req.WorkloadID) {
		return nil, fmt.Errorf("start workload: bad workload id: %w", ErrInvalidRequest)
	}
	resp, err := d.start(ctx, req)
	if err == nil {
		d.holdAfterStart(ctx, req.WorkloadID)
	}
	return resp, err
}

// holdAfterStart blocks a successful Start of a workload listed in the file
// StateDir/hold-after-start (one id per line, or "*") until the file no
// longer lists it or ctx ends, after logging "held <id>". The start itself,
// its state and its idempotency record are durable by then: it stands for a
// driver whose answer never reaches the agent.
func (d *Driver) holdAfterStart(ctx context.Context, id string) {
	path := filepath.Join(d.cfg.StateDir, HoldAfterStartFile)
	if !listed(path, id) {
		return
	}
	if err := d.logLine("held", id, ""); err != nil {
		d.log.Warn("driver log", "error", err)
	}
	t := time.NewTicker(holdPollInterval)
	defer t.Stop()
	for listed(path, id) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Driver) start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StartResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if req.Isolation != "" && req.Isolation != "none" {
			return nil, fmt.Errorf("start workload %s: isolation %q: %w", req.WorkloadID, req.Isolation, ErrInvalidRequest)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.closed {
			return nil, errClosed
		}
		if w, ok := d.workloads[req.WorkloadID]; ok {
			return &runtime.StartResponse{State: w.state()}, nil
		}
		w := &workload{rec: record{WorkloadID: req.WorkloadID, StartedAt: d.cfg.Now().UTC()}}
		if port := req.Env["PORT"]; port != "" {
			host := req.Env["HOST"]
			if host == "" {
				host = "127.0.0.1"
			}
			w.rec.Listen = net.JoinHostPort(host, port)
		}
		d.workloads[req.WorkloadID] = w
		if err := d.persistLocked(); err != nil {
			delete(d.workloads, req.WorkloadID)
			return nil, fmt.Errorf("start workload %s: %w", req.WorkloadID, err)
		}
		if err := d.logLine("start", req.WorkloadID, mutationFields(req.Mutation, runtime.FenceOf(req.WorkloadID, req.FenceResource))); err != nil {
			return nil, fmt.Errorf("start workload %s: %w", req.WorkloadID, err)
		}
		d.serve(w)
		d.log.Info("started workload", "workload", req.WorkloadID)
		return &runtime.StartResponse{State: w.state()}, nil
	})
}

// Stop implements runtime.Driver. An unknown id returns an error wrapping
// runtime.ErrNotFound. A workload listed to fail forced stops is not
// stopped: see the package doc.
func (d *Driver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	return guard.MutateFenced(ctx, d.guards, runtime.FenceWorkload(req.WorkloadID), runtime.FenceOf(req.WorkloadID, req.FenceResource), req.Mutation, req, func() (*runtime.StopResponse, error) {
		mode := req.Mode
		if mode == "" {
			mode = runtime.StopGraceful
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, errClosed
		}
		_, ok := d.workloads[req.WorkloadID]
		d.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
		}
		if d.failsForcedStop(req.WorkloadID) {
			if mode == runtime.StopGraceful {
				timeout := req.Timeout
				if timeout <= 0 {
					timeout = DefaultStopTimeout
				}
				t := time.NewTimer(timeout)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
			if err := d.logLine("stop-failed", req.WorkloadID, "mode="+string(mode)); err != nil {
				return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
			}
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, ErrForcedStopFailed)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		w, ok := d.workloads[req.WorkloadID]
		if !ok {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
		}
		delete(d.workloads, req.WorkloadID)
		d.stopped = append(d.stopped, tombstone{WorkloadID: w.rec.WorkloadID, StartedAt: w.rec.StartedAt})
		if len(d.stopped) > keptTombstones {
			d.stopped = d.stopped[len(d.stopped)-keptTombstones:]
		}
		if err := d.persistLocked(); err != nil {
			d.workloads[req.WorkloadID] = w
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
		}
		d.unserve(w)
		if err := d.logLine("stop", req.WorkloadID, "mode="+string(mode)+" "+mutationFields(req.Mutation, runtime.FenceOf(req.WorkloadID, req.FenceResource))); err != nil {
			return nil, fmt.Errorf("stop workload %s: %w", req.WorkloadID, err)
		}
		st := w.state()
		st.State, st.ExitedAt, st.ExitCode = runtime.StateExited, d.cfg.Now().UTC(), 0
		if mode == runtime.StopForced {
			st.ExitCode = 137
		}
		d.log.Info("stopped workload", "workload", req.WorkloadID, "mode", string(mode))
		return &runtime.StopResponse{State: st}, nil
	})
}

// Inspect implements runtime.Driver.
func (d *Driver) Inspect(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	w, ok := d.workloads[req.WorkloadID]
	if !ok {
		return nil, fmt.Errorf("inspect workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	return w.state(), nil
}

// List implements runtime.Driver.
func (d *Driver) List(ctx context.Context) ([]*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	out := make([]*runtime.WorkloadState, 0, len(d.workloads))
	for _, w := range d.workloads {
		out = append(out, w.state())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkloadID < out[j].WorkloadID })
	return out, nil
}

// Recover implements runtime.Driver: a known workload is returned; an
// unknown one is adopted from its handle as running unless the state
// directory recorded its stop (then ErrNotFound). A handle of another
// version is refused with code validation_failed.
func (d *Driver) Recover(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.Handle.Version != handleVersion {
		return nil, fmt.Errorf("recover workload %s: handle version %d: %w", req.WorkloadID, req.Handle.Version, ErrInvalidRequest)
	}
	var r record
	if err := json.Unmarshal(req.Handle.Data, &r); err != nil || r.WorkloadID != req.WorkloadID {
		return nil, fmt.Errorf("recover workload %s: handle does not decode: %w", req.WorkloadID, ErrInvalidRequest)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	if w, ok := d.workloads[r.WorkloadID]; ok {
		return w.state(), nil
	}
	for _, t := range d.stopped {
		if t.WorkloadID == r.WorkloadID && t.StartedAt.Equal(r.StartedAt) {
			return nil, fmt.Errorf("recover workload %s: stopped: %w", r.WorkloadID, runtime.ErrNotFound)
		}
	}
	w := &workload{rec: r}
	d.workloads[r.WorkloadID] = w
	if err := d.persistLocked(); err != nil {
		delete(d.workloads, r.WorkloadID)
		return nil, fmt.Errorf("recover workload %s: %w", r.WorkloadID, err)
	}
	d.serve(w)
	return w.state(), nil
}

func (w *workload) state() *runtime.WorkloadState {
	data, _ := json.Marshal(w.rec) // plain struct: cannot fail
	return &runtime.WorkloadState{WorkloadID: w.rec.WorkloadID, State: runtime.StateRunning, StartedAt: w.rec.StartedAt,
		ExitCode: -1, Handle: runtime.Handle{Version: handleVersion, Data: data}}
}

// failsForcedStop reports whether id is listed in Config.FailForcedStop or
// in the fault file.
func (d *Driver) failsForcedStop(id string) bool {
	if slices.Contains(d.cfg.FailForcedStop, "*") || slices.Contains(d.cfg.FailForcedStop, id) {
		return true
	}
	return listed(filepath.Join(d.cfg.StateDir, FailForcedStopFile), id)
}

// listed reports whether the fault file at path lists id (or "*"); a
// missing file lists nothing.
func listed(path, id string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l == "*" || l == id {
			return true
		}
	}
	return false
}

// ParseFailForcedStop splits the value of EnvFailForcedStop.
func ParseFailForcedStop(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// mutationFields is how the driver log shows a call's mutation fields:
// "key=<idempotency key> fence=<resource>@<token>" (key= is left out when
// the call has no key).
func mutationFields(m runtime.Mutation, fence string) string {
	out := "fence=" + fence + "@" + strconv.FormatUint(m.FencingToken, 10)
	if m.IdempotencyKey != "" {
		out = "key=" + m.IdempotencyKey + " " + out
	}
	return out
}

// logLine appends one line to the driver log and fsyncs it.
func (d *Driver) logLine(event, id, extra string) error {
	line := d.cfg.Now().UTC().Format(time.RFC3339Nano) + " " + event + " " + id
	if extra != "" {
		line += " " + extra
	}
	f, err := os.OpenFile(d.cfg.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open driver log: %w", err)
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		_ = f.Close()
		return fmt.Errorf("write driver log: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync driver log: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close driver log: %w", err)
	}
	return nil
}

// persistLocked writes the state file atomically. mu must be held.
func (d *Driver) persistLocked() error {
	doc := stateDoc{Workloads: []record{}, Stopped: d.stopped}
	for _, w := range d.workloads {
		doc.Workloads = append(doc.Workloads, w.rec)
	}
	sort.Slice(doc.Workloads, func(i, j int) bool { return doc.Workloads[i].WorkloadID < doc.Workloads[j].WorkloadID })
	raw, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	path := filepath.Join(d.cfg.StateDir, stateFile)
	tmp, err := os.CreateTemp(d.cfg.StateDir, stateFile+".*")
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(raw); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// serve listens on the workload's address, when it has one, and answers
// every request with 200. A port that cannot be bound is logged: the
// workload then serves nothing.
func (d *Driver) serve(w *workload) {
	if w.rec.Listen == "" || w.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", w.rec.Listen)
	if err != nil {
		d.log.Warn("cannot serve the workload's port", "workload", w.rec.WorkloadID, "listen", w.rec.Listen, "error", err)
		return
	}
	id := w.rec.WorkloadID
	w.ln = ln
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, "fake workload "+id+"\n")
	})}
	w.srv = srv
	// The goroutine serves its own server: an unserve racing it clears w.srv.
	go func() { _ = srv.Serve(ln) }()
}

func (d *Driver) unserve(w *workload) {
	if w.srv != nil {
		_ = w.srv.Close()
		w.srv, w.ln = nil, nil
	}
}
