// Package node measures berthd's side of the node session
// (docs/node-protocol.md): how many simulated agents one berthd holds, how
// fast a change fans out to 1,000 nodes, and what a cluster relay costs
// (docs/relay.md section 13). Run with make bench.
package node

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// berthd is one berthd process started by a benchmark.
type berthd struct {
	proc        *proctest.Proc
	dataDir     string
	url         string
	token       string
	fingerprint string
	hc          *http.Client
	c           *client.Client
}

func binDir(b *testing.B) string {
	b.Helper()
	if d := os.Getenv("BERTH_BIN_DIR"); d != "" {
		return d
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/berthd", "./cmd/berth-relay")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, o)
	}
	return dir
}

func startBerthd(b *testing.B) *berthd {
	b.Helper()
	dir := b.TempDir()
	ln := proctest.FreeAddr(b)
	d := &berthd{url: "https://" + ln, dataDir: filepath.Join(dir, "data")}
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--listen", ln, "--gateway-listen", "off", "--log-level", "warn"}
	if v := os.Getenv("BERTH_BENCH_DEBUG_LISTEN"); v != "" {
		args = append(args, "--debug-listen", v) // profile berthd while it runs
	}
	d.proc = proctest.Start(b, filepath.Join(dir, "berthd.log"), filepath.Join(binDir(b), "berthd"), args...)
	// Runs before Start's own cleanup, so berthd keeps 20 s between SIGTERM and SIGKILL.
	b.Cleanup(func() { d.proc.StopWithin(20 * time.Second) })
	ready := proctest.WaitBerthdReady(b, d.proc, filepath.Join(dir, "data"), d.url, 60*time.Second)
	d.fingerprint, d.token, d.hc = ready.Fingerprint, ready.Token, ready.HTTP
	var err error
	if d.c, err = client.New(d.url, client.WithToken(d.token), client.WithHTTPClient(d.hc)); err != nil {
		b.Fatal(err)
	}
	return d
}

// cpuSeconds is berthd's user+system CPU time so far.
func (d *berthd) cpuSeconds(b *testing.B) float64 {
	b.Helper()
	return procCPUSeconds(b, d.proc.Cmd().Process.Pid)
}

// rssBytes is berthd's resident memory.
func (d *berthd) rssBytes(b *testing.B) float64 {
	b.Helper()
	return procRSSBytes(b, d.proc.Cmd().Process.Pid)
}

// procCPUSeconds is process pid's user+system CPU time so far.
func procCPUSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// procRSSBytes is process pid's resident memory.
func procRSSBytes(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb * 1024
		}
	}
	return 0
}

// logHead returns the change log's head seq and hash, so that simulated
// agents start as nodes that already follow it.
func (d *berthd) logHead(ctx context.Context, b *testing.B) (int64, string) {
	b.Helper()
	get := func(path string, out any) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := d.hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			b.Fatal(err)
		}
	}
	var head struct {
		HeadSeq int64 `json:"head_seq"`
	}
	get("/api/v1/changelog?from_seq=1&limit=1", &head)
	var page struct {
		Entries []node.LogEntry `json:"entries"`
	}
	get(fmt.Sprintf("/api/v1/changelog?from_seq=%d&limit=1", head.HeadSeq), &page)
	if len(page.Entries) != 1 {
		b.Fatalf("change log head %d not served", head.HeadSeq)
	}
	return head.HeadSeq, page.Entries[0].Hash
}

// simNode is one simulated agent: enrolled, then a real TLS WebSocket session
// that answers as berth-agent does and heartbeats every 5 s.
type simNode struct {
	id, cred  string
	connected atomic.Bool
	dropped   atomic.Int64 // sessions that ended while the benchmark ran
	mu        sync.Mutex
	sawAt     time.Time // when the node acknowledged a desired_state holding wanted
	// sawLag is how long that desired_state took from its issued_at (stamped by berthd right
	// before it signs and sends it) to this node's reading it: the transport alone.
	sawLag time.Duration
	// wanted is the generation watched for: a workload with env BENCH_GEN=wanted, or a route
	// whose hostname starts with "gen<wanted>-".
	wanted string
	// lastReport is the status_report answering the newest desired_state,
	// repeated every 30 s as a real agent does.
	lastReport node.StatusReport
}

