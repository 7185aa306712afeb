package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

const converge = 60 * time.Second

// TestDeployThroughGateway is the foundation's end-to-end scenario: enroll,
// apply, traffic to every replica, scale, crash recovery, agent and core
// restarts, deletion.
func TestDeployThroughGateway(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()

	// Enroll one node with the CLI's join token, then run its agent.
	var jt client.JoinToken
	if err := json.Unmarshal([]byte(cl.cli(t, "join-token", "create", "-o", "json")), &jt); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(jt.JoinCommand, jt.Token) || !strings.Contains(jt.JoinCommand, "--fingerprint "+cl.fingerprint) ||
		!strings.Contains(jt.JoinCommand, "--server "+cl.url) {
		t.Fatalf("join command %q does not carry the server URL, the token and the fingerprint", jt.JoinCommand)
	}
	agentDir := filepath.Join(cl.dir, "agent")
	enroll := start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "enroll",
		"--server", cl.url, "--join-token", jt.Token, "--fingerprint", cl.fingerprint, "--data-dir", agentDir, "--label", "zone=test")
	<-enroll.Done()
	if enroll.Cmd().ProcessState.ExitCode() != 0 {
		t.Fatalf("enroll exited %d", enroll.Cmd().ProcessState.ExitCode())
	}
	agent := start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", ns[0].Status
	})

	// Every apply is evaluated by a bound policy that allows it, so its metrics move too.
	cl.bindAllowPolicy(t)

	// Apply 2 replicas with the CLI.
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 2)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)

	// The gateway plugin is listed, running and healthy.
	if out := cl.cli(t, "plugins"); !strings.Contains(out, "gateway") || !strings.Contains(out, "running") {
		t.Fatalf("berth plugins:\n%s", out)
	}

	// Scale to 3 and back to 1.
	writeSpec(t, spec, 3)
	cl.cli(t, "apply", "-f", spec)
	ids = cl.waitReplicas(t, "hello", 3)
	cl.waitAnswering(t, "hello.localhost", ids)
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids = cl.waitReplicas(t, "hello", 1)
	cl.waitAnswering(t, "hello.localhost", ids)
	waitFor(t, converge, "scaled-down processes gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)
		return len(pids) == 1 && len(pids[ids[0]]) == 1, fmt.Sprint(pids)
	})

	// The workload's output and the node's metrics, read from the node.
	cl.checkLogsAndMetrics(t, ids[0])

	// kill -9 the workload: the agent restarts it.
	victim := cl.workloadPIDs(t)[ids[0]][0]
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "workload restarted after kill -9", func() (bool, string) {
		ws := cl.workloads(t, "hello")
		pids := cl.workloadPIDs(t)[ids[0]]
		ok := len(ws) == 1 && ws[0].RestartCount >= 1 && len(pids) == 1 && pids[0] != victim && ws[0].Health == "passing"
		return ok, fmt.Sprintf("%+v pids=%v", ws, pids)
	})
	cl.waitAnswering(t, "hello.localhost", ids)

	// kill -9 the agent: the workload keeps serving; a new agent adopts it without a restart.
	before := cl.workloadPIDs(t)
	agent.Kill9()
	for i := 0; i < 5; i++ {
		cl.mustAnswer(t, "hello.localhost", ids[0])
	}
	waitFor(t, converge, "node disconnected", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		return len(ns) == 1 && ns[0].Status == "disconnected", fmt.Sprint(ns)
	})
	cl.mustAnswer(t, "hello.localhost", ids[0])
	restarts := cl.workloads(t, "hello")[0].RestartCount
	agent = start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node reconnected and reporting", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		return len(ns) == 1 && ns[0].Status == "connected" && ns[0].AppliedRev == ns[0].DesiredRev, fmt.Sprint(ns)
	})
	if after := cl.workloadPIDs(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("agent restart changed workload processes: before %v, after %v", before, after)
	}
	if ws := cl.workloads(t, "hello"); ws[0].RestartCount != restarts {
		t.Fatalf("restart count moved from %d to %d across an agent restart", restarts, ws[0].RestartCount)
	}
	cl.mustAnswer(t, "hello.localhost", ids[0])

	// berthd's /metrics carries every family of the operating guide, each moved by this run.
	cl.waitMetricFamilies(t)

	// kill -9 berthd and restart it: the state is intact.
	svcBefore, err := cl.c.GetService(ctx, "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	cl.berthd.Kill9()
	startBerthd(t, cl)
	svcAfter, err := cl.c.GetService(ctx, "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	if svcAfter.Revision != svcBefore.Revision || svcAfter.BundleDigest != svcBefore.BundleDigest || svcAfter.ID != svcBefore.ID {
		t.Fatalf("service changed across a core restart: %+v -> %+v", svcBefore, svcAfter)
	}
	if got := cl.workloadIDs(t, "hello"); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("workloads changed across a core restart: %v -> %v", ids, got)
	}
	waitFor(t, converge, "node reconnected to the new core", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		return len(ns) == 1 && ns[0].Status == "connected", fmt.Sprint(ns)
	})
	cl.waitAnswering(t, "hello.localhost", ids)
	if after := cl.workloadPIDs(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("core restart changed workload processes: before %v, after %v", before, after)
	}

	// Delete: the processes go and the host answers 404.
	cl.cli(t, "delete", "service", "hello")
	waitFor(t, converge, "workload processes gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)
		return len(pids) == 0, fmt.Sprint(pids)
	})
	waitFor(t, converge, "host answering 404", func() (bool, string) {
		resp, err := cl.get("hello.localhost", "/")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 404, resp.Status
	})
}

