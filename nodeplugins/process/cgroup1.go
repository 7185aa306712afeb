package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Cgroup v1. On a host whose memory and cpu controllers are bound to cgroup
// v1 (v1 only, or hybrid with an empty unified hierarchy) each workload gets
// a group of its own in both hierarchies, under parents the driver owns:
//
//	<memory mount>/berth-process/<first 12 hex of SHA-256 of StateDir>/<workload id>
//	<cpu mount>/berth-process/<same>/<workload id>
//
// The memory group is the workload's Cgroup (what stopping and OOM detection
// read); the cpu group is its CgroupCPU. Limits, written before the process
// runs: memory.limit_in_bytes = MemoryBytes and, where swap is accounted,
// memory.memsw.limit_in_bytes the same (memory plus swap: swapping does not
// dodge the limit), else memory.swappiness 0; cpu.cfs_period_us = 100000 and
// cpu.cfs_quota_us = CPUMillis × 100 (at least 1 ms). No limit writes -1 (and
// the parent's swappiness), so a reused group keeps nothing of an earlier run.
//
// Placement. v1 has no CLONE_INTO_CGROUP, so the process is started stopped:
// the child asks to be traced (PTRACE_TRACEME, the last step before execve),
// the kernel stops it with SIGTRAP once execve succeeded and before the first
// instruction of the workload's program, the driver writes its pid to
// cgroup.procs of both groups and detaches (PTRACE_DETACH without a signal),
// and only then does the workload run. The goroutine that starts it is locked
// to its thread, since only the tracing thread may detach. Whatever the
// workload allocates or forks is so limited from the start; only the pages
// execve itself set up stay charged to the driver's group. Kernels or
// sandboxes that forbid ptrace (kernel.yama.ptrace_scope 3) rule cgroup v1 out
// at start.
//
// OOM: the oom_kill counter of memory.oom_control (kernel 4.13 and later);
// before that, memory.failcnt grown during the run together with an exit by
// SIGKILL (see oomCount).

// cgroup1Mount returns the mount point of the cgroup v1 hierarchy that has
// controller bound (e.g. "cpu" also where it is mounted as "cpu,cpuacct"),
// from /proc/self/mountinfo.
func cgroup1Mount(controller string) (string, error) {
	m, ok, err := mountPoint(func(fs []string) bool {
		// fs: fstype source super-options
		return len(fs) >= 3 && fs[0] == "cgroup" && slices.Contains(strings.Split(fs[2], ","), controller)
	})
	if err != nil || ok {
		return m, err
	}
	return "", fmt.Errorf("no cgroup v1 hierarchy with the %s controller is mounted", controller)
}

// makeCgroup1Parents makes the parents of a driver on stateDir in the memory
// and cpu hierarchies of cgroup v1, and returns them, or why cgroup v1 cannot
// be used: a hierarchy not mounted, not writable, without the limit files, or
// ptrace (which placing a process needs) forbidden.
func makeCgroup1Parents(stateDir string) (mem, cpu string, err error) {
	memMount, err := cgroup1Mount("memory")
	if err != nil {
		return "", "", err
	}
	cpuMount, err := cgroup1Mount("cpu")
	if err != nil {
		return "", "", err
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(raw)) == "3" {
		return "", "", errors.New("ptrace is forbidden (kernel.yama.ptrace_scope 3), and the driver needs it to place a process in its groups before it runs")
	}
	mem, err = makeCgroupParent(memMount, stateDir)
	if err != nil {
		return "", "", err
	}
	cpu, err = makeCgroupParent(cpuMount, stateDir)
	if err != nil {
		return "", "", err
	}
	for _, f := range []string{filepath.Join(mem, "memory.limit_in_bytes"), filepath.Join(mem, "memory.oom_control"), filepath.Join(cpu, "cpu.cfs_quota_us"), filepath.Join(cpu, "cpu.cfs_period_us")} {
		if _, err := os.Stat(f); err != nil {
			return "", "", fmt.Errorf("the kernel offers no %s: %w", filepath.Base(f), err)
		}
	}
	return mem, cpu, nil
}

// makeCgroup1 creates (or reuses) the memory and cpu groups of workload id
// under the parents memParent and cpuParent.
func makeCgroup1(memParent, cpuParent, id string) (mem, cpu string, err error) {
	mem, cpu = filepath.Join(memParent, id), filepath.Join(cpuParent, id)
	for _, p := range []string{mem, cpu} {
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", "", fmt.Errorf("create cgroup %s: %w", p, err)
		}
	}
	return mem, cpu, nil
}

// setLimits1 writes the limits of one run into its memory group mem and cpu
// group cpu (see the comment at the top of this file).
func setLimits1(mem, cpu string, memoryBytes, cpuMillis int64) error {
	write := func(dir, file, v string) error {
		if err := writeCgroupFile(filepath.Join(dir, file), v); err != nil {
			return fmt.Errorf("set %s of %s to %s: %w", file, dir, v, err)
		}
		return nil
	}
	limit := "-1"
	if memoryBytes > 0 {
		limit = strconv.FormatInt(memoryBytes, 10)
	}
	_, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes"))
	memsw := err == nil
	// The kernel keeps memsw >= the memory limit at every write: lift memsw
	// first, so that the memory limit may move either way, then set it equal.
	if memsw {
		if err := write(mem, "memory.memsw.limit_in_bytes", "-1"); err != nil {
			return err
		}
	}
	if err := write(mem, "memory.limit_in_bytes", limit); err != nil {
		return err
	}
	if memsw {
		if err := write(mem, "memory.memsw.limit_in_bytes", limit); err != nil {
			return err
		}
	} else {
		// Without swap accounting: no swapping under a limit; without a limit,
		// what a new group inherits.
		swappiness := "0"
		if memoryBytes == 0 {
			raw, err := os.ReadFile(filepath.Join(filepath.Dir(mem), "memory.swappiness"))
			if err != nil {
				return fmt.Errorf("read the swappiness of %s: %w", filepath.Dir(mem), err)
			}
			swappiness = strings.TrimSpace(string(raw))
		}
		if err := write(mem, "memory.swappiness", swappiness); err != nil {
			return err
		}
	}
	quota := "-1"
	if cpuMillis > 0 {
		quota = strconv.FormatInt(max(cpuMillis*cpuPeriodMicros/1000, 1000), 10)
	}
	if err := write(cpu, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodMicros)); err != nil {
		return err
	}
	return write(cpu, "cpu.cfs_quota_us", quota)
}

// placeStopped places the process pid, started with SysProcAttr.Ptrace and
// so stopped at its execve, in the cgroups groups (its pid written to each
// cgroup.procs) and lets it run. It must be called on the thread that
// started the process (runtime.LockOSThread). On an error the caller kills
// the process: it has not run.
func placeStopped(pid int, groups ...string) error {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for process %d to stop at its exec: %w", pid, err)
		}
		break
	}
	if !ws.Stopped() {
		return fmt.Errorf("process %d ended before it ran (wait status %#x)", pid, uint32(ws))
	}
	if sig := ws.StopSignal(); sig != syscall.SIGTRAP {
		return fmt.Errorf("process %d stopped by %v before its exec", pid, sig)
	}
	for _, g := range groups {
		if err := writeCgroupFile(filepath.Join(g, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("place process %d in cgroup %s: %w", pid, g, err)
		}
	}
	if err := syscall.PtraceDetach(pid); err != nil {
		return fmt.Errorf("let process %d run once in its cgroups: %w", pid, err)
	}
	return nil
}
