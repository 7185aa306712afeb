package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

// modeEnv makes the test binary act as a workload instead of running tests.
const modeEnv = "BERTH_PROCESS_TEST_WORKLOAD"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == logwriter.Command {
		os.Exit(logwriter.Main(os.Args[2:]))
	}
	if state := os.Getenv(driverHostEnv); state != "" {
		os.Exit(runDriverHost(state))
	}
	if mode := os.Getenv(modeEnv); mode != "" {
		os.Exit(runWorkload(mode))
	}
	os.Exit(m.Run())
}

// runWorkload is the body of a test workload.
func runWorkload(mode string) int {
	switch mode {
	case "sleep": // dies of SIGTERM
		select {}
	case "graceful": // exits 0 on SIGTERM
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		fmt.Println("ready")
		<-ch
		fmt.Println("bye")
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		select {}
	case "spam":
		n, _ := strconv.Atoi(os.Getenv("SPAM_BYTES"))
		line := strings.Repeat("x", 99) + "\n"
		for i := 0; i < n/len(line); i++ {
			fmt.Print(line)
		}
		fmt.Println("ready")
		select {}
	case "exit3":
		return 3
	case "count":
		return countLines()
	case "flood":
		return floodLines()
	case "longline": // one 10 MiB line in pieces, then a short one
		piece := strings.Repeat("0123456789abcdef", 4096)
		for range 10 << 20 / len(piece) {
			os.Stdout.WriteString(piece)
		}
		os.Stdout.WriteString("\nend\n")
		return 0
	case "hog": // touches memory 1 MiB at a time until something stops it
		var keep [][]byte
		fmt.Println("ready")
		for i := 0; i < 4096; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(i + j)
			}
			keep = append(keep, b)
			time.Sleep(time.Millisecond)
		}
		fmt.Println("allocated 4 GiB unharmed")
		return 0
	}
	return 99
}

type fixture struct {
	t     *testing.T
	state string
	dir   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, state: filepath.Join(dir, "state"), dir: dir}
	first := f.state
	// Registered first, so it runs last, after the tests' kills: remove the
	// cgroups the drivers of this fixture made (their processes are dead).
	t.Cleanup(func() {
		for _, st := range []string{first, f.state} {
			for _, parent := range cgroupParents(st) {
				entries, _ := os.ReadDir(parent)
				for _, e := range entries {
					if e.IsDir() {
						_ = removeCgroup(context.Background(), filepath.Join(parent, e.Name()))
					}
				}
				_ = os.Remove(parent)
			}
		}
	})
	return f
}

func (f *fixture) driver() *Driver {
	f.t.Helper()
	d, err := New(Config{StateDir: f.state})
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.t.Cleanup(func() { d.Close() })
	return d
}

func (f *fixture) start(d *Driver, id, mode string, extraEnv map[string]string) *runtime.WorkloadState {
	f.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		f.t.Fatal(err)
	}
	env := map[string]string{modeEnv: mode}
	for k, v := range extraEnv {
		env[k] = v
	}
	r, err := d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID: id,
		Command:    []string{exe},
		Env:        env,
		WorkDir:    f.dir,
		LogPath:    f.logPath(id),
	})
	if err != nil {
		f.t.Fatalf("Start %s: %v", id, err)
	}
	pid := r.State.PID
	f.t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	return r.State
}

func (f *fixture) logPath(id string) string { return filepath.Join(f.dir, "logs", id+".log") }

// waitFor waits until cond holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func (f *fixture) waitLog(id, want string) {
	f.t.Helper()
	// Generous: a workload writing megabytes through the log trimmer on a loaded 2-core machine
	// (make test runs every package at once) takes seconds to reach its last line.
	waitFor(f.t, time.Minute, fmt.Sprintf("%q in log of %s", want, id), func() bool {
		raw, _ := os.ReadFile(f.logPath(id))
		return strings.Contains(string(raw), want)
	})
}

func inspect(t *testing.T, d *Driver, id string) *runtime.WorkloadState {
	t.Helper()
	st, err := d.Inspect(context.Background(), &runtime.InspectRequest{WorkloadID: id})
	if err != nil {
		t.Fatalf("Inspect %s: %v", id, err)
	}
	return st
}

