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
	"syscall"
	"time"

	"github.com/berthhq/berth/sdk/runtime"
)

// Cgroups. When the driver runs as root each workload gets a cgroup of its
// own, so that a child that left the workload's process group (setsid,
// setpgid) is still found, and so that its limits can be enforced. New
// chooses once, by what the host offers (chooseCgroups):
//
//   - cgroup2: a cgroup v2 hierarchy offering the memory and cpu controllers.
//     The workload is cloned straight into
//     <cgroup2 mount>/berth-process/<first 12 hex of SHA-256 of StateDir>/<workload id>
//     (clone3 with CLONE_INTO_CGROUP). Stopping writes "1" to cgroup.kill and
//     waits for "populated 0" in cgroup.events.
//   - cgroup1: the memory and cpu hierarchies of cgroup v1 (a v1-only or hybrid
//     host), mounted and writable. The workload gets a group of that name in
//     each, and is placed in both before it runs (cgroup1.go). Stopping signals
//     every process of cgroup.procs until none is left.
//   - neither: limits are not enforced ("none: <why>"); when a cgroup v2
//     hierarchy is mounted at all (the unified one of a hybrid host, without
//     controllers) workloads still get a v2 cgroup there, for stopping.
//
// The cgroups' paths are persisted in the record and the handle; the empty
// ones are removed when the workload is forgotten, when the driver closes,
// and at start (what a crashed driver left). Without root or any usable
// hierarchy the driver logs it once and the process group alone decides, as
// in group.go.

// cgroupSetup is what chooseCgroups found.
type cgroupSetup struct {
	// parent is the directory of the workloads' cgroups: in the cgroup v2
	// hierarchy, or in the memory hierarchy of cgroup v1; "" without cgroups.
	parent string
	// cpuParent is the directory of the workloads' groups in the cpu
	// hierarchy of cgroup v1; "" otherwise.
	cpuParent string
	// limits is Capabilities.ResourceLimits: runtime.LimitsCgroup2,
	// runtime.LimitsCgroup1 or "none: <why>".
	limits string
}

// chooseCgroups picks how workloads of a driver on stateDir are placed in
// cgroups and limited: cgroup v2 with the memory and cpu controllers, else
// the memory and cpu hierarchies of cgroup v1, else none (with why; a cgroup
// v2 hierarchy without the controllers still serves for stopping). It makes
// the parent directories it chose.
func chooseCgroups(stateDir string) cgroupSetup {
	if os.Geteuid() != 0 {
		return cgroupSetup{limits: "none: the driver does not run as root"}
	}
	mount, why2 := cgroup2Mount()
	if why2 == nil {
		if why2 = cgroup2Offers(mount); why2 == nil {
			parent, err := makeCgroupParent(mount, stateDir)
			if err == nil {
				err = enableLimits(mount, parent)
			}
			if err == nil {
				return cgroupSetup{parent: parent, limits: runtime.LimitsCgroup2}
			}
			why2 = err
		}
	}
	mem, cpu, why1 := makeCgroup1Parents(stateDir)
	if why1 == nil {
		return cgroupSetup{parent: mem, cpuParent: cpu, limits: runtime.LimitsCgroup1}
	}
	s := cgroupSetup{limits: fmt.Sprintf("none: cgroup v2: %v; cgroup v1: %v", why2, why1)}
	if mount != "" {
		if parent, err := makeCgroupParent(mount, stateDir); err == nil {
			s.parent = parent
		}
	}
	return s
}

// parentIn is the directory of the workload cgroups of a driver on stateDir
// inside the hierarchy mounted at mount.
func parentIn(mount, stateDir string) (string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(mount, "berth-process", hex.EncodeToString(sum[:6])), nil
}

