package process

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

// driverHostEnv makes the test binary a process that runs a driver, starts
// one counting workload through it, says "started" and waits to be killed.
const driverHostEnv = "BERTH_PROCESS_TEST_DRIVER_HOST"

// Counting workload: COUNT_N lines, one every COUNT_EVERY, each "line <i>
// <unix nanoseconds when written>", every tenth on stderr.
const (
	countN     = "COUNT_N"
	countEvery = "COUNT_EVERY"
)

func countLines() int {
	n, _ := strconv.Atoi(os.Getenv(countN))
	every, _ := time.ParseDuration(os.Getenv(countEvery))
	for i := 1; i <= n; i++ {
		out := os.Stdout
		if i%10 == 0 {
			out = os.Stderr
		}
		fmt.Fprintf(out, "line %d %d\n", i, time.Now().UnixNano())
		time.Sleep(every)
	}
	return 0
}

func writerConfig(t testing.TB, state string) Config {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Config{StateDir: state, LogWriter: []string{exe, logwriter.Command}, LogSegmentBytes: 8 << 10}
}

func (f *fixture) writerDriver() *Driver {
	f.t.Helper()
	return f.writerDriverWith(writerConfig(f.t, f.state))
}

func (f *fixture) writerDriverWith(cfg Config) *Driver {
	f.t.Helper()
	d, err := New(cfg)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.t.Cleanup(func() { d.Close() })
	return d
}