func TestStartRunning(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	st := f.start(d, "wl_run", "sleep", nil)
	if st.State != runtime.StateRunning || st.PID <= 0 || st.ExitCode != -1 || st.StartedAt.IsZero() {
		t.Fatalf("state after Start = %+v", st)
	}
	if !alive(st.PID, mustTicks(t, st.PID)) {
		t.Fatalf("pid %d not alive", st.PID)
	}
	// Own session: the workload leads its own process group.
	if pgid, err := syscall.Getpgid(st.PID); err != nil || pgid != st.PID {
		t.Fatalf("pgid of %d = %d, %v; want its own group", st.PID, pgid, err)
	}
	// Start again returns the same handle.
	again := f.start(d, "wl_run", "sleep", nil)
	if again.PID != st.PID {
		t.Fatalf("second Start pid %d, want %d", again.PID, st.PID)
	}
	list, err := d.List(context.Background())
	if err != nil || len(list) != 1 || list[0].WorkloadID != "wl_run" {
		t.Fatalf("List = %+v, %v", list, err)
	}
}

func mustTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := readProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.StartTicks
}

func TestExitCodeOfOwnChild(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	f.start(d, "wl_exit", "exit3", nil)
	waitFor(t, 10*time.Second, "exit recorded", func() bool {
		st := inspect(t, d, "wl_exit")
		return st.State == runtime.StateExited && st.ExitCode == 3
	})
}

// TestListNeverReportsAnExitWithoutItsCode: workloads that exit 3 at once, listed in a tight
// loop, read as running until they are reported exited with code 3: never exited without the
// code, which happened when a listing came between the reaper taking the exit and recording it
// (a job run that exited 0 was then recorded failed).
func TestListNeverReportsAnExitWithoutItsCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	const n = 10
	for i := range n {
		f.start(d, fmt.Sprintf("wl_exit%d", i), "exit3", nil)
	}
	exited := map[string]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(exited) < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d exits reported within a minute", len(exited), n)
		}
		list, err := d.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range list {
			if st.State != runtime.StateExited {
				continue
			}
			if st.ExitCode != 3 {
				t.Fatalf("%s reported exited with code %d, want 3", st.WorkloadID, st.ExitCode)
			}
			exited[st.WorkloadID] = true
		}
	}
}

func TestLogBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	const limit = 64 << 10
	exe, _ := os.Executable()
	r, err := d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID:  "wl_log",
		Command:     []string{exe},
		Env:         map[string]string{modeEnv: "spam", "SPAM_BYTES": strconv.Itoa(4 << 20)},
		WorkDir:     f.dir,
		LogPath:     f.logPath("wl_log"),
		LogMaxBytes: limit,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-r.State.PID, syscall.SIGKILL) })
	f.waitLog("wl_log", "ready")
	// The trimmer rewrites the file while the last line may still be on its way: wait until
	// the file is both under the limit and ends with the newest line, as it must settle.
	var raw []byte
	waitFor(t, time.Minute, "log trimmed under the limit, ending with its newest line", func() bool {
		raw, _ = os.ReadFile(f.logPath("wl_log"))
		return len(raw) > 0 && len(raw) <= limit && strings.HasSuffix(string(raw), "ready\n")
	})
	if !strings.HasSuffix(string(raw), "ready\n") {
		t.Fatalf("log lost its newest line: ...%q", raw[max(0, len(raw)-200):])
	}
}

func TestStopGraceful(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	st := f.start(d, "wl_grace", "graceful", nil)
	f.waitLog("wl_grace", "ready")
	r, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_grace", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if r.State.State != runtime.StateExited || r.State.ExitCode != 0 || r.State.PID != st.PID {
		t.Fatalf("Stop state = %+v, want exited with code 0", r.State)
	}
	f.waitLog("wl_grace", "bye")
	// Stop forgets the workload: a second Stop and Inspect say not found.
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_grace"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("second Stop err = %v, want ErrNotFound", err)
	}
	if _, err := d.Inspect(context.Background(), &runtime.InspectRequest{WorkloadID: "wl_grace"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Inspect after Stop err = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(d.recordPath("wl_grace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record still present: %v", err)
	}
}

func TestStopForcedAfterTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	st := f.start(d, "wl_stubborn", "ignore-term", nil)
	f.waitLog("wl_stubborn", "ready")
	r, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_stubborn", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if r.State.State != runtime.StateExited || r.State.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("Stop state = %+v, want exited by SIGKILL", r.State)
	}
	if err := syscall.Kill(st.PID, 0); err == nil {
		t.Fatalf("pid %d still alive", st.PID)
	}
}

