package process

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/sdk/runtime"
)

// orphanScript is a workload whose shell leaves a grandchild that ignores
// SIGTERM (an ignored signal stays ignored across exec) in its group.
const orphanScript = `trap "" TERM; sleep 3600 & echo started; wait`

// startOrphaning starts orphanScript as id, kills its shell with SIGKILL and
// returns the workload's process group id once only the grandchild is left
// and the driver reports the workload exited.
func (f *fixture) startOrphaning(d *Driver, id string) int {
	f.t.Helper()
	r, err := d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID: id,
		Command:    []string{"/bin/sh", "-c", orphanScript},
		Env:        map[string]string{"PATH": "/usr/bin:/bin"},
		WorkDir:    f.dir,
		LogPath:    f.logPath(id),
	})
	if err != nil {
		f.t.Fatalf("Start %s: %v", id, err)
	}
	pgid := r.State.PID
	f.t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	f.waitLog(id, "started")
	waitFor(f.t, 10*time.Second, "the grandchild in the group", func() bool { return len(groupMembers(pgid)) >= 2 })
	if err := syscall.Kill(pgid, syscall.SIGKILL); err != nil {
		f.t.Fatal(err)
	}
	waitFor(f.t, 10*time.Second, "the shell gone, its grandchild left", func() bool {
		m := groupMembers(pgid)
		return len(m) == 1 && !slices.Contains(m, pgid)
	})
	// The driver reports the exit once its reaper took the shell's code and
	// the log writer drained (at most 5 s), not the moment the shell is gone.
	waitFor(f.t, 10*time.Second, id+" reported exited", func() bool {
		return inspect(f.t, d, id).State == runtime.StateExited
	})
	return pgid
}

// assertGroupGone fails unless no live process of group pgid remains.
func assertGroupGone(t *testing.T, pgid int) {
	t.Helper()
	if m := groupMembers(pgid); len(m) != 0 {
		t.Fatalf("process group %d still has members %v", pgid, m)
	}
}

func TestStopKillsOrphanedGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	pgid := f.startOrphaning(d, "wl_orphan")
	if st := inspect(t, d, "wl_orphan"); st.State != runtime.StateExited {
		t.Fatalf("state after the shell died = %s, want exited", st.State)
	}
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_orphan", Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertGroupGone(t, pgid)
}

func TestRestartInPlaceKillsOldGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	pgid := f.startOrphaning(d, "wl_again")
	r, err := d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID: "wl_again",
		Command:    []string{"/bin/sh", "-c", orphanScript},
		Env:        map[string]string{"PATH": "/usr/bin:/bin"},
		WorkDir:    f.dir,
		LogPath:    f.logPath("wl_again"),
	})
	if err != nil {
		t.Fatalf("Start again: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-r.State.PID, syscall.SIGKILL) })
	if r.State.PID == pgid {
		t.Fatalf("Start again returned the old run (pid %d)", pgid)
	}
	assertGroupGone(t, pgid)
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_again", Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertGroupGone(t, r.State.PID)
}

func TestStopAfterDriverRestartKillsOrphanedGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d1 := f.driver()
	pgid := f.startOrphaning(d1, "wl_left")
	d1.Close()
	d2 := f.driver()
	if _, err := d2.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_left", Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatalf("Stop on a restarted driver: %v", err)
	}
	assertGroupGone(t, pgid)
}

func TestRecoverAdoptsOrphanedGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d1 := f.driver()
	pgid := f.startOrphaning(d1, "wl_lost")
	st := inspect(t, d1, "wl_lost")
	d1.Close()
	// A driver on a new state directory knows the workload only by the
	// handle the agent persisted.
	f.state = f.state + "-new"
	d2 := f.driver()
	got, err := d2.Recover(context.Background(), &runtime.RecoverRequest{WorkloadID: "wl_lost", Handle: st.Handle})
	if err != nil {
		t.Fatalf("Recover of a workload whose leader died and whose child lives: %v", err)
	}
	if got.State != runtime.StateExited {
		t.Fatalf("recovered state = %s, want exited", got.State)
	}
	if _, err := d2.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_lost", Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertGroupGone(t, pgid)
	if _, err := d2.Recover(context.Background(), &runtime.RecoverRequest{WorkloadID: "wl_lost", Handle: st.Handle}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Recover after the group is gone = %v, want not found", err)
	}
}

