package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// Shape of BenchmarkApplyToConverged.
const (
	applyAgents   = 3
	applyServices = 10
	applyReplicas = 1
	// applyLimit bounds each wait: berthd ready, nodes connected, all services converged.
	applyLimit = 3 * time.Minute
)

// moduleRoot returns the directory of go.mod.
func moduleRoot(b *testing.B) string {
	b.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		b.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// binaries returns the directory of berthd, berth-agent and berth-plugin-process:
// BERTH_BIN_DIR (relative to the module root when relative), else the module's bin/ (make build).
func binaries(b *testing.B) string {
	b.Helper()
	dir := os.Getenv("BERTH_BIN_DIR")
	if dir == "" {
		dir = "bin"
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(moduleRoot(b), dir)
	}
	for _, name := range []string{"berthd", "berth-agent", "berth-plugin-process"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			b.Fatalf("%s: %v (run make build, or set BERTH_BIN_DIR)", name, err)
		}
	}
	return dir
}

// applyCluster is one berthd (embedded store) and its agents, all under dir.
type applyCluster struct {
	dir     string
	url     string
	fp      string
	token   string // the admin token berthd wrote at its first start
	c       *client.Client
	berthd  *proctest.Proc
	agents  []*proctest.Proc
	stopped sync.Once
}

// stop ends the agents, then berthd, then every workload process left under the cluster's
// directory (workloads outlive their agent by design). It runs once.
func (cl *applyCluster) stop() {
	cl.stopped.Do(func() {
		for _, a := range slices.Backward(cl.agents) {
			a.Stop()
		}
		if cl.berthd != nil {
			cl.berthd.Stop()
		}
		for _, pid := range processesUnder(cl.dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// processesUnder returns the pids of processes whose working directory is under dir.
func processesUnder(dir string) []int {
	var out []int
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// waitUntil polls cond every 50 ms, the resolution of the measured apply-to-converged times,
// until it holds or limit passes.
func waitUntil(b *testing.B, limit time.Duration, what string, cond func() (bool, string)) {
	b.Helper()
	proctest.WaitForEvery(b, limit, 50*time.Millisecond, what, cond)
}

// startApplyCluster starts berthd with extra flags and agents process-driver agents enrolled
// through the API, and waits until every node is connected.
func startApplyCluster(b *testing.B, bin string, agents int, extra ...string) *applyCluster {
	b.Helper()
	cl := &applyCluster{dir: b.TempDir()}
	b.Cleanup(cl.stop)
	listen := proctest.FreeAddr(b)
	cl.url = "https://" + listen
	args := append([]string{"--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", listen, "--gateway-listen", "off",
		"--log-level", "warn"}, extra...)
	cl.berthd = proctest.Start(b, filepath.Join(cl.dir, "berthd.log"), filepath.Join(bin, "berthd"), args...)
	d := proctest.WaitBerthdReady(b, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, applyLimit)
	cl.fp, cl.token = d.Fingerprint, d.Token
	var err error
	if cl.c, err = client.New(cl.url, client.WithToken(d.Token), client.WithFingerprint(cl.fp)); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range agents {
		jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
		if err != nil {
			b.Fatal(err)
		}
		data := filepath.Join(cl.dir, fmt.Sprintf("agent-%d", i))
		logPath := filepath.Join(cl.dir, fmt.Sprintf("agent-%d.log", i))
		enroll := proctest.Start(b, logPath, filepath.Join(bin, "berth-agent"), "enroll", "--server", cl.url, "--join-token", jt.Token,
			"--fingerprint", cl.fp, "--data-dir", data, "--hostname", fmt.Sprintf("bench-%d", i))
		select {
		case <-enroll.Done():
		case <-time.After(applyLimit):
			enroll.Stop()
			b.Fatalf("agent %d enrollment did not finish within %s", i, applyLimit)
		}
		if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
			log, _ := os.ReadFile(logPath)
			b.Fatalf("agent %d enrollment exited %d:\n%s", i, code, log)
		}
		cl.agents = append(cl.agents, proctest.Start(b, logPath, filepath.Join(bin, "berth-agent"), "run", "--data-dir", data, "--driver", "process"))
	}
	waitUntil(b, applyLimit, "every node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, nd := range ns {
			if nd.Status == "connected" {
				n++
			}
		}
		return n == agents, fmt.Sprintf("%d/%d connected", n, agents)
	})
	return cl
}

// helloBundle builds examples/apps/hello into a bundle directory and returns the directory.
func helloBundle(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "hello"), "./examples/apps/hello")
	cmd.Dir = moduleRoot(b)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build hello: %v\n%s", err, out)
	}
	return dir
}

// applyRun is what one apply-to-converged scenario measured.
type applyRun struct {
	total    time.Duration   // first apply to last converged
	each     []time.Duration // per service: its apply to its converged verdict, sorted
	applying time.Duration   // the applies themselves, back to back
}

