package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/runtime"
)

// limitFiles returns, for a driver enforcing limits, the cgroup files of workload id and what
// they must hold for memoryBytes and cpuMillis (as the kernel reads them back); it fails the
// test when the driver enforces none, saying what the host lacks.
func limitFiles(t *testing.T, d *Driver, id string, memoryBytes, cpuMillis int64) map[string]string {
	t.Helper()
	num := func(n int64, none string) string {
		if n == 0 {
			return none
		}
		return strconv.FormatInt(n, 10)
	}
	quota := int64(0)
	if cpuMillis > 0 {
		quota = max(cpuMillis*100, 1000)
	}
	switch d.limits {
	case runtime.LimitsCgroup2:
		cg := filepath.Join(d.cgroupParent, id)
		cpu := "max 100000"
		if quota > 0 {
			cpu = strconv.FormatInt(quota, 10) + " 100000"
		}
		return map[string]string{filepath.Join(cg, "memory.max"): num(memoryBytes, "max"), filepath.Join(cg, "cpu.max"): cpu}
	case runtime.LimitsCgroup1:
		mem, cpu := filepath.Join(d.cgroupParent, id), filepath.Join(d.cpuParent, id)
		// The kernel reads "no limit" back as the largest page-aligned count.
		unlimited, err := os.ReadFile(filepath.Join(d.cgroupParent, "memory.limit_in_bytes"))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			filepath.Join(mem, "memory.limit_in_bytes"): num(memoryBytes, strings.TrimSpace(string(unlimited))),
			filepath.Join(cpu, "cpu.cfs_period_us"):     "100000",
			filepath.Join(cpu, "cpu.cfs_quota_us"):      num(quota, "-1"),
		}
		if _, err := os.Stat(filepath.Join(d.cgroupParent, "memory.memsw.limit_in_bytes")); err == nil { // the group may not exist yet
			want[filepath.Join(mem, "memory.memsw.limit_in_bytes")] = want[filepath.Join(mem, "memory.limit_in_bytes")]
		} else if memoryBytes > 0 {
			want[filepath.Join(mem, "memory.swappiness")] = "0"
		}
		return want
	}
	t.Fatalf("memory limits cannot be enforced on this host (need root, and cgroup v2 or v1 with the memory and cpu controllers): the driver reports %q", d.limits)
	return nil
}

// checkFiles fails the test unless every file holds what want says.
func checkFiles(t *testing.T, want map[string]string) {
	t.Helper()
	for file, v := range want {
		raw, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(raw)) != v {
			t.Fatalf("%s = %q, %v; want %q", file, raw, err, v)
		}
	}
}

// TestMemoryLimitOOM runs a workload that allocates without bound under a 32 MiB limit: the
// kernel's OOM killer ends it inside its cgroup, and the driver reports it exited with
// ExitReason "oom". It needs root and the memory and cpu controllers of cgroup v2, or else of
// cgroup v1 (a hybrid host: then it runs the v1 path); without them it fails and says what the
// host lacks (the driver then runs workloads unlimited, which is what the test would otherwise
// pass over silently).
func TestMemoryLimitOOM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	desc, err := d.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if desc.Capabilities.ResourceLimits != d.limits {
		t.Fatalf("Describe reports limits %q, the driver uses %q", desc.Capabilities.ResourceLimits, d.limits)
	}
	t.Logf("resource limits: %s", d.limits)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const limit = 32 << 20
	want := limitFiles(t, d, "wl_hog", limit, 500)
	r, err := d.Start(context.Background(), &runtime.StartRequest{WorkloadID: "wl_hog", Command: []string{exe},
		Env: map[string]string{modeEnv: "hog"}, WorkDir: f.dir, LogPath: f.logPath("wl_hog"), MemoryBytes: limit, CPUMillis: 500})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pid := r.State.PID
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	checkFiles(t, want)
	var st *runtime.WorkloadState
	waitFor(t, 60*time.Second, "the workload to exit", func() bool {
		st = inspect(t, d, "wl_hog")
		return st.State == runtime.StateExited
	})
	if st.ExitReason != runtime.ExitReasonOOM || st.ExitCode != 128+9 {
		log, _ := os.ReadFile(f.logPath("wl_hog"))
		t.Fatalf("exited with code %d, reason %q; want 137 and %q (pid %d, log %q)", st.ExitCode, st.ExitReason, runtime.ExitReasonOOM, pid, log)
	}
	// The reason is persisted: a driver started again over the same state directory reads it.
	d.Close()
	again := f.driver()
	if st := inspect(t, again, "wl_hog"); st.ExitReason != runtime.ExitReasonOOM {
		t.Fatalf("after a driver restart the exit reason is %q, want %q", st.ExitReason, runtime.ExitReasonOOM)
	}
}