// enroll enrolls n nodes into cluster (empty: the default one), labelled sim=<cluster>-<i>
// (sim=default-<i>): it makes their join tokens first (8 requests at a time), then enrolls
// them 16 at a time, and returns the nodes and the enrollments per second (the enrollments
// alone, without the token creation). It fails b when ctx ends first.
func enroll(ctx context.Context, b *testing.B, d *berthd, n int, cluster string) ([]*simNode, float64) {
	b.Helper()
	out := make([]*simNode, n)
	tokens := make([]string, n)
	parallel := func(width int, do func(i int) error) {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		sem := make(chan struct{}, width)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := do(i); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatalf("enroll: %v", err)
		}
	}
	parallel(8, func(i int) error {
		jt, err := d.c.CreateJoinToken(ctx, client.JoinTokenRequest{Cluster: cluster})
		if err == nil {
			tokens[i] = jt.Token
		}
		return err
	})
	t0 := time.Now()
	parallel(16, func(i int) error {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		r, err := d.c.Enroll(ctx, client.EnrollRequest{JoinToken: tokens[i], PublicKey: base64.StdEncoding.EncodeToString(pub),
			Hostname: fmt.Sprintf("sim-%d", i), Address: "127.0.0.1", Capacity: client.Capacity{CPUs: 4, MemoryMB: 8192},
			Labels: map[string]string{"sim": simLabel(cluster, i)}})
		if err != nil {
			return err
		}
		out[i] = &simNode{id: r.NodeID, cred: r.Credential}
		return nil
	})
	return out, float64(n) / time.Since(t0).Seconds()
}

// simLabel is the sim label enroll gives node i of cluster.
func simLabel(cluster string, i int) string {
	if cluster == "" {
		cluster = "default"
	}
	return fmt.Sprintf("%s-%d", cluster, i)
}

// run keeps the node's session until ctx ends, dialling base (berthd's URL, or a relay's) with
// hc, and dialling again 1 s after a session ended.
func (s *simNode) run(ctx context.Context, base string, hc *http.Client, logSeq int64, logHash string) {
	u := "wss" + strings.TrimPrefix(base, "https") + "/api/v1/nodes/session"
	for ctx.Err() == nil {
		err := s.session(ctx, u, hc, logSeq, logHash)
		s.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		s.dropped.Add(1)
		_ = err
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *simNode) session(ctx context.Context, u string, hc *http.Client, logSeq int64, logHash string) error {
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + s.cred}}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return err
	}
	defer ws.CloseNow()
	ws.SetReadLimit(4 << 20)
	var wmu sync.Mutex
	send := func(typ node.Type, re string, body any) error {
		raw, _ := json.Marshal(body)
		frame, _ := json.Marshal(node.Envelope{V: 1, Type: typ, ID: "msg_sim", Re: re, Body: raw})
		wmu.Lock()
		defer wmu.Unlock()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return ws.Write(wctx, websocket.MessageText, frame)
	}
	// Allocatable as berth-agent reports it (section 5.1): without it berthd knows no capacity,
	// ranks every node as equally loaded, and the decider's lowest-id tie-break put every
	// service's replicas on the same 100 nodes, so the other 900 never got one.
	if err := send(node.TypeHello, "", node.Hello{NodeID: s.id, AgentVersion: "bench", Drivers: []string{"process"},
		Capacity: node.Resources{CPUs: 4, MemoryMB: 8192}, Allocatable: &node.Allocatable{CPUMilli: 4000, MemoryMiB: 8192},
		LogSeq: logSeq, LogHash: logHash}); err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Heartbeats every 5 s, the first at a random offset so that N
		// nodes do not beat in step.
		var off [1]byte
		_, _ = rand.Read(off[:])
		// A real agent also sends its status_report at least every 30 s
		// (section 4.2 rule 7), so every sixth beat carries the last one.
		t := time.NewTimer(time.Duration(off[0]) * 5 * time.Second / 256)
		defer t.Stop()
		for beat := 1; ; beat++ {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if send(node.TypeHeartbeat, "", node.Heartbeat{Time: time.Now().UTC()}) != nil {
					return
				}
				if beat%6 == 0 {
					s.mu.Lock()
					rep := s.lastReport
					s.mu.Unlock()
					if send(node.TypeStatusReport, "", rep) != nil {
						return
					}
				}
				t.Reset(node.DefaultHeartbeatInterval)
			}
		}
	}()
	for {
		_, raw, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		var env node.Envelope
		if json.Unmarshal(raw, &env) != nil {
			continue
		}
		switch env.Type {
		case node.TypeWelcome:
			s.connected.Store(true)
		case node.TypeDesiredState:
			var ds node.DesiredState
			_ = json.Unmarshal(env.Body, &ds)
			if err := send(node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok"}); err != nil {
				return err
			}
			s.mu.Lock()
			if s.wanted != "" && s.sawAt.IsZero() {
				for _, w := range ds.Spec.Workloads {
					if w.Env["BENCH_GEN"] == s.wanted {
						s.sawAt = time.Now()
					}
				}
				for _, r := range ds.Spec.Routes {
					if strings.HasPrefix(r.Hostname, "gen"+s.wanted+"-") {
						s.sawAt = time.Now()
					}
				}
				if !s.sawAt.IsZero() {
					s.sawLag = s.sawAt.Sub(ds.IssuedAt)
				}
			}
			s.mu.Unlock()
			rep := node.StatusReport{AppliedRev: ds.Rev, Workloads: []node.WorkloadStatus{}}
			for _, w := range ds.Spec.Workloads {
				rep.Workloads = append(rep.Workloads, node.WorkloadStatus{WorkloadID: w.WorkloadID, ObservedStatus: node.StatusRunning,
					Health: node.HealthPassing, Address: "127.0.0.1:1"})
			}
			s.mu.Lock()
			s.lastReport = rep
			s.mu.Unlock()
			if err := send(node.TypeStatusReport, "", rep); err != nil {
				return err
			}
		case node.TypeLogEntries:
			var le node.LogEntries
			_ = json.Unmarshal(env.Body, &le)
			if n := len(le.Entries); n > 0 {
				if err := send(node.TypeLogAck, env.ID, node.LogAck{Seq: le.Entries[n-1].Seq, Hash: le.Entries[n-1].Hash}); err != nil {
					return err
				}
			}
		case node.TypePing:
			if err := send(node.TypePong, env.ID, struct{}{}); err != nil {
				return err
			}
		}
	}
}

