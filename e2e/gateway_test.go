package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// gatewayRecord is the part of berthd's reattach record of the gateway this
// package reads (docs/plugins.md section 2.8).
type gatewayRecord struct {
	PID int `json:"pid"`
}

// gatewayPID returns the pid in the cluster's gateway reattach record, or 0.
func (cl *cluster) gatewayPID(t *testing.T) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(cl.dataDir(), "plugins", "gateway.reattach.json"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec gatewayRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("gateway reattach record: %v", err)
	}
	return rec.PID
}

// killGateway SIGKILLs the gateway the cluster's berthd left running: it
// outlives berthd on purpose.
func (cl *cluster) killGateway(t *testing.T) {
	if pid := cl.gatewayPID(t); pid > 0 {
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), "berth-plugin-gateway") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// enrollAgent enrolls one node and runs its agent until the test ends.
func (cl *cluster) enrollAgent(t *testing.T) {
	t.Helper()
	agentDir, agentLog := cl.enrollNode(t)
	start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(context.Background())
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", ns[0].Status
	})
}

// requestLoop sends GETs for one host through the gateway, one after the
// other, until stopped or maxRequests were sent, and counts the answers that
// are not 200 as failures.
type requestLoop struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	firstErr   string
	stop       context.CancelFunc
	done       chan struct{}
}

// maxRequests bounds a requestLoop: at one request every 10 ms and more,
// this is far more than the test needs.
const maxRequests = 100_000

func (cl *cluster) startRequestLoop(host string) *requestLoop {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	l := &requestLoop{stop: cancel, done: make(chan struct{})}
	// One connection at a time, kept alive: a gateway that dies or stops
	// accepting shows as a failed request, never as a slow one.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	go func() {
		defer close(l.done)
		defer hc.CloseIdleConnections()
		for i := 0; i < maxRequests && ctx.Err() == nil; i++ {
			err := func() error {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cl.gateway+"/", nil)
				if err != nil {
					return err
				}
				req.Host = host
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					return err
				}
				if resp.StatusCode != http.StatusOK {
					return errors.New(resp.Status)
				}
				return nil
			}()
			switch {
			case err == nil:
				l.ok.Add(1)
			case ctx.Err() != nil: // stopped mid-request: not the gateway's doing
			default:
				l.failed.Add(1)
				l.mu.Lock()
				if l.firstErr == "" {
					l.firstErr = err.Error()
				}
				l.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return l
}

// waitMore waits until n more requests succeeded than when it was called.
func (l *requestLoop) waitMore(t *testing.T, n int64, what string) {
	t.Helper()
	from := l.ok.Load()
	waitFor(t, converge, what, func() (bool, string) {
		return l.ok.Load() >= from+n, fmt.Sprintf("ok %d failed %d", l.ok.Load(), l.failed.Load())
	})
}

func (l *requestLoop) finish() (ok, failed int64, firstErr string) {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load(), l.failed.Load(), l.firstErr
}