func TestStopForce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	f.start(d, "wl_force", "graceful", nil)
	f.waitLog("wl_force", "ready")
	r, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_force", Mode: runtime.StopForced})
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if r.State.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("Force stop exit code = %d, want SIGKILL", r.State.ExitCode)
	}
}

func TestStopUnknown(t *testing.T) {
	t.Parallel()
	d := newFixture(t).driver()
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_none"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Stop unknown err = %v, want ErrNotFound", err)
	}
}

func TestRestartFindsRunningWorkload(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d1 := f.driver()
	st := f.start(d1, "wl_keep", "sleep", nil)
	d1.Close()

	d2 := f.driver()
	list, err := d2.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].WorkloadID != "wl_keep" || list[0].State != runtime.StateRunning || list[0].PID != st.PID {
		t.Fatalf("List after restart = %+v", list)
	}
	// Start on the new driver returns the running workload, not a second one.
	again := f.start(d2, "wl_keep", "sleep", nil)
	if again.PID != st.PID {
		t.Fatalf("Start after restart pid %d, want %d", again.PID, st.PID)
	}

	// Killed behind the new driver's back: exited, exit code unknown.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "killed workload reported exited", func() bool {
		return inspect(t, d2, "wl_keep").State == runtime.StateExited
	})
	if got := inspect(t, d2, "wl_keep"); got.ExitCode != -1 || got.ExitedAt.IsZero() {
		t.Fatalf("state of a workload the driver did not reap = %+v, want exit code -1", got)
	}
	// Stop of an exited workload returns its state and forgets it.
	r, err := d2.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_keep"})
	if err != nil || r.State.State != runtime.StateExited {
		t.Fatalf("Stop of exited = %+v, %v", r, err)
	}
}

func TestReusedPIDIsExited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d1 := f.driver()
	d1.Close()
	// A record whose pid is alive (this test process) but whose start time
	// is another process's: the pid was reused.
	ticks := mustTicks(t, os.Getpid())
	rec := &record{
		Version: recordVersion, WorkloadID: "wl_reused", PID: os.Getpid(), StartTicks: ticks + 1,
		Command: []string{"x"}, StartedAt: time.Now().UTC(), LogPath: f.logPath("wl_reused"),
		LogMaxBytes: DefaultLogMaxBytes, ExitCode: -1,
	}
	if err := d1.writeRecord(rec); err != nil {
		t.Fatal(err)
	}
	d2 := f.driver()
	st := inspect(t, d2, "wl_reused")
	if st.State != runtime.StateExited || st.ExitCode != -1 {
		t.Fatalf("reused pid state = %+v, want exited", st)
	}
	// Stop must not signal the unrelated process (this test): it survives.
	if _, err := d2.Stop(context.Background(), &runtime.StopRequest{WorkloadID: "wl_reused", Mode: runtime.StopForced}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func TestResolveCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, cmd, path, want string
		err                   bool
	}{
		{"bare name in workdir", "app", "/nonexistent", bin, false},
		{"relative with slash", "./app", "", bin, false},
		{"bare name on PATH", "sh", "/bin:/usr/bin", "", false},
		{"missing", "no-such-cmd", "/bin", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveCommand(tc.cmd, dir, tc.path)
			if (err != nil) != tc.err {
				t.Fatalf("resolveCommand(%q) err = %v", tc.cmd, err)
			}
			if tc.err && !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err = %v, want ErrInvalidRequest", err)
			}
			if tc.want != "" && got != tc.want {
				t.Fatalf("resolveCommand(%q) = %q, want %q", tc.cmd, got, tc.want)
			}
		})
	}
}