// TestCgroupPlacementAndReuse checks that a workload runs in its cgroups from the start (its
// /proc/<pid>/cgroup names them: for cgroup v1 both its memory and its cpu group), that a
// restart in place rewrites the limits of the reused cgroups in either direction (the kernel
// refuses a cgroup v1 memory limit above memsw, so the order of the writes matters), and that
// Stop removes the cgroups.
func TestCgroupPlacementAndReuse(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(mode string, memoryBytes, cpuMillis int64) int {
		t.Helper()
		want := limitFiles(t, d, "wl_cg", memoryBytes, cpuMillis)
		r, err := d.Start(context.Background(), &runtime.StartRequest{WorkloadID: "wl_cg", Command: []string{exe},
			Env: map[string]string{modeEnv: mode}, WorkDir: f.dir, LogPath: f.logPath("wl_cg"), MemoryBytes: memoryBytes, CPUMillis: cpuMillis})
		if err != nil {
			t.Fatalf("Start with memory %d, cpu %d: %v", memoryBytes, cpuMillis, err)
		}
		pid := r.State.PID
		t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
		checkFiles(t, want)
		return pid
	}
	exited := func() {
		t.Helper()
		waitFor(t, 10*time.Second, "exit", func() bool {
			st := inspect(t, d, "wl_cg")
			return st.State == runtime.StateExited && st.ExitCode == 3
		})
	}
	start("exit3", 32<<20, 250)
	exited()
	start("exit3", 64<<20, 0) // a higher memory limit than the group had
	exited()
	start("exit3", 0, 3000) // none at all, a higher quota
	exited()
	pid := start("sleep", 48<<20, 1)
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]string{} // controller list -> path
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				groups[c] = parts[2]
			}
		}
	}
	type place struct{ key, mount, dir string }
	var wantIn []place
	if d.cpuParent != "" {
		memMount, _ := cgroup1Mount("memory")
		cpuMount, _ := cgroup1Mount("cpu")
		wantIn = []place{{"memory", memMount, filepath.Join(d.cgroupParent, "wl_cg")}, {"cpu", cpuMount, filepath.Join(d.cpuParent, "wl_cg")}}
	} else {
		mount, _ := cgroup2Mount()
		wantIn = []place{{"", mount, filepath.Join(d.cgroupParent, "wl_cg")}}
	}
	for _, p := range wantIn {
		if got := filepath.Join(p.mount, groups[p.key]); got != p.dir {
			t.Fatalf("the workload's %q cgroup is %s, want %s (/proc/%d/cgroup %q)", p.key, got, p.dir, pid, raw)
		}
	}
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_cg", Timeout: time.Second}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, p := range wantIn {
		if _, err := os.Stat(p.dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup %s left after Stop: %v", p.dir, err)
		}
	}
}

