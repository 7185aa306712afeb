package process

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

// handleVersion is the version of the handles this driver writes. Bump it
// and keep a decoder for the old one when the layout changes.
const handleVersion = 1

// handleV1 is the data of a version 1 handle: what Recover needs to find a
// workload without its record.
type handleV1 struct {
	PID         int       `json:"pid"`
	PGID        int       `json:"pgid,omitempty"`       // 0 in handles of older drivers means PID
	Cgroup      string    `json:"cgroup,omitempty"`     // "" when the run has no cgroup
	CgroupCPU   string    `json:"cgroup_cpu,omitempty"` // the cgroup v1 cpu group; "" otherwise
	StartTicks  uint64    `json:"start_ticks"`
	StartedAt   time.Time `json:"started_at"`
	LogPath     string    `json:"log_path"`
	LogMaxBytes int64     `json:"log_max_bytes"`
	Command     []string  `json:"command"`
	LogDir      string    `json:"log_dir,omitempty"` // the log writer's directory; "" when output goes to LogPath
	WriterPID   int       `json:"writer_pid,omitempty"`
	WriterTicks uint64    `json:"writer_ticks,omitempty"`
}

func encodeHandle(r record) runtime.Handle {
	raw, _ := json.Marshal(handleV1{PID: r.PID, PGID: r.pgid(), Cgroup: r.Cgroup, CgroupCPU: r.CgroupCPU, StartTicks: r.StartTicks, StartedAt: r.StartedAt,
		LogPath: r.LogPath, LogMaxBytes: r.LogMaxBytes, Command: r.Command, LogDir: r.LogDir, WriterPID: r.WriterPID, WriterTicks: r.WriterTicks}) // plain struct: cannot fail
	return runtime.Handle{Version: handleVersion, Data: raw}
}

// Recover implements runtime.Driver. A workload the driver has a record of is
// reported as Inspect would. Otherwise the handle is decoded: when its
// process is still alive (same pid and start time) the workload is adopted
// (a record is written and its log trimmer started) and reported running;
// when the leader is gone but members of its process group live on, it is
// adopted as exited so that Stop ends them; when nothing of it is left,
// ErrNotFound. A handle of another version is refused with
// code validation_failed.
func (d *Driver) Recover(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	_, known := d.workloads[req.WorkloadID]
	d.mu.Unlock()
	if known {
		return d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: req.WorkloadID})
	}
	if req.Handle.Version != handleVersion {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("recover workload %s: handle version %d: this driver reads version %d", req.WorkloadID, req.Handle.Version, handleVersion))
	}
	if !validID.MatchString(req.WorkloadID) {
		return nil, fmt.Errorf("recover workload: bad workload id: %w", ErrInvalidRequest)
	}
	var h handleV1
	if err := json.Unmarshal(req.Handle.Data, &h); err != nil {
		return nil, abierrors.Wrap(abierrors.ValidationFailed, "recover workload "+req.WorkloadID+": handle does not decode", err)
	}
	if h.Cgroup != "" && (d.cgroupParent == "" || filepath.Dir(h.Cgroup) != d.cgroupParent) {
		// Only a cgroup of this driver's own is ever killed.
		d.log.Warn("ignoring a handle's cgroup outside the driver's", "workload", req.WorkloadID, "cgroup", h.Cgroup)
		h.Cgroup = ""
	}
	if h.CgroupCPU != "" && (d.cpuParent == "" || filepath.Dir(h.CgroupCPU) != d.cpuParent) {
		d.log.Warn("ignoring a handle's cgroup outside the driver's", "workload", req.WorkloadID, "cgroup", h.CgroupCPU)
		h.CgroupCPU = ""
	}
	pgid := h.PGID
	if pgid <= 0 {
		pgid = h.PID
	}
	leader := alive(h.PID, h.StartTicks)
	if !leader && !(procSet{pgid: pgid, ticks: h.StartTicks, cgroup: h.Cgroup}).alive() {
		return nil, fmt.Errorf("recover workload %s: process %d is gone: %w", req.WorkloadID, h.PID, runtime.ErrNotFound)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("recover workload %s: %w", req.WorkloadID, errClosed)
	}
	if w, ok := d.workloads[req.WorkloadID]; ok { // adopted meanwhile
		d.refreshLocked(w)
		return w.state(), nil
	}
	w := &workload{rec: record{
		Version: recordVersion, WorkloadID: req.WorkloadID, PID: h.PID, PGID: h.PGID, Cgroup: h.Cgroup, CgroupCPU: h.CgroupCPU, StartTicks: h.StartTicks,
		Command: h.Command, StartedAt: h.StartedAt, LogPath: h.LogPath, LogMaxBytes: h.LogMaxBytes, ExitCode: -1,
		LogDir: h.LogDir, WriterPID: h.WriterPID, WriterTicks: h.WriterTicks,
	}}
	if !leader {
		// The leader is gone but children it left in its group live on:
		// adopt the workload as exited, so that Stop (or a new Start)
		// ends what is left of the group.
		w.rec.Exited, w.rec.ExitedAt = true, time.Now().UTC()
	}
	if err := d.writeRecord(&w.rec); err != nil {
		return nil, fmt.Errorf("recover workload %s: %w", req.WorkloadID, err)
	}
	d.workloads[req.WorkloadID] = w
	if leader && w.rec.LogPath != "" && w.rec.LogMaxBytes > 0 {
		w.stopTrim = d.startTrimmer(w.rec)
	}
	d.log.Info("recovered workload from its handle", "workload", req.WorkloadID, "pid", h.PID)
	return w.state(), nil
}

