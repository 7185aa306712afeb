package containerd_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/nodeplugins/containerd"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

// TestMain lets containerd's shim run this test binary as a container's log
// writer, as it runs berth-plugin-containerd (cmd/berth-plugin-containerd).
func TestMain(m *testing.M) {
	if logwriter.StartedByShim() {
		os.Exit(logwriter.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestLogWriterStampsContainerOutput: with a log writer, a container's stdout
// and stderr become stamped records in logseg.DirOf(LogPath), every line once
// and in order per stream, stamped within the test's clock readings around the
// run; Logs renders them back as the container wrote them, also from a driver
// started afterwards; nothing is appended to LogPath itself.
func TestLogWriterStampsContainerOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d, err := containerd.New(t.Context(), containerd.Config{Address: f.addr, Namespace: f.ns, StateDir: t.TempDir(), LogWriter: exe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	const lines = 300
	req := f.req(t, "wl_stamped", "sh", "-c",
		fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; printf 'no newline'; trap 'exit 0' TERM; while :; do sleep 1; done`, lines))
	before := time.Now()
	if _, err := d.Start(ctx(t), req); err != nil {
		t.Fatalf("Start: %v", err)
	}
	dir := logseg.DirOf(req.LogPath)
	var recs []logseg.Record
	waitFor(t, "every line as a record", func() (bool, error) {
		recs = recs[:0]
		_, err := logseg.ReadFrom(dir, 1, func(r logseg.Record) error {
			recs = append(recs, r)
			return nil
		})
		return len(recs) >= 2*lines+1, err
	})
	after := time.Now()
	next := map[string]int{logseg.Stdout: 1, logseg.Stderr: 1}
	prefix := map[string]string{logseg.Stdout: "out", logseg.Stderr: "err"}
	for i, r := range recs {
		if r.Seq != int64(i+1) {
			t.Fatalf("record %d has sequence %d", i, r.Seq)
		}
		if r.Time.Before(before.Add(-time.Second)) || r.Time.After(after.Add(time.Second)) {
			t.Fatalf("record %d stamped %v, outside the run [%v, %v]", i, r.Time, before, after)
		}
		if string(r.Text) == "no newline" {
			if !r.Partial || r.Stream != logseg.Stdout {
				t.Fatalf("the unended text: %+v, want a partial stdout record", r)
			}
			continue
		}
		want := fmt.Sprintf("%s %d", prefix[r.Stream], next[r.Stream])
		if string(r.Text) != want || r.Partial {
			t.Fatalf("record %d = %q (%s, partial %v), want %q", i, r.Text, r.Stream, r.Partial, want)
		}
		next[r.Stream]++
	}
	if next[logseg.Stdout] != lines+1 || next[logseg.Stderr] != lines+1 {
		t.Fatalf("lines per stream: %v, want %d each", next, lines)
	}
	if b, err := os.ReadFile(req.LogPath); err == nil && len(b) > 0 {
		t.Errorf("output was appended to LogPath too: %q", b[:min(len(b), 80)])
	}

	// A driver started afterwards renders the same records (the directory is a label).
	d2, err := containerd.New(t.Context(), containerd.Config{Address: f.addr, Namespace: f.ns, StateDir: t.TempDir(), LogWriter: exe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Close() })
	var buf bytes.Buffer
	if err := d2.Logs(ctx(t), &runtime.LogsRequest{WorkloadID: "wl_stamped", TailBytes: 32}, &buf); err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if got := buf.String(); !strings.HasSuffix(got, "no newline") || len(got) > 32 {
		t.Errorf("Logs tail = %q, want the last 32 bytes ending in the unended text", got)
	}
	stop, err := d2.Stop(ctx(t), &runtime.StopRequest{WorkloadID: "wl_stamped", Timeout: 20 * time.Second, Mutation: runtime.Mutation{IdempotencyKey: "stop-stamped"}})
	if err != nil || stop.State.ExitCode != 0 {
		t.Fatalf("Stop = %+v, %v; want exited 0", stop, err)
	}
}