// TestGatewayOutlivesBerthd: berthd is killed with SIGKILL, started again,
// stopped with SIGTERM and started again while a request loop runs through
// the gateway to a route that does not change. Not one request fails, the
// gateway process is the same one throughout (berthd reattaches to it), and
// a route added after the last return is served (docs/plugins.md section 5.3).
func TestGatewayOutlivesBerthd(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.enrollAgent(t)
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)
	cl.waitAnswering(t, "hello.localhost", ids)
	pid := cl.gatewayPID(t)
	if pid <= 0 {
		t.Fatal("berthd wrote no reattach record for the gateway")
	}

	loop := cl.startRequestLoop("hello.localhost")
	t.Cleanup(func() { loop.finish() })
	loop.waitMore(t, 20, "requests through the gateway before berthd stops")

	cl.berthd.Kill9()
	loop.waitMore(t, 50, "requests through the gateway while berthd is gone after SIGKILL")
	startBerthd(t, cl)
	cl.wantGatewayPID(t, pid)
	loop.waitMore(t, 20, "requests through the gateway after berthd's return")

	cl.berthd.Stop() // SIGTERM: berthd shuts down and lets the gateway go
	if code := cl.berthd.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("berthd exited %d after SIGTERM", code)
	}
	loop.waitMore(t, 50, "requests through the gateway while berthd is gone after SIGTERM")
	startBerthd(t, cl)
	cl.wantGatewayPID(t, pid)
	loop.waitMore(t, 20, "requests through the gateway after berthd's second return")

	// A route change after the return reaches the same gateway.
	y := `name: hello
project: default
bundle: hello
command: ["./hello"]
domains: ["hello.localhost", "again.localhost"]
replicas: 1
health_check: {path: /healthz, interval_s: 1}
`
	if err := os.WriteFile(spec, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "apply", "-f", spec)
	cl.waitAnswering(t, "again.localhost", cl.workloadIDs(t, "hello"))
	loop.waitMore(t, 5, "requests through the gateway after the route change")

	ok, failed, first := loop.finish()
	if failed != 0 {
		t.Fatalf("%d of %d requests through the gateway failed across berthd's restarts; first: %s", failed, ok+failed, first)
	}
	if got := cl.gatewayPID(t); got != pid {
		t.Fatalf("gateway pid changed from %d to %d", pid, got)
	}
	t.Logf("%d requests through the gateway, none failed, gateway pid %d throughout", ok, pid)

	// berthd's /metrics carries the gateway's counts, which went on while
	// berthd was away (docs/plugins.md section 5.5).
	var served float64
	waitFor(t, converge, "gateway requests on berthd's /metrics", func() (bool, string) {
		served = gatewayRequests(t, cl, "default/hello")
		return served >= float64(ok), fmt.Sprintf("%v of %d", served, ok)
	})
	// The access log has one JSON line per request, with a request id.
	raw, err := os.ReadFile(filepath.Join(cl.dir, "berthd", "plugins", "gateway", "access.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var line struct {
		Host      string `json:"host"`
		Status    int    `json:"status"`
		RequestID string `json:"request_id"`
		Upstream  string `json:"upstream"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &line); err != nil || line.RequestID == "" || line.Upstream == "" || line.Status == 0 {
		t.Fatalf("last access log line %q: %+v, %v", lines[len(lines)-1], line, err)
	}
	if int64(len(lines)) < ok-int64(2*maxAccessLogLag) {
		t.Fatalf("access log has %d lines for %d requests", len(lines), ok)
	}
	// Its own log is in its state directory too, since stderr died with the first berthd.
	if own, err := os.ReadFile(filepath.Join(cl.dir, "berthd", "plugins", "gateway", "gateway.log")); err != nil || !strings.Contains(string(own), "gateway listening") {
		t.Fatalf("gateway.log: %v\n%s", err, own)
	}
}

// maxAccessLogLag bounds how many lines may still sit in the gateway's
// access log buffer (it writes out every second) when the test reads it.
const maxAccessLogLag = 200

// gatewayRequests sums berth_gateway_requests_total of service on berthd's
// /metrics.
func gatewayRequests(t *testing.T, cl *cluster, service string) float64 {
	t.Helper()
	hc, err := client.PinnedHTTPClient(cl.fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cl.url + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "berth_gateway_requests_total{") || !strings.Contains(l, `service="`+service+`"`) || !strings.Contains(l, `code_class="2xx"`) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// wantGatewayPID checks that berthd runs the gateway at pid: its reattach
// record and its plugin listing both name it.
func (cl *cluster) wantGatewayPID(t *testing.T, pid int) {
	t.Helper()
	if got := cl.gatewayPID(t); got != pid {
		t.Fatalf("gateway reattach record names pid %d, want %d (the gateway was replaced)", got, pid)
	}
	waitFor(t, converge, "berthd lists the reattached gateway", func() (bool, string) {
		out := cl.cli(t, "plugins", "-o", "json")
		var ps []struct {
			Name  string `json:"name"`
			State string `json:"state"`
			PID   int    `json:"pid"`
		}
		if err := json.Unmarshal([]byte(out), &ps); err != nil {
			return false, out
		}
		for _, p := range ps {
			if p.Name == "gateway" {
				return p.State == "running" && p.PID == pid, fmt.Sprintf("%+v", p)
			}
		}
		return false, out
	})
}
