package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// countLines is how many numbered lines the counter workload prints.
const countLines = 4000

// counterBundle writes a release whose ./count prints "line 1" to "line <n>", in bursts of 50
// every 20 ms, and then sleeps.
func counterBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\ni=1\nwhile [ $i -le %d ]; do\n  echo \"line $i\"\n  if [ $((i %% 50)) -eq 0 ]; then sleep 0.02; fi\n  i=$((i+1))\ndone\nexec sleep 3600\n", countLines)
	if err := os.WriteFile(filepath.Join(dir, "count"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// logShipState reads a workload's log directory on its node: how many sealed segments it
// holds, how many of them are shipped, the newest sequence sealed, and whether the open
// segment holds records.
func logShipState(dir string) (segs, shipped int, lastSeq int64, open bool) {
	ss, _ := logseg.Segments(dir)
	for _, s := range ss {
		segs++
		if logseg.Shipped(dir, s.Name) {
			shipped++
		}
		lastSeq = max(lastSeq, s.LastSeq)
	}
	fi, err := os.Stat(filepath.Join(dir, logseg.CurrentFile))
	return segs, shipped, lastSeq, err == nil && fi.Size() > 0
}

// readLogs runs berth logs -o json for id and returns the lines and the CLI's stderr.
func readLogs(t *testing.T, cl *cluster, args ...string) ([]node.LogLine, string) {
	t.Helper()
	out, stderr, code := cl.runCLI(t, append([]string{"logs", "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("berth logs %v exited %d: %s", args, code, stderr)
	}
	var lines []node.LogLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var ll node.LogLine
		if err := json.Unmarshal([]byte(l), &ll); err != nil {
			// -o json of a one-off read prints the whole answer as one object.
			var whole client.WorkloadLogs
			if err := json.Unmarshal([]byte(out), &whole); err != nil {
				t.Fatalf("berth logs -o json printed %q", out[:min(len(out), 400)])
			}
			return whole.Lines, stderr + whole.Detail
		}
		lines = append(lines, ll)
	}
	return lines, stderr
}

// everyLineOnce checks that lines are "line 1" to "line n", each once, in order, with
// increasing sequence numbers (the counter writes nothing else, so a line's sequence is its
// number).
func everyLineOnce(t *testing.T, lines []node.LogLine, n int) {
	t.Helper()
	if len(lines) != n {
		t.Fatalf("%d lines, want %d; first %v last %v", len(lines), n, lines[:min(3, len(lines))], lines[max(0, len(lines)-3):])
	}
	for i, l := range lines {
		if want := fmt.Sprintf("line %d", i+1); l.Line != want {
			t.Fatalf("line %d is %q (seq %d), want %q", i, l.Line, l.Seq, want)
		}
		if i > 0 && l.Seq <= lines[i-1].Seq {
			t.Fatalf("sequence %d after %d", l.Seq, lines[i-1].Seq)
		}
	}
}

// TestLogsOutliveTheNode: a workload prints numbered lines into small segments; the agent is
// killed with SIGKILL while it ships them and started again; berth logs then returns every line
// once, in order, merged from shipped segments and the node's live tail; every segment is
// stored once in the blob store; and after the node is removed berth logs still returns every
// line, from the blob store alone, saying the live tail is unavailable (docs/logs.md).
func TestLogsOutliveTheNode(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(cl.dir, "agent-a"), filepath.Join(cl.dir, "agent.log")
	enroll := start(t, agentLog, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	metricsAddr := proctest.FreeAddr(t)
	runArgs := []string{"run", "--data-dir", agentDir, "--driver-arg=--log-segment-bytes=2048", "--driver-arg=--log-segment-age=1s",
		"--metrics-listen", metricsAddr}
	agent := start(t, agentLog, "berth-agent", runArgs...)
	cl.nodeStatus(t, "connected")

	cl.pushBundle(t, counterBundle(t, filepath.Join(t.TempDir(), "count")), "count")
	if _, err := cl.c.ApplyService(ctx, "default", "counter", client.ServiceSpec{Bundle: "count", Command: []string{"./count"}}); err != nil {
		t.Fatal(err)
	}
	var wl client.Workload
	waitFor(t, converge, "the counter's workload", func() (bool, string) {
		ws := cl.workloads(t, "counter")
		if len(ws) != 1 {
			return false, fmt.Sprint(ws)
		}
		wl = ws[0]
		return true, ""
	})
	logDir := filepath.Join(agentDir, "workloads", wl.ID, "output.segments")

	// Kill the agent while segments are being shipped, then start it again.
	waitFor(t, converge, "some segments shipped", func() (bool, string) {
		segs, shipped, last, _ := logShipState(logDir)
		return shipped >= 3 && last < countLines, fmt.Sprintf("%d segments, %d shipped, last seq %d", segs, shipped, last)
	})
	segs0, shipped0, last0, _ := logShipState(logDir)
	t.Logf("killing the agent at %d segments, %d shipped, last sealed seq %d", segs0, shipped0, last0)
	agent.Kill9()
	<-agent.Done()
	start(t, agentLog, "berth-agent", runArgs...)
	cl.nodeStatus(t, "connected")

	// Every read is "line 1" to some "line k", without a gap or a repeat: from the shipped
	// segments alone until the new session answers (the status may still show the killed
	// agent's session), then merged with the node's live tail.
	waitFor(t, converge, "a read with the live tail", func() (bool, string) {
		lines, detail := readLogs(t, cl, wl.ID)
		everyLineOnce(t, lines, len(lines))
		if strings.Contains(detail, "live tail is unavailable") {
			return false, fmt.Sprintf("%d lines, %s", len(lines), detail)
		}
		t.Logf("a merged read after the restart: %d lines", len(lines))
		return len(lines) > int(last0), fmt.Sprintf("%d lines", len(lines))
	})

	var segs int
	waitFor(t, 2*converge, "every line sealed and shipped", func() (bool, string) {
		n, shipped, last, open := logShipState(logDir)
		segs = n
		return n > 0 && shipped == n && last == countLines && !open, fmt.Sprintf("%d segments, %d shipped, last seq %d, open %v", n, shipped, last, open)
	})
	lines, _ := readLogs(t, cl, wl.ID)
	everyLineOnce(t, lines, countLines)

	// The restarted agent counted what it shipped, and dropped nothing.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^berth_log_bytes_shipped_total [1-9]`).Match(body) ||
		!regexp.MustCompile(`(?m)^berth_log_segments_dropped_total 0$`).Match(body) {
		t.Fatalf("agent metrics:\n%s", body)
	}

	// One stored copy per segment, though the restarted agent offered some again.
	blobs, err := os.ReadDir(filepath.Join(cl.dataDir(), "blobs", "logs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != segs {
		t.Fatalf("%d segment blobs stored for %d segments", len(blobs), segs)
	}

	// --grep and --tail narrow the merged read.
	if got, _ := readLogs(t, cl, wl.ID, "--grep", "^line 39[0-9][0-9]$", "--tail", "3"); len(got) != 3 || got[2].Line != "line 3999" {
		t.Fatalf("grep and tail: %+v", got)
	}

	// The node removed: the whole log still reads, from the blob store alone.
	cl.cli(t, "node", "remove", wl.NodeID)
	waitFor(t, converge, "the node removed", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range ns {
			if n.ID == wl.NodeID {
				return n.Status == "removed", n.Status
			}
		}
		return true, "gone"
	})
	lines, detail := readLogs(t, cl, wl.ID)
	everyLineOnce(t, lines, countLines)
	if !strings.Contains(detail, "live tail is unavailable") {
		t.Fatalf("the answer does not say the live tail is unavailable: %q", detail)
	}
}

// TestShippedLogRetention: berthd's retention sweep deletes shipped segments older than the
// retention from the blob store and the index; the log's newest lines stay readable from the
// node (docs/logs.md section 8).
func TestShippedLogRetention(t *testing.T) {
	t.Parallel()
	cl := newClusterWith(t, "--log-retention", "2s", "--log-sweep-interval", "1s")
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(cl.dir, "agent-a"), filepath.Join(cl.dir, "agent.log")
	enroll := start(t, agentLog, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir, "--driver-arg=--log-segment-bytes=2048", "--driver-arg=--log-segment-age=1s")
	cl.nodeStatus(t, "connected")
	cl.pushBundle(t, counterBundle(t, filepath.Join(t.TempDir(), "count")), "count")
	if _, err := cl.c.ApplyService(ctx, "default", "counter", client.ServiceSpec{Bundle: "count", Command: []string{"./count"}}); err != nil {
		t.Fatal(err)
	}
	blobDir := filepath.Join(cl.dataDir(), "blobs", "logs", "sha256")
	stored := 0
	waitFor(t, converge, "segments stored", func() (bool, string) {
		ents, _ := os.ReadDir(blobDir)
		stored = max(stored, len(ents))
		return stored >= 3, fmt.Sprintf("%d segment blobs", len(ents))
	})
	// The counter is done after a few seconds; then every segment ages past 2 s and goes.
	waitFor(t, 2*converge, "old segments deleted", func() (bool, string) {
		ents, _ := os.ReadDir(blobDir)
		ws := cl.workloads(t, "counter")
		if len(ws) != 1 {
			return false, fmt.Sprint(ws)
		}
		segs, shipped, last, open := logShipState(filepath.Join(agentDir, "workloads", ws[0].ID, "output.segments"))
		return len(ents) == 0 && last == countLines && shipped == segs && !open,
			fmt.Sprintf("%d blobs; node: %d segments, %d shipped, last %d", len(ents), segs, shipped, last)
	})
	// The node still holds its newest records; the answer reads them live.
	ws := cl.workloads(t, "counter")
	lines, _ := readLogs(t, cl, ws[0].ID, "--tail", "5")
	if len(lines) != 5 || lines[4].Line != fmt.Sprintf("line %d", countLines) {
		t.Fatalf("the newest lines after retention: %+v", lines)
	}
}