// stopWhenExited waits for the workload to exit and stops it, which waits
// for its log writer to seal the last segment.
func stopWhenExited(t *testing.T, d *Driver, id string) {
	t.Helper()
	waitFor(t, 2*time.Minute, id+" to exit", func() bool { return inspect(t, d, id).State == runtime.StateExited })
	if _, err := d.Stop(context.Background(), &runtime.StopRequest{WorkloadID: id, Mutation: runtime.Mutation{IdempotencyKey: "stop-" + id}}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// checkCounted checks that dir holds the n lines of a counting workload once
// each, in order, on the right stream, stamped no earlier than the workload's
// own clock read them and at most maxSkew later.
func checkCounted(t *testing.T, dir string, n int, maxSkew time.Duration) {
	t.Helper()
	var recs []logseg.Record
	if _, err := logseg.ReadFrom(dir, 1, func(r logseg.Record) error {
		r.Text = append([]byte(nil), r.Text...)
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("%d records, want %d", len(recs), n)
	}
	// Each stream is in order; across the two pipes the order is that of the
	// writer's reads, so lines are counted, not compared by position.
	var worst time.Duration
	seen := make([]bool, n+1)
	lastOf := map[string]int{}
	for i, r := range recs {
		var num int
		var wrote int64
		if _, err := fmt.Sscanf(string(r.Text), "line %d %d", &num, &wrote); err != nil || num < 1 || num > n || seen[num] || r.Seq != int64(i+1) || r.Partial {
			t.Fatalf("record %d: seq %d %q (%v), or a line seen twice", i, r.Seq, r.Text, err)
		}
		seen[num] = true
		if num < lastOf[r.Stream] {
			t.Fatalf("line %d after line %d on %s", num, lastOf[r.Stream], r.Stream)
		}
		lastOf[r.Stream] = num
		if i > 0 && r.Time.Before(recs[i-1].Time) {
			t.Fatalf("record %d stamped before the record before it", i)
		}
		if want := map[bool]string{true: logseg.Stderr, false: logseg.Stdout}[num%10 == 0]; r.Stream != want {
			t.Fatalf("line %d on %s, want %s", num, r.Stream, want)
		}
		skew := r.Time.Sub(time.Unix(0, wrote))
		if skew < 0 || skew > maxSkew {
			t.Fatalf("line %d stamped %s after it was written, want within [0, %s]", num, skew, maxSkew)
		}
		worst = max(worst, skew)
	}
	t.Logf("%d lines, worst stamp skew %s", n, worst)
}

func TestLogWriterStampsEveryLineOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.writerDriver()
	const n = 600
	f.start(d, "wl_count", "count", map[string]string{countN: strconv.Itoa(n), countEvery: "2ms"})
	stopWhenExited(t, d, "wl_count")
	dir := logseg.DirOf(f.logPath("wl_count"))
	// Bounded skew: the writer reads the pipe as the workload writes it;
	// seconds allow for a loaded machine, not for a read delayed by a poll.
	checkCounted(t, dir, n, 5*time.Second)
	if segs, _ := logseg.Segments(dir); len(segs) < 2 {
		t.Fatalf("%d segments, want several of 8 KiB", len(segs))
	}
	if _, err := os.Stat(f.logPath("wl_count")); !os.IsNotExist(err) {
		t.Fatalf("the plain log file exists beside the writer's segments: %v", err)
	}
}

func TestLogWriterLogsRendersOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.writerDriver()
	f.start(d, "wl_render", "count", map[string]string{countN: "50", countEvery: "1ms"})
	waitFor(t, time.Minute, "wl_render to exit", func() bool { return inspect(t, d, "wl_render").State == runtime.StateExited })
	d.mu.Lock()
	rec := d.workloads["wl_render"].rec
	d.mu.Unlock()
	awaitLogWriter(context.Background(), rec)
	var b strings.Builder
	if err := d.Logs(context.Background(), &runtime.LogsRequest{WorkloadID: "wl_render"}, &b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 50 || !strings.HasPrefix(lines[0], "line 1 ") || !strings.HasPrefix(lines[49], "line 50 ") {
		t.Fatalf("Logs rendered %d lines: %q ... %q", len(lines), lines[0], lines[len(lines)-1])
	}
	b.Reset()
	if err := d.Logs(context.Background(), &runtime.LogsRequest{WorkloadID: "wl_render", TailBytes: 40}, &b); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 40 || !strings.HasSuffix(b.String(), "\n") || !strings.Contains(b.String(), "line 50 ") {
		t.Fatalf("tail of 40 bytes: %q", b.String())
	}
}

func TestLogWriterSplitsLongLine(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := writerConfig(t, f.state)
	cfg.LogSegmentBytes = 0 // the default 4 MiB: three segments
	d := f.writerDriverWith(cfg)
	f.start(d, "wl_long", "longline", nil)
	stopWhenExited(t, d, "wl_long")
	var pieces, total int
	var last logseg.Record
	if _, err := logseg.ReadFrom(logseg.DirOf(f.logPath("wl_long")), 1, func(r logseg.Record) error {
		if pieces < 640 {
			total += len(r.Text)
			if len(r.Text) > logseg.MaxText || r.Partial != (pieces < 639) {
				return fmt.Errorf("piece %d: %d bytes, partial %v", pieces, len(r.Text), r.Partial)
			}
		}
		pieces++
		last = r
		last.Text = append([]byte(nil), r.Text...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if pieces != 641 || total != 10<<20 || string(last.Text) != "end" || last.Partial {
		t.Fatalf("%d records, %d bytes of the long line, last %q", pieces, total, last.Text)
	}
}

// runDriverHost is the body of the driver host process (driverHostEnv).
func runDriverHost(state string) int {
	exe, _ := os.Executable()
	d, err := New(Config{StateDir: state, LogWriter: []string{exe, logwriter.Command}, LogSegmentBytes: 8 << 10})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	_, err = d.Start(context.Background(), &runtime.StartRequest{
		WorkloadID: "wl_survivor", Command: []string{exe},
		Env:     map[string]string{modeEnv: "count", countN: os.Getenv(countN), countEvery: os.Getenv(countEvery)},
		WorkDir: state, LogPath: filepath.Join(os.Getenv("LOG_BASE"), "output.log"),
	})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("started")
	select {}
}

// The driver's process is killed with SIGKILL while the workload writes: the
// log writer lives on, and a new driver finds the workload; no line is lost
// or repeated.
func TestLogWriterOutlivesKilledDriver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const n = 1500
	logBase := filepath.Join(f.dir, "wl_survivor")
	host := exec.Command(exe)
	host.Env = append(os.Environ(), driverHostEnv+"="+f.state, countN+"="+strconv.Itoa(n), countEvery+"=2ms", "LOG_BASE="+logBase)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
		t.Fatalf("driver host: %q", line)
	}
	dir := logseg.DirOf(filepath.Join(logBase, "output.log"))
	waitFor(t, time.Minute, "a sealed segment", func() bool { s, _ := logseg.Segments(dir); return len(s) > 0 })
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	d := f.writerDriver()
	st := inspect(t, d, "wl_survivor")
	t.Cleanup(func() { _ = syscall.Kill(-st.PID, syscall.SIGKILL) })
	if st.State != runtime.StateRunning {
		t.Fatalf("after the driver's kill the workload is %s, want still running", st.State)
	}
	stopWhenExited(t, d, "wl_survivor")
	checkCounted(t, dir, n, 5*time.Second)
}

// A run restarted in place continues its log directory: the second run's
// writer waits for the first to let go, and the sequence goes on.
func TestLogWriterRestartInPlaceContinues(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.writerDriver()
	for run := 1; run <= 2; run++ {
		f.start(d, "wl_again", "count", map[string]string{countN: "30", countEvery: "1ms"})
		waitFor(t, time.Minute, "run to exit", func() bool { return inspect(t, d, "wl_again").State == runtime.StateExited })
	}
	stopWhenExited(t, d, "wl_again")
	var seqs []int64
	if _, err := logseg.ReadFrom(logseg.DirOf(f.logPath("wl_again")), 1, func(r logseg.Record) error {
		seqs = append(seqs, r.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 60 || seqs[0] != 1 || seqs[59] != 60 {
		t.Fatalf("%d records, seqs %v", len(seqs), seqs)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("seq %d at %d", s, i)
		}
	}
}