// makeCgroupParent makes the parent of the workload cgroups of a driver on
// stateDir inside the hierarchy mounted at mount, and checks the driver may
// write to it.
func makeCgroupParent(mount, stateDir string) (string, error) {
	parent, err := parentIn(mount, stateDir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", parent, err)
	}
	// Opened for writing, not written: a read-only mount refuses here even
	// when the directory was already there.
	f, err := os.OpenFile(filepath.Join(parent, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return "", fmt.Errorf("%s is not a writable cgroup: %w", parent, err)
	}
	f.Close()
	return parent, nil
}

// cgroupParents returns the parent directories a driver on stateDir may have
// made, in every hierarchy mounted (v2, and the memory and cpu ones of v1),
// that exist. It makes nothing.
func cgroupParents(stateDir string) []string {
	var mounts []string
	if m, err := cgroup2Mount(); err == nil {
		mounts = append(mounts, m)
	}
	for _, c := range []string{"memory", "cpu"} {
		if m, err := cgroup1Mount(c); err == nil {
			mounts = append(mounts, m)
		}
	}
	var out []string
	for _, m := range mounts {
		if p, err := parentIn(m, stateDir); err == nil {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				out = append(out, p)
			}
		}
	}
	return out
}

// cgroup2Mount returns the mount point of the cgroup v2 hierarchy, from
// /proc/self/mountinfo (the unified hierarchy of a hybrid setup counts).
func cgroup2Mount() (string, error) {
	m, ok, err := mountPoint(func(fs []string) bool { return len(fs) > 0 && fs[0] == "cgroup2" })
	if err != nil || ok {
		return m, err
	}
	return "", errors.New("no cgroup2 hierarchy is mounted")
}

