package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// A workload is started with Setsid, so its leader's pid is also the id of
// its process group and session, and every child it forks stays in that
// group unless it leaves on purpose. The driver stops a workload by
// signalling the group, never only the leader, and counts the workload as
// gone only when no live member of the group remains.
//
// Pid reuse. The kernel never hands out a pid that is still in use as a
// process group id, so while any member of the old group lives, its pgid
// cannot name anybody else's group. Once the group is empty the number may
// be reused; the driver tells that apart by the leader's start time: when
// /proc/<pgid> exists with another start time, the old group is gone (its
// number was free to be reused) and nothing is signalled.

// groupMaybeOurs reports whether pgid may still name the workload's group:
// its leader is alive with the recorded start time, or no process has that
// pid at all (the leader exited and the number was not reused).
func groupMaybeOurs(pgid int, leaderTicks uint64) bool {
	if pgid <= 1 {
		return false
	}
	st, err := readProcStat(pgid)
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	return st.StartTicks == leaderTicks
}

// groupMembers returns the live (not zombie) processes whose process group
// is pgid, read from /proc/<pid>/stat field 5.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[0] is field 3 (state), f[2] is field 5 (pgrp).
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// groupAlive reports whether the workload's group (pgid, led by a process
// started at leaderTicks) still has a live member.
// A live leader answers at once; only a group whose leader is gone is
// looked for in all of /proc.
func groupAlive(pgid int, leaderTicks uint64) bool {
	if alive(pgid, leaderTicks) {
		return true
	}
	return groupMaybeOurs(pgid, leaderTicks) && len(groupMembers(pgid)) > 0
}

// signalWorkloadGroup sends sig to the workload's whole process group when
// the group is still the workload's (see groupMaybeOurs).
func signalWorkloadGroup(pgid int, leaderTicks uint64, sig syscall.Signal) {
	if groupMaybeOurs(pgid, leaderTicks) {
		_ = syscall.Kill(-pgid, sig) // ESRCH: the group is already empty
	}
}

// procSet is everything of one run of a workload that a stop must end: its
// process group and, when it has them, its cgroups.
type procSet struct {
	pgid      int
	ticks     uint64 // the leader's start time
	cgroup    string // "" when the run has no cgroup
	cgroupCPU string // the cgroup v1 cpu group; "" otherwise
}

func (r *record) procs() procSet {
	return procSet{pgid: r.pgid(), ticks: r.StartTicks, cgroup: r.Cgroup, cgroupCPU: r.CgroupCPU}
}

// alive reports whether anything of the run is left: a live member of its
// process group or a process in its cgroup.
func (p procSet) alive() bool { return groupAlive(p.pgid, p.ticks) || cgroupPopulated(p.cgroup) }

// signal sends sig to the process group and to every process of the cgroup
// (also those that left the group).
func (p procSet) signal(sig syscall.Signal) {
	signalWorkloadGroup(p.pgid, p.ticks, sig)
	signalCgroup(p.cgroup, sig)
}

// removeCgroups removes the run's cgroups, once nothing of it is left.
func (p procSet) removeCgroups(ctx context.Context) error {
	return errors.Join(removeCgroup(ctx, p.cgroup), removeCgroup(ctx, p.cgroupCPU))
}

// ErrGroupSurvived is returned (wrapped) by Stop and Start when processes
// of a workload (its process group or its cgroup) outlive SIGKILL for 5 s,
// e.g. stuck in uninterruptible sleep. It carries code unavailable: the
// call may be retried.
var ErrGroupSurvived = abierrors.New(abierrors.Unavailable, "workload processes survived SIGKILL")

// waitGone waits until nothing of the run is left, looking every
// procPollInterval, for at most timeout; a resend other than 0 is sent again
// at every look (a v1 cgroup has no atomic kill: a process forked while it
// was signalled is caught at the next). It returns ctx's error when ctx
// ends first, and an error naming the remaining group members after timeout.
func (p procSet) waitGone(ctx context.Context, timeout time.Duration, resend syscall.Signal) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(procPollInterval)
	defer tick.Stop()
	for p.alive() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("process group %d (members %v, cgroup %q) still running after %s", p.pgid, groupMembers(p.pgid), p.cgroup, timeout)
		case <-tick.C:
			if resend != 0 {
				p.signal(resend)
			}
		}
	}
	return nil
}

// kill ends what is left of the run: SIGKILL to the group and the cgroup,
// then a bounded wait (killWait) until nothing is left. A run of which
// nothing is left, or whose group number was reused, is success.
func (p procSet) kill(ctx context.Context) error {
	if !p.alive() {
		return nil
	}
	p.signal(syscall.SIGKILL)
	if err := p.waitGone(ctx, killWait, syscall.SIGKILL); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w: %w", ErrGroupSurvived, err)
	}
	return nil
}
