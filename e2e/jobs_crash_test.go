package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// Shape of TestJobsSurviveKill9.
const (
	// crashJobs "@every 2s" jobs fire crashJobs/2 times a second between them.
	crashJobs = 6
	// crashFires is how many fire times the kills are spread over, at least.
	crashFires = 200
	// crashMaxRounds bounds the kill loop whatever the fire count.
	crashMaxRounds = 40
)

// startedBundle writes a release whose ./job appends its workload id to the file named by its
// first argument (one short O_APPEND write: lines of concurrent runs never mix) and exits 0.
func startedBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"$BERTH_WORKLOAD_ID\" >> \"$1\"\necho \"job started in $BERTH_WORKLOAD_ID\"\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "job"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readLines returns the lines of path (none when it does not exist).
func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// downtime is one kill of berthd: when it was dead and when the next one was started.
type downtime struct{ killed, restarted time.Time }

// TestJobsSurviveKill9 runs crashJobs "@every 2s" jobs (half forbid, half allow) on one node
// with the process driver while berthd (embedded store) is killed with SIGKILL at random points
// and started again, after a random downtime of up to 4 s, until at least crashFires fire times
// have passed (docs/jobs.md sections 4 and 7). Then every fire time of every job since it was
// declared, up to the end of the kills, is recorded exactly once and ends succeeded or missed
// (the script always exits 0; failed and timed_out are allowed states but cannot occur); no run
// started a process twice, and no process started for a fire time the record does not show as
// succeeded; fire times of a downtime are missed, except at most one per job: the latest, which
// the restarted berthd runs; and no job workload outlives its run. The seed of the kill points is
// logged (BERTH_TEST_CRASH_SEED repeats it).
func TestJobsSurviveKill9(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("BERTH_TEST_CRASH_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (BERTH_TEST_CRASH_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	cl := newCluster(t)
	ctx := context.Background()
	startAgent(t, cl, "a")
	cl.nodeStatus(t, "connected")
	cl.pushBundle(t, startedBundle(t, filepath.Join(t.TempDir(), "job")), "job")
	// The workloads run as another user: the file they append to is in a directory anyone may
	// write (the test's own directories are private).
	shared, err := os.MkdirTemp("", "berth-jobs-crash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	started := filepath.Join(shared, "started.log")
	created := map[string]time.Time{}
	for i := range crashJobs {
		name := fmt.Sprintf("tick-%d", i)
		conc := "forbid"
		if i%2 == 1 {
			conc = "allow"
		}
		svc, err := cl.c.ApplyService(ctx, "default", name, client.ServiceSpec{Kind: "job", Bundle: "job", Command: []string{"./job", started},
			Job: &client.JobSpec{Schedule: "@every 2s", Concurrency: conc, KeepHistory: 1000}})
		if err != nil {
			t.Fatalf("apply job %s: %v", name, err)
		}
		created[name] = svc.CreatedAt
	}
	first := time.Now()
	for _, c := range created {
		if c.Before(first) {
			first = c
		}
	}
	// firesBy counts the fire times of all jobs after their declaration and up to now.
	firesBy := func(now time.Time) int {
		n := 0
		for _, c := range created {
			n += int(now.Truncate(2*time.Second).Sub(c.Truncate(2*time.Second)) / (2 * time.Second))
		}
		return n
	}

	// Kill berthd at random points until enough fire times passed.
	var downs []downtime
	for round := 0; round < crashMaxRounds && firesBy(time.Now()) < crashFires; round++ {
		up := time.Duration(500+rng.IntN(6000)) * time.Millisecond
		down := time.Duration(rng.IntN(4000)) * time.Millisecond
		waitOrFail(t, up, cl)
		cl.berthd.Kill9()
		d := downtime{killed: time.Now()}
		waitOrFail(t, down, nil)
		d.restarted = time.Now()
		startBerthd(t, cl)
		downs = append(downs, d)
		t.Logf("round %d: killed after %s up, down %s (%.1f s restarting)", round, up, down, time.Since(d.restarted).Seconds())
	}
	end := time.Now()

	// Every fire time up to end is recorded and final.
	expected := map[string]time.Time{} // run id -> fire time
	for name, c := range created {
		for f := c.Truncate(2 * time.Second).Add(2 * time.Second); !f.After(end); f = f.Add(2 * time.Second) {
			if f.After(c) {
				expected["default/"+name+"@"+f.UTC().Format(time.RFC3339)] = f
			}
		}
	}
	if len(expected) < crashFires {
		t.Fatalf("only %d fire times in the covered window, want at least %d", len(expected), crashFires)
	}
	runs := map[string]client.JobRun{}
	list := func() error {
		clear(runs)
		for name := range created {
			rs, err := cl.c.JobRuns(ctx, "default", name)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if _, dup := runs[r.ID]; dup {
					t.Fatalf("run %s listed twice", r.ID)
				}
				runs[r.ID] = r
			}
		}
		return nil
	}
	waitFor(t, 3*converge, "every fire time up to the end recorded and final", func() (bool, string) {
		if err := list(); err != nil {
			return false, err.Error()
		}
		for id := range expected {
			r, ok := runs[id]
			if !ok {
				return false, id + " not recorded"
			}
			if !r.Final() {
				return false, fmt.Sprintf("%s is %s", id, r.State)
			}
		}
		return true, ""
	})

	// The processes started so far, then the runs again: every process listed ran for a run
	// the second listing names.
	lines := readLines(t, started)
	if err := list(); err != nil {
		t.Fatal(err)
	}
	byWorkload := map[string]string{} // workload id -> run id
	count := map[string]int{}
	for id, r := range runs {
		if r.WorkloadID != "" {
			if other, ok := byWorkload[r.WorkloadID]; ok {
				t.Errorf("runs %s and %s share workload %s", id, other, r.WorkloadID)
			}
			byWorkload[r.WorkloadID] = id
		}
		if _, want := expected[id]; !want {
			continue // after the window
		}
		count[r.State]++
		switch r.State {
		case "succeeded":
			if r.Attempts != 1 || r.ExitCode == nil || *r.ExitCode != 0 {
				t.Errorf("run %s succeeded after %d attempts with exit %v, want 1 attempt and exit 0", id, r.Attempts, r.ExitCode)
			}
		case "missed", "failed", "timed_out":
		default:
			t.Errorf("run %s ended %s (%s), want succeeded, failed, timed_out or missed", id, r.State, r.Message)
		}
	}
	// Processes: each started once, for a run recorded succeeded (or one after the window).
	starts := map[string]int{}
	for _, wl := range lines {
		starts[wl]++
	}
	for wl, n := range starts {
		id, ok := byWorkload[wl]
		switch {
		case !ok:
			t.Errorf("a process started in workload %s, which no run names", wl)
		case n != 1:
			t.Errorf("run %s started %d processes", id, n)
		case runs[id].State != "succeeded" && runs[id].Final():
			t.Errorf("run %s started a process but ended %s (%s)", id, runs[id].State, runs[id].Message)
		}
	}
	for id := range expected {
		if r := runs[id]; r.State == "succeeded" && starts[r.WorkloadID] != 1 {
			t.Errorf("run %s succeeded, but its process started %d times", id, starts[r.WorkloadID])
		}
	}
	// A downtime's fire times are missed but for the latest of each job.
	for _, d := range downs {
		for name := range created {
			var ran []string
			for id, f := range expected {
				if strings.HasPrefix(id, "default/"+name+"@") && f.After(d.killed) && !f.After(d.restarted) && runs[id].State != "missed" {
					ran = append(ran, id)
				}
			}
			if len(ran) > 1 {
				sort.Strings(ran)
				t.Errorf("%d fire times of %s inside the downtime %s..%s ran: %v; want at most the latest", len(ran), name,
					d.killed.Format(time.RFC3339Nano), d.restarted.Format(time.RFC3339Nano), ran)
			}
		}
	}
	// No job workload outlives its run.
	waitFor(t, converge, "no workload of an ended run left", func() (bool, string) {
		ws, err := cl.c.ListWorkloads(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, w := range ws {
			if id, ok := byWorkload[w.ID]; ok && runs[id].Final() {
				if r, err := cl.c.GetJobRun(ctx, "default", strings.TrimPrefix(id, "default/")); err == nil && r.Final() {
					left = append(left, w.ID+" of "+id+" ("+r.State+")")
				}
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	t.Logf("%d rounds of kill -9; %d fire times of %d jobs in %.0f s: %v; %d processes started", len(downs), len(expected), crashJobs,
		end.Sub(first).Seconds(), count, len(starts))
	if count["succeeded"] == 0 {
		t.Error("no run succeeded")
	}
}

// waitOrFail waits d; with cl set, it fails t if berthd exits meanwhile.
func waitOrFail(t *testing.T, d time.Duration, cl *cluster) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	if cl == nil {
		<-timer.C
		return
	}
	select {
	case <-timer.C:
	case <-cl.berthd.Done():
		b, _ := os.ReadFile(filepath.Join(cl.dir, "berthd.log"))
		if len(b) > 20000 {
			b = b[len(b)-20000:]
		}
		t.Fatalf("berthd exited on its own:\n%s", b)
	}
}

// TestJobReplaceStopsTheOldRunFirst runs an "@every 2s" job of concurrency replace whose runs
// would sleep a minute (docs/jobs.md section 7): each fire time cancels the live run, and its
// process is gone before the next run's process starts. Each process takes a shared lock the
// moment it starts and holds it until it ends; a process that finds the lock held writes
// "overlap", which must never happen.
func TestJobReplaceStopsTheOldRunFirst(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startAgent(t, cl, "a")
	cl.nodeStatus(t, "connected")
	shared, err := os.MkdirTemp("", "berth-jobs-replace-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shared) })
	lock, logPath := filepath.Join(shared, "lock"), filepath.Join(shared, "starts.log")
	for _, p := range []string{lock, logPath} {
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "long")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\nexec 9<\"$1\"\nflock -n 9 || echo \"overlap $BERTH_WORKLOAD_ID\" >> \"$2\"\n" +
		"echo \"start $BERTH_WORKLOAD_ID\" >> \"$2\"\nexec sleep 60\n"
	if err := os.WriteFile(filepath.Join(dir, "job"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cl.pushBundle(t, dir, "long")
	if _, err := cl.c.ApplyService(ctx, "default", "long", client.ServiceSpec{Kind: "job", Bundle: "long", Command: []string{"./job", lock, logPath},
		Job: &client.JobSpec{Schedule: "@every 2s", Concurrency: "replace", KeepHistory: 1000}}); err != nil {
		t.Fatal(err)
	}
	const want = 6
	waitFor(t, 3*converge, fmt.Sprintf("%d runs of long started", want), func() (bool, string) {
		n := 0
		for _, l := range readLines(t, logPath) {
			if strings.HasPrefix(l, "start ") {
				n++
			}
		}
		return n >= want, fmt.Sprintf("%d started", n)
	})
	if err := cl.c.SuspendJob(ctx, "default", "long", true); err != nil {
		t.Fatal(err)
	}
	for _, l := range readLines(t, logPath) {
		if strings.HasPrefix(l, "overlap ") {
			t.Errorf("%s: a run's process started while the replaced one's still ran", l)
		}
	}
	runs, err := cl.c.JobRuns(ctx, "default", "long")
	if err != nil {
		t.Fatal(err)
	}
	live, cancelled := 0, 0
	for _, r := range runs {
		switch {
		case !r.Final():
			live++
		case r.State == "cancelled":
			if !strings.HasPrefix(r.Message, "replaced by run default/long@") {
				t.Errorf("run %s cancelled: %q, want replaced by the next", r.ID, r.Message)
			}
			cancelled++
		}
	}
	if live > 1 || cancelled < want-1 {
		t.Errorf("%d live and %d cancelled runs; want at most 1 live and %d replaced: %+v", live, cancelled, want-1, runs)
	}
}
