package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/internal/proctest"
)

// TestLogsFromStampedRecords: a workload whose output a log writer stamped is answered from its
// records: the write stamps, both streams and sequence numbers, cut by since and until, and
// followed without a repeat or a gap; once removed, its kept records still answer.
func TestLogsFromStampedRecords(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	id := "wl_stamped"
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := base
	var mu sync.Mutex
	w, err := logseg.OpenWriter(reconcile.LogDir(data, id), logseg.WriterOptions{SegmentBytes: 512, Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out, errs := w.Stream(logseg.Stdout), w.Stream(logseg.Stderr)
	for i := 1; i <= 20; i++ {
		s := out
		if i%5 == 0 {
			s = errs
		}
		fmt.Fprintf(s, "line %d\n", i)
	}
	c := &commands{dataDir: data, now: time.Now}
	since, until := base.Add(5*time.Second), base.Add(7*time.Second)
	params, _ := json.Marshal(node.LogsQuery{WorkloadID: id, Since: &since, Until: &until})
	res := c.Command(context.Background(), node.Command{Kind: node.CommandLogsQuery, Params: params})
	if res.Status != "ok" || len(res.Lines) != 3 {
		t.Fatalf("since/until answer: %+v", res)
	}
	if l := res.Lines[0]; l.Line != "line 5" || l.Stream != logseg.Stderr || l.Seq != 5 || l.Time == nil || !l.Time.Equal(since) {
		t.Fatalf("first line %+v", l)
	}

	var mu2 sync.Mutex
	var got []node.LogLine
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	open, _ := json.Marshal(node.LogsQuery{WorkloadID: id, Tail: 4})
	go func() {
		done <- c.Stream(ctx, node.StreamOpen{StreamID: "s1", Kind: node.StreamAppLogs, Params: open}, func(b []node.LogLine) error {
			mu2.Lock()
			got = append(got, b...)
			mu2.Unlock()
			return nil
		})
	}()
	for i := 21; i <= 60; i++ {
		fmt.Fprintf(out, "line %d\n", i)
	}
	proctest.WaitFor(t, 30*time.Second, "the followed lines", func() (bool, string) {
		mu2.Lock()
		defer mu2.Unlock()
		return len(got) > 0 && got[len(got)-1].Line == "line 60", fmt.Sprintf("%d lines", len(got))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The tail is the newest 4 when the stream opened (the writes race it),
	// then every record once, in order.
	first := got[0].Seq
	if first < 17 || len(got) != int(61-first) {
		t.Fatalf("followed %d lines from seq %d", len(got), first)
	}
	for i, l := range got {
		if n := first + int64(i); l.Line != fmt.Sprintf("line %d", n) || l.Seq != n {
			t.Fatalf("followed line %d: %+v, want seq %d", i, l, n)
		}
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reconcile.KeepPreviousLog(data, id, reconcile.LogPath(data, id)); err != nil {
		t.Fatal(err)
	}
	if err := removeAll(reconcile.LogDir(data, id)); err != nil {
		t.Fatal(err)
	}
	params, _ = json.Marshal(node.LogsQuery{WorkloadID: id, Tail: 2})
	res = c.Command(context.Background(), node.Command{Kind: node.CommandLogsQuery, Params: params})
	if res.Status != "ok" || len(res.Lines) != 2 || res.Lines[1].Line != "line 60" || res.Lines[1].Time == nil {
		t.Fatalf("kept records answer: %+v", res)
	}
}

func removeAll(dir string) error { return os.RemoveAll(dir) }

// TestLogsReportDiskLimitDrops: records the disk bound removed unshipped are said in the answer,
// never silently missing.
func TestLogsReportDiskLimitDrops(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	id := "wl_drops"
	w, err := logseg.OpenWriter(reconcile.LogDir(data, id), logseg.WriterOptions{SegmentBytes: 256, MaxDiskBytes: 600})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(w.Stream(logseg.Stdout), "line %d %s\n", i, strings.Repeat("q", 40))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c := &commands{dataDir: data, now: time.Now}
	params, _ := json.Marshal(node.LogsQuery{WorkloadID: id})
	res := c.Command(context.Background(), node.Command{Kind: node.CommandLogsQuery, Params: params})
	if res.Status != "ok" || len(res.Lines) == 0 || res.Lines[len(res.Lines)-1].Line != "line 100 "+strings.Repeat("q", 40) {
		t.Fatalf("answer %+v", res)
	}
	if !strings.Contains(res.Detail, "dropped on this node when its log disk limit was reached") || !strings.Contains(res.Detail, "sequence 1 to") {
		t.Fatalf("detail %q does not report the drop", res.Detail)
	}
	if res.Lines[0].Seq == 1 {
		t.Fatal("the oldest records were not dropped")
	}
}