// applyToConverged pushes the hello bundle, applies services one after another and polls their
// verdicts until every one is converged.
func applyToConverged(b *testing.B, cl *applyCluster, helloDir string) applyRun {
	b.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, helloDir, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		b.Fatal(err)
	}
	replicas := applyReplicas
	names := make([]string, applyServices)
	applied := make([]time.Time, applyServices)
	start := time.Now()
	for i := range names {
		names[i] = fmt.Sprintf("hello-%02d", i)
		applied[i] = time.Now()
		if _, err := cl.c.ApplyService(ctx, "default", names[i], client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
			Env: map[string]string{"GREETING": names[i]}, Replicas: &replicas,
			HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}); err != nil {
			b.Fatalf("apply %s: %v", names[i], err)
		}
	}
	run := applyRun{applying: time.Since(start)}
	done := make([]time.Duration, applyServices)
	waitUntil(b, applyLimit, "every service converged", func() (bool, string) {
		var pending []string
		for i, name := range names {
			if done[i] > 0 {
				continue
			}
			s, err := cl.c.GetService(ctx, "default", name)
			if err != nil {
				var ae *client.APIError
				if errors.As(err, &ae) {
					b.Fatalf("get %s: %v", name, err)
				}
				pending = append(pending, name+": "+err.Error())
				continue
			}
			if s.Verdict != nil && s.Verdict.State == "converged" {
				done[i] = time.Since(applied[i])
				continue
			}
			v := "no verdict"
			if s.Verdict != nil {
				v = s.Verdict.String()
			}
			pending = append(pending, name+": "+v)
		}
		return len(pending) == 0, strings.Join(pending, ", ")
	})
	run.total = time.Since(start)
	run.each = slices.Sorted(slices.Values(done))
	return run
}

// BenchmarkApplyToConverged measures, with real processes (berthd on its embedded store and 3
// berth-agent processes with the process driver, on loopback), the time from the first of 10
// back-to-back applies of one-replica services to the last of them reported converged by its
// verdict (docs/reconciliation.md sections 6 and 7), and each service's own apply-to-converged
// p50 and maximum. It runs berthd with its default sweep timing (quiet 1 s, floor 5 s), then
// again with a 1 s floor and 200 ms quiet (the fast_ figures). Workloads are examples/apps/hello
// with a 1 s health check. Binaries come from make build (BERTH_BIN_DIR overrides bin/). The
// scenario runs once whatever b.N; run with -benchtime 1x.
func BenchmarkApplyToConverged(b *testing.B) {
	bin := binaries(b)
	hello := helloBundle(b)
	runs := []struct {
		prefix string
		flags  []string
	}{
		{"", nil},
		{"fast_", []string{"--sweep-floor", "1s", "--sweep-quiet", "200ms"}},
	}
	b.ResetTimer()
	for _, r := range runs {
		b.StopTimer()
		cl := startApplyCluster(b, bin, applyAgents, r.flags...)
		b.StartTimer()
		got := applyToConverged(b, cl, hello)
		b.StopTimer()
		cl.stop()
		p50, worst := got.each[len(got.each)/2], got.each[len(got.each)-1]
		b.ReportMetric(got.total.Seconds(), r.prefix+"apply_to_converged_s")
		b.ReportMetric(p50.Seconds(), r.prefix+"service_p50_s")
		b.ReportMetric(worst.Seconds(), r.prefix+"service_max_s")
		b.Logf("berthd flags %v: %d services x %d replica on %d agents, applies took %.2f s, first apply to last converged %.2f s, "+
			"per service p50 %.2f s max %.2f s (all %v)", r.flags, applyServices, applyReplicas, applyAgents, got.applying.Seconds(),
			got.total.Seconds(), p50.Seconds(), worst.Seconds(), got.each)
		b.StartTimer()
	}
}

// firstServed is the number of services BenchmarkApplyToFirst200 applies and times.
const firstServed = 5

// BenchmarkApplyToFirst200 measures, with berthd's default flags and its gateway plugin (berthd
// on its embedded store, one berth-agent with the process driver, on loopback), the time from
// the start of a service's apply to the first 200 answered through the gateway for its domain:
// the whole path of an apply to serving, with examples/apps/hello already cached on the node (a
// warm-up service of the same bundle runs first). It applies [firstServed] one-replica services
// one after another, each timed alone, and reports their p50 and maximum. The scenario runs once
// whatever b.N; run with -benchtime 1x.
func BenchmarkApplyToFirst200(b *testing.B) {
	bin := binaries(b)
	hello := helloBundle(b)
	gw := proctest.FreeAddr(b)
	cl := startApplyCluster(b, bin, 1, "--gateway-listen", gw)
	ctx := context.Background()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, hello, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	serve := func(name string) time.Duration {
		replicas := 1
		t0 := time.Now()
		if _, err := cl.c.ApplyService(ctx, "default", name, client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
			Domains: []string{name + ".localhost"}, Replicas: &replicas, HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}); err != nil {
			b.Fatalf("apply %s: %v", name, err)
		}
		var took time.Duration
		proctest.WaitForEvery(b, applyLimit, 10*time.Millisecond, name+" answering 200 through the gateway", func() (bool, string) {
			req, _ := http.NewRequest(http.MethodGet, "http://"+gw+"/", nil)
			req.Host = name + ".localhost"
			resp, err := hc.Do(req)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, resp.Status
			}
			took = time.Since(t0)
			return true, ""
		})
		return took
	}
	warm := serve("warm")
	b.ResetTimer()
	each := make([]time.Duration, firstServed)
	for i := range each {
		each[i] = serve(fmt.Sprintf("first-%d", i))
	}
	b.StopTimer()
	slices.Sort(each)
	b.ReportMetric(each[len(each)/2].Seconds(), "p50_s")
	b.ReportMetric(each[len(each)-1].Seconds(), "max_s")
	b.Logf("apply to first 200 through the gateway, default flags: warm-up (bundle fetched) %.2f s, then %v", warm.Seconds(), each)
}
