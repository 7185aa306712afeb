package process

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/runtime"
)

// TestMemoryLimitOOM runs a workload that allocates without bound under a 32 MiB limit: the
// kernel's OOM killer ends it inside its cgroup, and the driver reports it exited with
// ExitReason "oom". It needs root and a cgroup v2 hierarchy offering the memory and cpu
// controllers; without them it fails and says what the host lacks (the driver then runs
// workloads unlimited, which is what the test would otherwise pass over silently).
func TestMemoryLimitOOM(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	desc, err := d.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if desc.Capabilities.ResourceLimits != runtime.LimitsCgroup2 {
		t.Fatalf("memory limits cannot be enforced on this host (need root and cgroup v2 with the memory and cpu controllers): the driver reports %q", desc.Capabilities.ResourceLimits)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const limit = 32 << 20
	r, err := d.Start(context.Background(), &runtime.StartRequest{WorkloadID: "wl_hog", Command: []string{exe},
		Env: map[string]string{modeEnv: "hog"}, WorkDir: f.dir, LogPath: f.logPath("wl_hog"), MemoryBytes: limit, CPUMillis: 500})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cg := filepath.Join(d.cgroupParent, "wl_hog")
	for file, want := range map[string]string{"memory.max": "33554432", "cpu.max": "50000 100000"} {
		raw, err := os.ReadFile(filepath.Join(cg, file))
		if err != nil || strings.TrimSpace(string(raw)) != want {
			t.Fatalf("%s of the workload's cgroup = %q, %v; want %q", file, raw, err, want)
		}
	}
	var st *runtime.WorkloadState
	waitFor(t, 60*time.Second, "the workload to exit", func() bool {
		st = inspect(t, d, "wl_hog")
		return st.State == runtime.StateExited
	})
	if st.ExitReason != runtime.ExitReasonOOM || st.ExitCode != 128+9 {
		log, _ := os.ReadFile(f.logPath("wl_hog"))
		t.Fatalf("exited with code %d, reason %q; want 137 and %q (pid %d, log %q)", st.ExitCode, st.ExitReason, runtime.ExitReasonOOM, r.State.PID, log)
	}
	// The reason is persisted: a driver started again over the same state directory reads it.
	d.Close()
	again := f.driver()
	if st := inspect(t, again, "wl_hog"); st.ExitReason != runtime.ExitReasonOOM {
		t.Fatalf("after a driver restart the exit reason is %q, want %q", st.ExitReason, runtime.ExitReasonOOM)
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
// count is read, on files laid out as a cgroup's (the kernel's own files need the controllers
// TestMemoryLimitOOM checks for).
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
	if oomKills(dir) != 0 {
		t.Fatal("oom_kill read without memory.events")
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := oomKills(dir); n != 2 {
		t.Fatalf("oomKills = %d, want 2", n)
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