func countConnected(nodes []*simNode) (int, int64) {
	c, dropped := 0, int64(0)
	for _, n := range nodes {
		if n.connected.Load() {
			c++
		}
		dropped += n.dropped.Load()
	}
	return c, dropped
}

// waitConnected waits until every node is welcomed.
func waitConnected(b *testing.B, nodes []*simNode, within time.Duration) bool {
	b.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c, _ := countConnected(nodes); c == len(nodes) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// note logs a figure as it is taken, also on stderr, since a step can take minutes.
func note(b *testing.B, format string, args ...any) {
	b.Helper()
	b.Logf(format, args...)
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func steps(def string) []int {
	v := os.Getenv("BERTH_BENCH_SESSIONS")
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// selfCPUSeconds is this benchmark process's user+system CPU time so far: the simulated nodes'.
func selfCPUSeconds(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// benchBudget bounds each node benchmark, start to end, on this machine's size.
const benchBudget = 9*time.Minute + 30*time.Second

// BenchmarkSessions connects simulated agents to one berthd in steps
// (BERTH_BENCH_SESSIONS, default 1000,5000), each over real TLS WebSockets
// with heartbeats every 5 s (and a status report every 30 s). It takes
// berthd's resident memory once idle, then at each step measures over 15 s
// berthd's CPU and, separately, this process's (the simulated nodes share
// the machine). It reports the largest step held (all sessions up, none
// dropped), berthd's and the simulated nodes' cores there, berthd's idle RSS
// and its memory per session added since the previous step. The whole benchmark stops at
// [benchBudget] and reports the last step it finished.
func BenchmarkSessions(b *testing.B) {
	deadline := time.Now().Add(benchBudget)
	d := startBerthd(b)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	time.Sleep(10 * time.Second) // let the fresh berthd settle before its idle memory is taken
	base := d.rssBytes(b)
	note(b, "berthd idle RSS %.1f MiB", base/(1<<20))
	// Every node is enrolled before any session starts: each enrollment is a change-log entry
	// that every live session is sent and acknowledges, so enrolling beside thousands of
	// sessions measures the log's fan-out, not the sessions held.
	sizes := steps("1000,5000")
	all, rate := enroll(ctx, b, d, sizes[len(sizes)-1], "")
	note(b, "enrolled %d nodes at %.0f nodes/s", len(all), rate)
	seq, hash := d.logHead(ctx, b)
	var nodes []*simNode
	held, perSession, cores, simCores := 0, 0.0, 0.0, 0.0
	prevN, prevRSS := 0, base
	for _, n := range sizes {
		// A step needs time to connect, 10 s to settle and 15 s to measure.
		if time.Until(deadline) < 2*time.Minute {
			note(b, "%d sessions: not started, %s of the budget left", n, time.Until(deadline).Round(time.Second))
			break
		}
		more := all[len(nodes):n]
		for _, s := range more {
			wg.Add(1)
			go func() { defer wg.Done(); s.run(ctx, d.url, d.hc, seq, hash) }()
		}
		nodes = append(nodes, more...)
		// Connecting may take what the budget leaves but the settle and the measured window.
		if !waitConnected(b, nodes, time.Until(deadline)-40*time.Second) {
			c, _ := countConnected(nodes)
			note(b, "%d sessions: only %d connected in time", n, c)
			break
		}
		time.Sleep(10 * time.Second) // connection and placement work settles
		_, dropBefore := countConnected(nodes)
		cpu0, self0, t0 := d.cpuSeconds(b), selfCPUSeconds(b), time.Now()
		time.Sleep(15 * time.Second) // the measured window: three heartbeat periods
		span := time.Since(t0).Seconds()
		use, sim := (d.cpuSeconds(b)-cpu0)/span, (selfCPUSeconds(b)-self0)/span
		rss := d.rssBytes(b)
		c, dropAfter := countConnected(nodes)
		// Per session: the slope from the previous step (the first step's over idle), since the
		// idle figure holds heap the runtime has not returned yet, which the first sessions reuse.
		slope := (rss - prevRSS) / float64(n-prevN)
		note(b, "%d sessions: %d connected, %d dropped, berthd %.2f cores, simulated nodes %.2f cores, RSS %.0f MiB (idle %.0f MiB; %.1f KiB per session over idle, %.1f KiB per added session)",
			n, c, dropAfter-dropBefore, use, sim, rss/(1<<20), base/(1<<20), (rss-base)/float64(n)/1024, slope/1024)
		if c != n || dropAfter != dropBefore {
			break
		}
		held, perSession, cores, simCores = n, slope, use, sim
		prevN, prevRSS = n, rss
	}
	b.ReportMetric(float64(held), "sessions_held")
	b.ReportMetric(cores, "berthd_cores_at_held")
	b.ReportMetric(simCores, "sim_nodes_cores_at_held")
	b.ReportMetric(base/(1<<20), "idle_rss_MiB")
	b.ReportMetric(perSession/1024, "KiB/session")
}

// BenchmarkFanOut connects 1,000 simulated agents (BERTH_BENCH_FANOUT_NODES)
// and reports the enrollment rate; it places one replica on each (services of
// at most 100 replicas, the API's cap) and measures, per node, the time from
// the first apply's answer until the node acknowledged a desired_state holding
// the workload (first placement on fresh nodes), then gives every service a
// domain and measures the same until each node's desired state carries the
// route (a change that reaches every node without a rolling replacement).
// p50, p99 and the last node of both, and berthd's CPU seconds for each. The whole benchmark is bounded by
// [benchBudget]: a node that did not acknowledge by then counts at the time
// the wait gave up, and *_acked says how many did.
func BenchmarkFanOut(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_FANOUT_NODES")); err == nil && v > 0 {
		n = v
	}
	deadline := time.Now().Add(benchBudget)
	d := startBerthd(b)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	nodes, rate := enroll(ctx, b, d, n, "")
	note(b, "enrolled %d nodes at %.0f nodes/s", n, rate)
	b.ReportMetric(rate, "enroll_nodes/s")
	seq, hash := d.logHead(ctx, b)
	for _, s := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); s.run(ctx, d.url, d.hc, seq, hash) }()
	}
	if !waitConnected(b, nodes, min(3*time.Minute, time.Until(deadline))) {
		c, dropped := countConnected(nodes)
		b.Fatalf("%d of %d nodes connected within 3 min (%d sessions dropped)", c, n, dropped)
	}
	note(b, "%d sessions up", n)
	pushApp(ctx, b, d)
	// apply applies generation gen to every service: the first generation places them, a later
	// one gives them the domain gen<gen>-fan<i>.localhost. A domain reaches every node holding
	// the service's workloads as a route of its desired state without replacing the workload (it
	// is not part of the attempt key, docs/reconciliation.md section 2), so the change measures
	// the fan-out itself; a change of environment would be a rolling replacement, one replica
	// at a time after the previous one is ready.
	apply := func(gen string) time.Time {
		for _, s := range nodes {
			s.mu.Lock()
			s.wanted, s.sawAt = gen, time.Time{}
			s.mu.Unlock()
		}
		// A service holds at most 100 replicas, so the change is applied
		// to ceil(n/100) services back to back; the clock starts at the first answer.
		var t0 time.Time
		for i := 0; i*100 < n; i++ {
			r := min(100, n-i*100)
			spec := client.ServiceSpec{Bundle: "app", Command: []string{"./app"}, Env: map[string]string{"BENCH_GEN": "1"}, Replicas: &r}
			if gen != "1" {
				spec.Domains = []string{fmt.Sprintf("gen%s-fan%d.localhost", gen, i)}
			}
			if _, err := d.c.ApplyService(ctx, "default", fmt.Sprintf("fan%d", i), spec); err != nil {
				b.Fatal(err)
			}
			if t0.IsZero() {
				t0 = time.Now()
			}
		}
		return t0
	}
	// wait returns every node's latency, sorted; a node that did not acknowledge by limit counts
	// at limit. acked is how many did.
	wait := func(t0 time.Time, limit time.Time) (lat []time.Duration, acked int) {
		for {
			lat = lat[:0]
			for _, s := range nodes {
				s.mu.Lock()
				if !s.sawAt.IsZero() {
					lat = append(lat, max(s.sawAt.Sub(t0), 0))
				}
				s.mu.Unlock()
			}
			acked = len(lat)
			if acked == n || time.Now().After(limit) {
				for len(lat) < n {
					lat = append(lat, time.Since(t0))
				}
				slices.Sort(lat)
				return lat, acked
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	pct := func(lat []time.Duration, p float64) time.Duration {
		return lat[int(math.Ceil(p*float64(len(lat))))-1]
	}
	// The first placement may take at most half of what is left; the change the rest.
	cpu0 := d.cpuSeconds(b)
	t0 := apply("1")
	first, firstAcked := wait(t0, time.Now().Add(time.Until(deadline)/2))
	note(b, "first placement on %d nodes: %d acknowledged, p50 %s p99 %s last %s, berthd %.1f CPU s", n, firstAcked, pct(first, .5), pct(first, .99), first[n-1], d.cpuSeconds(b)-cpu0)
	b.ReportMetric(d.cpuSeconds(b)-cpu0, "first_berthd_cpu_s")
	b.ReportMetric(float64(pct(first, .5).Milliseconds()), "first_p50_ms")
	b.ReportMetric(float64(pct(first, .99).Milliseconds()), "first_p99_ms")
	b.ReportMetric(float64(firstAcked), "first_acked")
	if firstAcked == n {
		cpu0 = d.cpuSeconds(b)
		t0 = apply("2")
		lat, acked := wait(t0, deadline.Add(-20*time.Second))
		note(b, "change on %d nodes: %d acknowledged, p50 %s p99 %s last %s, berthd %.1f CPU s", n, acked, pct(lat, .5), pct(lat, .99), lat[n-1], d.cpuSeconds(b)-cpu0)
		b.ReportMetric(d.cpuSeconds(b)-cpu0, "change_berthd_cpu_s")
		b.ReportMetric(float64(pct(lat, .5).Milliseconds()), "change_p50_ms")
		b.ReportMetric(float64(pct(lat, .99).Milliseconds()), "change_p99_ms")
		b.ReportMetric(float64(lat[n-1].Milliseconds()), "change_last_ms")
		b.ReportMetric(float64(acked), "change_acked")
	}
	b.ReportMetric(float64(n), "nodes")
}
