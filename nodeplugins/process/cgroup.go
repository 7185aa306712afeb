package process

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Cgroups. When the driver runs as root and a cgroup v2 hierarchy is
// mounted, each workload is started straight into its own cgroup
// (clone3 with CLONE_INTO_CGROUP), under
//
//	<cgroup2 mount>/berth-process/<first 12 hex of SHA-256 of StateDir>/<workload id>
//
// so that a child that left the workload's process group (setsid, setpgid)
// is still found. Stopping then also writes "1" to the cgroup's cgroup.kill
// and waits until cgroup.events says "populated 0"; the empty cgroup is
// removed once the workload is forgotten. The cgroup's path is persisted in
// the record and the handle. Without a usable hierarchy (not root, no
// cgroup2 mount, or the directory cannot be made) the driver logs it once
// and the process group alone decides, as in group.go.

// cgroupParent is the directory of this driver's workload cgroups; ""
// when cgroups are not used. It is made on first use.
func findCgroupParent(stateDir string) (string, error) {
	_, parent, err := cgroupParentIn(stateDir)
	return parent, err
}

// cgroupParentIn is findCgroupParent that also returns the mount point of
// the cgroup2 hierarchy.
func cgroupParentIn(stateDir string) (mount, parent string, err error) {
	if os.Geteuid() != 0 {
		return "", "", errors.New("the driver does not run as root")
	}
	mount, err = cgroup2Mount()
	if err != nil {
		return "", "", err
	}
	parent, err = makeCgroupParent(mount, stateDir)
	return mount, parent, err
}

// makeCgroupParent makes the parent of the workload cgroups of a driver on
// stateDir inside the hierarchy mounted at mount.
func makeCgroupParent(mount, stateDir string) (string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	parent := filepath.Join(mount, "berth-process", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", parent, err)
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("%s is not a cgroup: %w", parent, err)
	}
	return parent, nil
}

// cgroup2Mount returns the mount point of the cgroup v2 hierarchy, from
// /proc/self/mountinfo (the unified hierarchy of a hybrid setup counts).
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) > 0 && fs[0] == "cgroup2" {
			if f := strings.Fields(pre); len(f) >= 5 {
				return f[4], nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 hierarchy is mounted")
}

// makeCgroup creates (or empties and reuses) the cgroup of workload id
// under parent and returns its path and an open directory for
// SysProcAttr.CgroupFD; the caller closes it.
func makeCgroup(parent, id string) (string, *os.File, error) {
	path := filepath.Join(parent, id)
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", nil, fmt.Errorf("create cgroup %s: %w", path, err)
	}
	dir, err := os.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("open cgroup %s: %w", path, err)
	}
	return path, dir, nil
}

// cgroupPopulated reports whether the cgroup at path still holds a live
// process. A missing cgroup holds none.
func cgroupPopulated(path string) bool {
	if path == "" {
		return false
	}
	raw, err := os.ReadFile(filepath.Join(path, "cgroup.events"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}

// killCgroup writes "1" to the cgroup's cgroup.kill, which SIGKILLs every
// process in it. A missing cgroup is success.
func killCgroup(path string) error {
	if path == "" {
		return nil
	}
	err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill cgroup %s: %w", path, err)
	}
	return nil
}

// removeCgroup removes an empty cgroup; a missing one is success. It
// retries briefly, as the kernel may report a cgroup busy just after its
// last process died.
func removeCgroup(ctx context.Context, path string) error {
	if path == "" {
		return nil
	}
	var err error
	for range 50 {
		err = os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(procPollInterval):
		}
	}
	return fmt.Errorf("remove cgroup %s: %w", path, err)
}

// RemoveCgroups removes the cgroups a driver on stateDir made that hold no
// process any more, and their parent once it is empty; cgroups of running
// workloads stay. For uninstalling and for tests that throw state
// directories away. Without usable cgroups it does nothing.
func RemoveCgroups(ctx context.Context, stateDir string) error {
	parent, err := findCgroupParent(stateDir)
	if err != nil {
		return nil
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("remove cgroups: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if p := filepath.Join(parent, e.Name()); e.IsDir() && !cgroupPopulated(p) {
			errs = append(errs, removeCgroup(ctx, p))
		}
	}
	_ = os.Remove(parent)
	return errors.Join(errs...)
}

