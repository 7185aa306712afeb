package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthhq/berth/sdk/runtime"
)

// recordVersion is the version of the on-disk workload record. Bump it and
// keep a decoder for the old one when the layout changes.
const recordVersion = 1

// record is what the driver persists per workload under StateDir/workloads, so
// that a restarted driver finds its workloads again.
type record struct {
	Version     int       `json:"version"`
	WorkloadID  string    `json:"workload_id"`
	PID         int       `json:"pid"`
	PGID        int       `json:"pgid,omitempty"`       // process group (and session) id; 0 in older records means PID
	Cgroup      string    `json:"cgroup,omitempty"`     // the run's cgroup directory (v2, or v1 memory); "" when it has none
	CgroupCPU   string    `json:"cgroup_cpu,omitempty"` // the run's group in the cgroup v1 cpu hierarchy; "" otherwise
	StartTicks  uint64    `json:"start_ticks"`          // /proc/<pid>/stat field 22, clock ticks since boot
	Command     []string  `json:"command"`
	StartedAt   time.Time `json:"started_at"`
	LogPath     string    `json:"log_path"`
	LogMaxBytes int64     `json:"log_max_bytes"`
	// LogDir is the log writer's directory (logseg.DirOf(LogPath)); "" when
	// the output goes to LogPath itself. WriterPID and WriterTicks name the
	// log writer process (pid and /proc start time); 0 when there is none.
	LogDir      string    `json:"log_dir,omitempty"`
	WriterPID   int       `json:"writer_pid,omitempty"`
	WriterTicks uint64    `json:"writer_ticks,omitempty"`
	Exited      bool      `json:"exited,omitempty"`
	ExitedAt    time.Time `json:"exited_at,omitzero"`
	ExitCode    int       `json:"exit_code"` // -1 when unknown
	// OOMKillBase is the cgroup's OOM count (oomCount) when the run started
	// (a reused cgroup keeps its count); ExitReason is "oom" once the run
	// exited with the count above it.
	OOMKillBase int64  `json:"oom_kill_base,omitempty"`
	ExitReason  string `json:"exit_reason,omitempty"`
}

// noteOOM sets r's ExitReason to "oom" when the OOM killer ended a process
// of its cgroup during the run. Called once the run exited, and again when
// its exit code becomes known (the inexact count of an old v1 kernel needs a
// death by SIGKILL).
func (r *record) noteOOM() {
	if r.Cgroup == "" || r.ExitReason != "" {
		return
	}
	if n, exact := oomCount(r.Cgroup); n > r.OOMKillBase && (exact || r.ExitCode == 128+int(syscall.SIGKILL)) {
		r.ExitReason = runtime.ExitReasonOOM
	}
}

// pgid is the workload's process group id: the leader's pid, since the
// driver starts every workload with Setsid.
func (r *record) pgid() int {
	if r.PGID > 0 {
		return r.PGID
	}
	return r.PID
}

func (d *Driver) recordDir() string { return filepath.Join(d.cfg.StateDir, "workloads") }

func (d *Driver) recordPath(id string) string {
	return filepath.Join(d.recordDir(), id+".json")
}

// writeRecord stores r atomically: temp file, fsync, rename, fsync of the directory.
func (d *Driver) writeRecord(r *record) error {
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode record of %s: %w", r.WorkloadID, err)
	}
	dir := d.recordDir()
	f, err := os.CreateTemp(dir, "."+r.WorkloadID+".*.tmp")
	if err != nil {
		return fmt.Errorf("write record of %s: %w", r.WorkloadID, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return fmt.Errorf("write record of %s: %w", r.WorkloadID, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync record of %s: %w", r.WorkloadID, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close record of %s: %w", r.WorkloadID, err)
	}
	if err := os.Rename(tmp, d.recordPath(r.WorkloadID)); err != nil {
		return fmt.Errorf("rename record of %s: %w", r.WorkloadID, err)
	}
	return syncDir(dir)
}

// removeRecord deletes the record of id; a missing record is success.
func (d *Driver) removeRecord(id string) error {
	if err := os.Remove(d.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove record of %s: %w", id, err)
	}
	return syncDir(d.recordDir())
}

// loadRecords reads every record under StateDir. Unreadable records are
// logged and skipped, never deleted.
func (d *Driver) loadRecords() ([]*record, error) {
	entries, err := os.ReadDir(d.recordDir())
	if err != nil {
		return nil, fmt.Errorf("read state directory: %w", err)
	}
	var out []*record
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(d.recordDir(), name))
		if err != nil {
			d.log.Warn("skipping unreadable workload record", "file", name, "error", err)
			continue
		}
		var r record
		if err := json.Unmarshal(raw, &r); err != nil || r.Version != recordVersion || r.WorkloadID+".json" != name {
			d.log.Warn("skipping invalid workload record", "file", name, "error", err)
			continue
		}
		out = append(out, &r)
	}
	return out, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// procStat is what the driver reads of /proc/<pid>/stat.
type procStat struct {
	State      byte   // field 3: R, S, D, Z, T, ...
	StartTicks uint64 // field 22
}

// readProcStat reads /proc/<pid>/stat. It returns an error wrapping
// os.ErrNotExist when there is no such process.
func readProcStat(pid int) (procStat, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself: fields resume after the last ')'.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat start time: %w", pid, err)
	}
	return procStat{State: f[0][0], StartTicks: ticks}, nil
}

// alive reports whether pid is a live (not zombie) process started at ticks.
// A pid that was reused by another process has another start time.
func alive(pid int, ticks uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := readProcStat(pid)
	if err != nil {
		return false
	}
	return st.StartTicks == ticks && st.State != 'Z' && st.State != 'X'
}