// mountPoint returns the mount point of the first mount in /proc/self/mountinfo whose fields
// after the " - " separator (fstype, source, super options) match says, and false when none
// does.
func mountPoint(match func(fs []string) bool) (string, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !match(strings.Fields(post)) {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return f[4], true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", false, err
	}
	return "", false, nil
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
// process: "populated 1" in cgroup.events (v2), or a live process in its
// cgroup.procs (v1, which has no cgroup.events). A missing cgroup holds none.
func cgroupPopulated(path string) bool {
	if path == "" {
		return false
	}
	raw, err := os.ReadFile(filepath.Join(path, "cgroup.events"))
	if err != nil {
		return len(cgroupProcs(path)) > 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}

// writeCgroupFile writes v to the cgroup file at path, which must exist: a
// file the kernel does not offer is an error wrapping os.ErrNotExist, never a
// file created in its place.
func writeCgroupFile(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cgroupProcs returns the live (not zombie) processes listed in the
// cgroup.procs of the cgroup at path; none for a missing cgroup.
func cgroupProcs(path string) []int {
	raw, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		if st, err := readProcStat(pid); err == nil && st.State != 'Z' && st.State != 'X' {
			out = append(out, pid)
		}
	}
	return out
}

// signalCgroup sends sig to every process of the cgroup at path. SIGKILL
// goes through cgroup.kill where the kernel has it (v2), which also catches
// a process forked meanwhile; otherwise (v1, or a failed write) each
// process of cgroup.procs is signalled, and a caller that must end them all
// repeats it until none is left. A missing cgroup is nothing to do.
func signalCgroup(path string, sig syscall.Signal) {
	if path == "" {
		return
	}
	if sig == syscall.SIGKILL && writeCgroupFile(filepath.Join(path, "cgroup.kill"), "1") == nil {
		return
	}
	for _, pid := range cgroupProcs(path) {
		_ = syscall.Kill(pid, sig) // ESRCH: it ended meanwhile
	}
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
// process any more (in every hierarchy it may have used), and their parents
// once they are empty; cgroups of running workloads stay. For uninstalling
// and for tests that throw state directories away. Without usable cgroups it
// does nothing.
func RemoveCgroups(ctx context.Context, stateDir string) error {
	var errs []error
	for _, parent := range cgroupParents(stateDir) {
		errs = append(errs, removeEmptyCgroups(ctx, parent))
		_ = os.Remove(parent)
	}
	return errors.Join(errs...)
}

// removeEmptyCgroups removes the cgroups under parent that hold no live
// process.
func removeEmptyCgroups(ctx context.Context, parent string) error {
	entries, err := os.ReadDir(parent)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove cgroups: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if p := filepath.Join(parent, e.Name()); e.IsDir() && !cgroupPopulated(p) {
			errs = append(errs, removeCgroup(ctx, p))
		}
	}
	return errors.Join(errs...)
}

// Limits. A workload's MemoryBytes and CPUMillis are enforced through the
// memory and cpu controllers of its cgroup, written before the process runs in
// it. With cgroup v2 (here): memory.max, memory.swap.max 0, and cpu.max with a
// 100 ms period, which needs both controllers in the v2 hierarchy and enabled
// down to the driver's parent (cgroup.subtree_control). With cgroup v1 see
// cgroup1.go. When neither can be used, the driver logs why once, reports
// "none: <why>" as its Capabilities.ResourceLimits, and runs workloads without
// limits.

// cpuPeriodMicros is the CPU quota period: of cpu.max (v2) and cpu.cfs_period_us (v1).
const cpuPeriodMicros = 100_000

// enableLimits makes the memory and cpu controllers available to the
// workload cgroups under parent (inside the cgroup2 hierarchy mounted at
// mount): it checks cgroup.controllers of mount and enables both in
// cgroup.subtree_control of every directory from mount down to parent. It
// returns why it cannot, nil when limits work.
func enableLimits(mount, parent string) error {
	if err := cgroup2Offers(mount); err != nil {
		return err
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
		if err := writeCgroupFile(ctl, "+memory +cpu"); err != nil {
			return fmt.Errorf("enable the memory and cpu controllers in %s: %w", ctl, err)
		}
	}
	return nil
}

// cgroup2Offers returns why the cgroup v2 hierarchy mounted at mount cannot
// enforce limits (its cgroup.controllers lacks memory or cpu), nil when it can.
func cgroup2Offers(mount string) error {
	raw, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read the controllers of %s: %w", mount, err)
	}
	have := strings.Fields(string(raw))
	for _, c := range []string{"memory", "cpu"} {
		if !slices.Contains(have, c) {
			return fmt.Errorf("the hierarchy at %s offers no %s controller (offers %q; on a hybrid host it may be bound to cgroup v1)", mount, c, strings.TrimSpace(string(raw)))
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
	if err := writeCgroupFile(filepath.Join(path, "memory.max"), mem); err != nil {
		return fmt.Errorf("set memory.max of %s: %w", path, err)
	}
	// memory.swap.max is absent without swap accounting: nothing to limit then.
	if err := writeCgroupFile(filepath.Join(path, "memory.swap.max"), swap); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set memory.swap.max of %s: %w", path, err)
	}
	if err := writeCgroupFile(filepath.Join(path, "cpu.max"), cpu); err != nil {
		return fmt.Errorf("set cpu.max of %s: %w", path, err)
	}
	return nil
}

// oomCount returns how many processes of the cgroup at path the OOM killer
// ended since the cgroup was made: oom_kill of memory.events (v2) or of
// memory.oom_control (v1, kernel 4.13 and later). On an older v1 kernel,
// whose memory.oom_control has no oom_kill, it returns memory.failcnt (how
// often the group hit its limit) and exact false: only a run that also died
// of SIGKILL counts as OOM-killed then. 0 (exact) when the cgroup or the
// files are missing.
func oomCount(path string) (n int64, exact bool) {
	if path == "" {
		return 0, true
	}
	if raw, err := os.ReadFile(filepath.Join(path, "memory.events")); err == nil {
		n, _ := counter(raw, "oom_kill")
		return n, true
	}
	raw, err := os.ReadFile(filepath.Join(path, "memory.oom_control"))
	if err != nil {
		return 0, true
	}
	if n, ok := counter(raw, "oom_kill"); ok {
		return n, true
	}
	raw, err = os.ReadFile(filepath.Join(path, "memory.failcnt"))
	if err != nil {
		return 0, true
	}
	n, _ = strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	return n, false
}

// counter reads the value of key from "key value" lines.
func counter(raw []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