// Limits. A workload's MemoryBytes and CPUMillis are enforced through the
// memory and cpu controllers of its cgroup (memory.max, memory.swap.max 0, and
// cpu.max with a 100 ms period), written before the process is cloned into
// it. That needs both controllers in the cgroup v2 hierarchy (on a hybrid host
// they may be bound to cgroup v1 instead) and enabled down to the driver's
// parent (cgroup.subtree_control). When they cannot be, the driver logs why
// once, reports "none: <why>" as its Capabilities.ResourceLimits, and runs
// workloads without limits.

// cpuPeriodMicros is the cpu.max period.
const cpuPeriodMicros = 100_000

// enableLimits makes the memory and cpu controllers available to the
// workload cgroups under parent (inside the cgroup2 hierarchy mounted at
// mount): it checks cgroup.controllers of mount and enables both in
// cgroup.subtree_control of every directory from mount down to parent. It
// returns why it cannot, nil when limits work.
func enableLimits(mount, parent string) error {
	raw, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read the controllers of %s: %w", mount, err)
	}
	have := strings.Fields(string(raw))
	for _, c := range []string{"memory", "cpu"} {
		if !slices.Contains(have, c) {
			return fmt.Errorf("the cgroup v2 hierarchy at %s offers no %s controller (offers %q; on a hybrid host it may be bound to cgroup v1)", mount, c, strings.TrimSpace(string(raw)))
		}
	}
	rel, err := filepath.Rel(mount, parent)
	if err != nil {
		return err
	}
	dir := mount
	for _, part := range append([]string{""}, strings.Split(rel, string(filepath.Separator))...) {
		dir = filepath.Join(dir, part)
		ctl := filepath.Join(dir, "cgroup.subtree_control")
		cur, err := os.ReadFile(ctl)
		if err != nil {
			return fmt.Errorf("read %s: %w", ctl, err)
		}
		if f := strings.Fields(string(cur)); slices.Contains(f, "memory") && slices.Contains(f, "cpu") {
			continue
		}
		if err := os.WriteFile(ctl, []byte("+memory +cpu"), 0); err != nil {
			return fmt.Errorf("enable the memory and cpu controllers in %s: %w", ctl, err)
		}
	}
	return nil
}

// setLimits writes the limits of one run into its cgroup at path: memory.max
// and memory.swap.max (no swap under a memory limit, so that going over it is
// an OOM kill rather than swapping) from memoryBytes, cpu.max from cpuMillis;
// zero writes "max" (a reused cgroup keeps no limit of an earlier run).
func setLimits(path string, memoryBytes, cpuMillis int64) error {
	mem, swap := "max", "max"
	if memoryBytes > 0 {
		mem, swap = strconv.FormatInt(memoryBytes, 10), "0"
	}
	cpu := "max " + strconv.Itoa(cpuPeriodMicros)
	if cpuMillis > 0 {
		cpu = strconv.FormatInt(max(cpuMillis*cpuPeriodMicros/1000, 1000), 10) + " " + strconv.Itoa(cpuPeriodMicros)
	}
	if err := os.WriteFile(filepath.Join(path, "memory.max"), []byte(mem), 0); err != nil {
		return fmt.Errorf("set memory.max of %s: %w", path, err)
	}
	// memory.swap.max is absent without swap accounting: nothing to limit then.
	if err := os.WriteFile(filepath.Join(path, "memory.swap.max"), []byte(swap), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set memory.swap.max of %s: %w", path, err)
	}
	if err := os.WriteFile(filepath.Join(path, "cpu.max"), []byte(cpu), 0); err != nil {
		return fmt.Errorf("set cpu.max of %s: %w", path, err)
	}
	return nil
}

// oomKills returns the oom_kill counter of the cgroup at path's memory.events:
// how many of its processes the OOM killer ended since the cgroup was made. 0
// when the cgroup or the file is missing.
func oomKills(path string) int64 {
	if path == "" {
		return 0
	}
	raw, err := os.ReadFile(filepath.Join(path, "memory.events"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