func writeSpec(t *testing.T, path string, replicas int) {
	t.Helper()
	y := fmt.Sprintf(`name: hello
project: default
bundle: hello
command: ["./hello"]
domains: ["hello.localhost"]
replicas: %d
health_check: {path: /healthz, interval_s: 1}
`, replicas)
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (cl *cluster) workloads(t *testing.T, service string) []client.Workload {
	t.Helper()
	ws, err := cl.c.ListWorkloads(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	var out []client.Workload
	for _, w := range ws {
		if w.Service == service {
			out = append(out, w)
		}
	}
	return out
}

func (cl *cluster) workloadIDs(t *testing.T, service string) []string {
	var ids []string
	for _, w := range cl.workloads(t, service) {
		ids = append(ids, w.ID)
	}
	sort.Strings(ids)
	return ids
}

// waitReplicas waits until the service's rollout converged (docs/reconciliation.md section 7:
// every change of what runs replaces the replicas under the service's rollout bounds) and it has
// exactly n workloads, all running and passing.
func (cl *cluster) waitReplicas(t *testing.T, service string, n int) []string {
	t.Helper()
	waitFor(t, 3*converge, fmt.Sprintf("%d healthy replicas of %s", n, service), func() (bool, string) {
		st, err := cl.c.Rollout(context.Background(), "default", service)
		if err != nil {
			return false, err.Error()
		}
		if st.Verdict.State != "converged" || st.Verdict.SpecRevision != st.SpecRevision || st.Updated != n || st.Outdated != 0 {
			return false, fmt.Sprintf("rollout %+v", st)
		}
		ws := cl.workloads(t, service)
		if len(ws) != n {
			return false, fmt.Sprintf("%+v", ws)
		}
		for _, w := range ws {
			if w.ObservedStatus != "running" || w.Health != "passing" {
				return false, fmt.Sprintf("%+v", ws)
			}
		}
		return true, ""
	})
	return cl.workloadIDs(t, service)
}

// waitAnswering waits until requests through the gateway reach every one of
// ids and nothing else.
func (cl *cluster) waitAnswering(t *testing.T, host string, ids []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	waitFor(t, converge, fmt.Sprintf("%s answering from %v", host, ids), func() (bool, string) {
		seen := map[string]bool{}
		for i := 0; i < 4*len(ids); i++ {
			resp, err := cl.get(host, "/")
			if err != nil {
				return false, err.Error()
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return false, fmt.Sprintf("%s: %s", resp.Status, body)
			}
			id := workloadIn(string(body))
			if !want[id] {
				return false, "answer from unexpected workload: " + string(body)
			}
			seen[id] = true
		}
		return len(seen) == len(ids), fmt.Sprintf("seen %v", seen)
	})
}

func (cl *cluster) mustAnswer(t *testing.T, host, id string) {
	t.Helper()
	resp, err := cl.get(host, "/")
	if err != nil {
		t.Fatalf("request through gateway: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || workloadIn(string(body)) != id {
		t.Fatalf("gateway answered %s %q, want 200 from %s", resp.Status, body, id)
	}
}

// workloadIn returns the wl_ id in a hello answer.
func workloadIn(body string) string {
	for _, f := range strings.Fields(body) {
		if strings.HasPrefix(f, "wl_") {
			return f
		}
	}
	return ""
}

// checkLogsAndMetrics reads a workload's output through berth logs, follows
// it on as many streams as one session carries (the next is refused with
// stream_limit), and asks the node for its metrics (docs/node-protocol.md
// sections 5.15 and 5.17).
func (cl *cluster) checkLogsAndMetrics(t *testing.T, workloadID string) {
	t.Helper()
	if out := cl.cli(t, "logs", workloadID, "--tail", "20"); !strings.Contains(out, "msg=") {
		t.Fatalf("berth logs %s printed no output of the app:\n%s", workloadID, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	opened := make(chan struct{}, node.MaxStreamsPerSession)
	for range node.MaxStreamsPerSession {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_ = cl.c.FollowWorkloadLogs(ctx, workloadID, 1, func(node.LogLine) error {
				if first {
					first = false
					opened <- struct{}{}
				}
				return nil
			})
		}()
	}
	deadline := time.After(converge)
	for range node.MaxStreamsPerSession {
		select {
		case <-opened:
		case <-deadline:
			t.Fatalf("not all %d followed log streams delivered a line within %s", node.MaxStreamsPerSession, converge)
		}
	}
	err := cl.c.FollowWorkloadLogs(ctx, workloadID, 1, func(node.LogLine) error { return nil })
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Problem.Code != "stream_limit" || apiErr.Status != 429 {
		t.Fatalf("stream %d answered %v, want 429 stream_limit", node.MaxStreamsPerSession+1, err)
	}
	cancel()
	wg.Wait()
	// Closed streams free their slots: a new follow is served again.
	waitFor(t, converge, "a follow served after the others closed", func() (bool, string) {
		fctx, fcancel := context.WithCancel(context.Background())
		defer fcancel()
		err := cl.c.FollowWorkloadLogs(fctx, workloadID, 1, func(node.LogLine) error { fcancel(); return nil })
		return err == nil, fmt.Sprint(err)
	})
	nodeID := ""
	for _, w := range cl.workloads(t, "hello") {
		if w.ID == workloadID {
			nodeID = w.NodeID
		}
	}
	var m node.Metrics
	if err := json.Unmarshal([]byte(cl.cli(t, "node", "metrics", nodeID, "--workload", workloadID, "-o", "json")), &m); err != nil || m.IntervalS <= 0 {
		t.Fatalf("berth node metrics: %+v %v", m, err)
	}
	if _, err := cl.c.NodeMetrics(context.Background(), "nod_unknown"); !errors.As(err, &apiErr) || apiErr.Problem.Code != "node_not_found" {
		t.Fatalf("metrics of an unknown node: %v, want node_not_found", err)
	}
}