// TestLeftoverCgroupsRemovedAtStart: the empty cgroups a driver that crashed left behind are
// removed by the next driver on the state directory; those of a running workload stay.
func TestLeftoverCgroupsRemovedAtStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	if d.cgroupParent == "" {
		t.Fatalf("this test needs root and a cgroup hierarchy: the driver reports %q", d.limits)
	}
	f.start(d, "wl_live", "sleep", nil)
	parents := []string{d.cgroupParent}
	if d.cpuParent != "" {
		parents = append(parents, d.cpuParent)
	}
	d.Close()
	for _, p := range parents {
		if err := os.Mkdir(filepath.Join(p, "wl_gone"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.driver()
	for _, p := range parents {
		if _, err := os.Stat(filepath.Join(p, "wl_gone")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("leftover cgroup %s not removed at start: %v", filepath.Join(p, "wl_gone"), err)
		}
		if _, err := os.Stat(filepath.Join(p, "wl_live")); err != nil {
			t.Fatalf("cgroup of a running workload removed at start: %v", err)
		}
	}
}

// TestNoLimitsSaysWhy checks a driver that cannot enforce limits says why in its capabilities,
// and still runs a workload that asks for them (unlimited, as documented).
func TestNoLimitsSaysWhy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	d.limits = "none: " + "forced for the test" // what New sets when the controllers are missing
	desc, err := d.Describe(context.Background())
	if err != nil || !strings.HasPrefix(desc.Capabilities.ResourceLimits, "none: ") {
		t.Fatalf("Describe = %+v, %v; want limits \"none: <why>\"", desc, err)
	}
	exe, _ := os.Executable()
	if _, err := d.Start(context.Background(), &runtime.StartRequest{WorkloadID: "wl_free", Command: []string{exe},
		Env: map[string]string{modeEnv: "exit3"}, WorkDir: f.dir, LogPath: f.logPath("wl_free"), MemoryBytes: 1 << 20}); err != nil {
		t.Fatalf("Start with a limit the driver cannot enforce: %v", err)
	}
	waitFor(t, 10*time.Second, "exit", func() bool {
		st := inspect(t, d, "wl_free")
		return st.State == runtime.StateExited && st.ExitCode == 3 && st.ExitReason == ""
	})
}

// TestLimitFilesAndOOMCount checks what setLimits writes for each request and how the oom_kill
// count is read, on files laid out as a cgroup v2 cgroup's (the kernel's own files need the
// controllers TestMemoryLimitOOM checks for).
func TestLimitFilesAndOOMCount(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	read := func(name string) string {
		raw, _ := os.ReadFile(filepath.Join(dir, name))
		return string(raw)
	}
	for _, f := range []string{"memory.max", "memory.swap.max", "cpu.max"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := setLimits(dir, 64<<20, 250); err != nil {
		t.Fatal(err)
	}
	if read("memory.max") != "67108864" || read("memory.swap.max") != "0" || read("cpu.max") != "25000 100000" {
		t.Fatalf("limits written: memory.max %q swap %q cpu.max %q", read("memory.max"), read("memory.swap.max"), read("cpu.max"))
	}
	if err := setLimits(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	if read("memory.max") != "max" || read("memory.swap.max") != "max" || read("cpu.max") != "max 100000" {
		t.Fatalf("no limits written: memory.max %q swap %q cpu.max %q", read("memory.max"), read("memory.swap.max"), read("cpu.max"))
	}
	if err := setLimits(dir, 0, 1); err != nil || read("cpu.max") != "1000 100000" {
		t.Fatalf("a 1-millicore limit: cpu.max %q, %v; want the kernel's 1 ms floor", read("cpu.max"), err)
	}
	if n, exact := oomCount(dir); n != 0 || !exact {
		t.Fatalf("oomCount without memory.events = %d, %v", n, exact)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, exact := oomCount(dir); n != 2 || !exact {
		t.Fatalf("oomCount = %d, %v; want 2, exact", n, exact)
	}
	r := record{Cgroup: dir, OOMKillBase: 2}
	if r.noteOOM(); r.ExitReason != "" {
		t.Fatal("exit reason oom without a kill during the run")
	}
	r.OOMKillBase = 1
	if r.noteOOM(); r.ExitReason != runtime.ExitReasonOOM {
		t.Fatalf("exit reason %q after a kill during the run, want oom", r.ExitReason)
	}
}

// TestCgroup1LimitFilesAndOOMCount checks what setLimits1 writes into a workload's cgroup v1
// memory and cpu groups (the CPU quota and period, memory and memory+swap limits, or
// swappiness where swap is not accounted) and how the OOM count is read from
// memory.oom_control, or from memory.failcnt on kernels older than its oom_kill line, on files
// laid out as the groups'.
func TestCgroup1LimitFilesAndOOMCount(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mem, cpu := filepath.Join(root, "memory", "wl"), filepath.Join(root, "cpu", "wl")
	files := map[string]string{
		filepath.Join(mem, "memory.limit_in_bytes"):        "",
		filepath.Join(mem, "memory.memsw.limit_in_bytes"):  "",
		filepath.Join(mem, "memory.swappiness"):            "60",
		filepath.Join(root, "memory", "memory.swappiness"): "30",
		filepath.Join(cpu, "cpu.cfs_period_us"):            "",
		filepath.Join(cpu, "cpu.cfs_quota_us"):             "",
	}
	for f, v := range files {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dir, name string) string {
		raw, _ := os.ReadFile(filepath.Join(dir, name))
		return string(raw)
	}
	if err := setLimits1(mem, cpu, 64<<20, 250); err != nil {
		t.Fatal(err)
	}
	if read(cpu, "cpu.cfs_period_us") != "100000" || read(cpu, "cpu.cfs_quota_us") != "25000" {
		t.Fatalf("cpu files: period %q quota %q; want 100000 and 25000", read(cpu, "cpu.cfs_period_us"), read(cpu, "cpu.cfs_quota_us"))
	}
	if read(mem, "memory.limit_in_bytes") != "67108864" || read(mem, "memory.memsw.limit_in_bytes") != "67108864" || read(mem, "memory.swappiness") != "60" {
		t.Fatalf("memory files: limit %q memsw %q swappiness %q", read(mem, "memory.limit_in_bytes"), read(mem, "memory.memsw.limit_in_bytes"), read(mem, "memory.swappiness"))
	}
	if err := setLimits1(mem, cpu, 0, 1); err != nil {
		t.Fatal(err)
	}
	if read(cpu, "cpu.cfs_quota_us") != "1000" || read(mem, "memory.limit_in_bytes") != "-1" || read(mem, "memory.memsw.limit_in_bytes") != "-1" {
		t.Fatalf("no memory limit, 1 millicore: quota %q (want the kernel's 1 ms floor), limit %q, memsw %q", read(cpu, "cpu.cfs_quota_us"), read(mem, "memory.limit_in_bytes"), read(mem, "memory.memsw.limit_in_bytes"))
	}
	if err := setLimits1(mem, cpu, 0, 0); err != nil || read(cpu, "cpu.cfs_quota_us") != "-1" {
		t.Fatalf("no CPU limit: quota %q, %v; want -1", read(cpu, "cpu.cfs_quota_us"), err)
	}
	// Without swap accounting there is no memsw: swappiness 0 under a limit, the parent's without.
	if err := os.Remove(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err != nil {
		t.Fatal(err)
	}
	if err := setLimits1(mem, cpu, 8<<20, 0); err != nil || read(mem, "memory.swappiness") != "0" || read(mem, "memory.limit_in_bytes") != "8388608" {
		t.Fatalf("limit without memsw: swappiness %q limit %q, %v", read(mem, "memory.swappiness"), read(mem, "memory.limit_in_bytes"), err)
	}
	if err := setLimits1(mem, cpu, 0, 0); err != nil || read(mem, "memory.swappiness") != "30" {
		t.Fatalf("no limit without memsw: swappiness %q, %v; want the parent's 30", read(mem, "memory.swappiness"), err)
	}

	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(mem, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
	write("memory.failcnt", "40\n")
	if n, exact := oomCount(mem); n != 3 || !exact {
		t.Fatalf("oomCount from memory.oom_control = %d, %v; want 3, exact", n, exact)
	}
	r := record{Cgroup: mem, OOMKillBase: 2, ExitCode: 0}
	if r.noteOOM(); r.ExitReason != runtime.ExitReasonOOM {
		t.Fatalf("exit reason %q after an oom_kill during the run, want oom", r.ExitReason)
	}
	// A kernel before 4.13: no oom_kill line; failcnt grown counts only with a death by SIGKILL.
	write("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n")
	if n, exact := oomCount(mem); n != 40 || exact {
		t.Fatalf("oomCount from memory.failcnt = %d, %v; want 40, inexact", n, exact)
	}
	r = record{Cgroup: mem, OOMKillBase: 10, ExitCode: 1}
	if r.noteOOM(); r.ExitReason != "" {
		t.Fatal("exit reason oom from failcnt for a run that exited 1")
	}
	r.ExitCode = 128 + 9
	if r.noteOOM(); r.ExitReason != runtime.ExitReasonOOM {
		t.Fatalf("exit reason %q from failcnt and SIGKILL, want oom", r.ExitReason)
	}
}