func TestGroupMaybeOursRefusesReusedPID(t *testing.T) {
	t.Parallel()
	self := syscall.Getpid()
	st, err := readProcStat(self)
	if err != nil {
		t.Fatal(err)
	}
	if !groupMaybeOurs(self, st.StartTicks) {
		t.Fatalf("own pid with its start time not taken as the group's")
	}
	if groupMaybeOurs(self, st.StartTicks+1) {
		t.Fatalf("pid %s with another start time taken as the old group's", strconv.Itoa(self))
	}
}

// TestLeaseFenceSurvivesRestart: the process driver keeps the highest token
// per fence resource across its own restart: a start of another workload
// under the same lease with a lower token is refused and starts nothing.
func TestLeaseFenceSurvivesRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	req := func(id string, token uint64) *runtime.StartRequest {
		return &runtime.StartRequest{WorkloadID: id, Command: []string{exe}, Env: map[string]string{modeEnv: "sleep"},
			WorkDir: f.dir, LogPath: f.logPath(id), FenceResource: runtime.FenceLease("lse_1"),
			Mutation: pluginapi.Mutation{IdempotencyKey: "start/" + id + "/1", FencingToken: token}}
	}
	d1 := f.driver()
	r, err := d1.Start(context.Background(), req("wl_new", 5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-r.State.PID, syscall.SIGKILL) })
	d1.Close()
	d2 := f.driver()
	if _, err := d2.Start(context.Background(), req("wl_old", 4)); !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Fatalf("start under a lower lease token after restart = %v; want stale_fencing_token", err)
	}
	if _, err := d2.Inspect(context.Background(), &runtime.InspectRequest{WorkloadID: "wl_old"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the refused start left wl_old: %v", err)
	}
}

// TestStopKillsChildThatLeftTheGroup: as root with cgroups (v2, or v1 where the
// memory and cpu controllers are there), a workload's child that made itself a
// session of its own (and so left the process group) is still in the
// workload's cgroup, and Stop ends it and removes the cgroups.
func TestStopKillsChildThatLeftTheGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	if d.cgroupParent == "" {
		t.Fatalf("this test needs root and a cgroup hierarchy: the driver reports %q", d.limits)
	}
	r, err := d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID: "wl_escape",
		Command:    []string{"/bin/sh", "-c", `trap "" TERM; setsid sleep 3600 & echo started; wait`},
		Env:        map[string]string{"PATH": "/usr/bin:/bin"},
		WorkDir:    f.dir,
		LogPath:    f.logPath("wl_escape"),
	})
	if err != nil {
		t.Fatal(err)
	}
	leader := r.State.PID
	t.Cleanup(func() { _ = syscall.Kill(-leader, syscall.SIGKILL) })
	cg := filepath.Join(d.cgroupParent, "wl_escape")
	t.Cleanup(func() { signalCgroup(cg, syscall.SIGKILL) })
	var escaped int
	waitFor(t, 10*time.Second, "a child in its own session", func() bool {
		raw, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		for _, fld := range strings.Fields(string(raw)) {
			pid, _ := strconv.Atoi(fld)
			if pid > 0 && pid != r.State.PID && !slices.Contains(groupMembers(r.State.PID), pid) {
				escaped = pid
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { _ = syscall.Kill(escaped, syscall.SIGKILL) })
	st, err := readProcStat(escaped)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_escape", Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if alive(escaped, st.StartTicks) {
		t.Fatalf("child %d that left the group survived Stop", escaped)
	}
	for _, g := range []string{cg, filepath.Join(d.cpuParent, "wl_escape")} {
		if g == "wl_escape" {
			continue // no cgroup v1 cpu group
		}
		if _, err := os.Stat(g); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup %s left after Stop: %v", g, err)
		}
	}
}