// logFollowInterval is how often Logs with Follow looks for new output.
const logFollowInterval = 100 * time.Millisecond

// Logs implements runtime.LogStreamer: it copies the workload's log file (its
// last TailBytes when positive) to w and, with Follow, new output as the
// file grows (also across a trim) until ctx ends. ErrNotFound for an unknown
// workload.
func (d *Driver) Logs(ctx context.Context, req *runtime.LogsRequest, w io.Writer) error {
	d.mu.Lock()
	wl, ok := d.workloads[req.WorkloadID]
	var path, dir string
	if ok {
		path, dir = wl.rec.LogPath, wl.rec.LogDir
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	if dir != "" {
		return logwriter.Render(ctx, req, dir, w)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && !req.Follow {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
	}
	defer f.Close()
	if req.TailBytes > 0 {
		if fi, err := f.Stat(); err == nil && fi.Size() > req.TailBytes {
			if _, err := f.Seek(-req.TailBytes, io.SeekEnd); err != nil {
				return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
			}
		}
	}
	var off int64
	copyNew := func() error {
		n, err := io.Copy(w, f)
		off += n
		return err
	}
	if err := copyNew(); err != nil {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
	}
	if !req.Follow {
		return nil
	}
	t := time.NewTicker(logFollowInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if pos, err := f.Seek(0, io.SeekCurrent); err == nil {
			if fi, err := f.Stat(); err == nil && fi.Size() < pos {
				// Trimmed: start again from the beginning of the kept part.
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
				}
			}
		}
		if err := copyNew(); err != nil {
			return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
		}
	}
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times;
// 100 on every Linux architecture Berth runs on.
const clockTicks = 100

// Stats implements runtime.StatsReporter from /proc/<pid>/stat: CPU time
// (utime + stime) and resident memory of the workload's main process.
// ErrNotFound for an unknown or exited workload.
func (d *Driver) Stats(ctx context.Context, req *runtime.StatsRequest) (*runtime.Stats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	wl, ok := d.workloads[req.WorkloadID]
	running := ok && d.refreshLocked(wl)
	var pid int
	if ok {
		pid = wl.rec.PID
	}
	d.mu.Unlock()
	if !running {
		return nil, fmt.Errorf("stats of workload %s: not running: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	i := bytes.LastIndexByte(raw, ')')
	f := strings.Fields(string(raw[i+1:]))
	if i < 0 || len(f) < 22 {
		return nil, fmt.Errorf("stats of workload %s: cannot parse /proc/%d/stat", req.WorkloadID, pid)
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	return &runtime.Stats{
		CPUSeconds:  float64(utime+stime) / clockTicks,
		MemoryBytes: rss * int64(os.Getpagesize()),
		At:          time.Now().UTC(),
	}, nil
}
