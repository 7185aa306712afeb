package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/internal/logseg"
)

// coreLogs stands for berthd's side of log_segment (core/session with core/logs, tested for
// real in core/session and e2e TestLogsOutliveTheNode): it gathers pieces in order and answers
// have for a segment it holds.
type coreLogs struct {
	registered map[string]bool
	stored     map[string][]byte // sha256 -> bytes
	upload     []byte
}

func (c *coreLogs) ship(_ context.Context, m node.LogSegment) (node.LogSegmentAck, error) {
	if m.Segment.SHA256 == "" {
		c.registered[m.Segment.WorkloadID] = true
		return node.LogSegmentAck{Stored: true}, nil
	}
	if m.Offset == 0 {
		if _, ok := c.stored[m.Segment.SHA256]; ok {
			return node.LogSegmentAck{Stored: true, Have: true}, nil
		}
		c.upload = nil
	}
	c.upload = append(c.upload, m.Data...)
	if !m.Last {
		return node.LogSegmentAck{NextOffset: int64(len(c.upload))}, nil
	}
	c.stored[m.Segment.SHA256] = c.upload
	return node.LogSegmentAck{Stored: true}, nil
}

// TestRemovedWorkloadsLogIsShippedThenDeleted: a removed workload's log directory with a sealed
// segment and records its killed writer left unsealed is kept for shipping; the shipper seals
// the leftover, ships both segments and deletes the directory once everything in it is stored.
func TestRemovedWorkloadsLogIsShippedThenDeleted(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	id := "wl_01TESTSHIP000000000000000"
	dir := reconcile.LogDir(data, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := logseg.OpenWriter(dir, logseg.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		_, _ = w.Stream(logseg.Stdout).Write([]byte("early line\n"))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Records a writer killed with SIGKILL left in the open segment.
	var left []byte
	for seq := int64(101); seq <= 110; seq++ {
		left = logseg.AppendRecord(left, logseg.Record{Time: time.Now(), Stream: logseg.Stdout, Seq: seq, Text: []byte("late line")})
	}
	if err := os.WriteFile(filepath.Join(dir, logseg.CurrentFile), left, 0o640); err != nil {
		t.Fatal(err)
	}

	if err := reconcile.KeepForShipping(data, id); err != nil {
		t.Fatal(err)
	}
	pending := filepath.Join(reconcile.PendingLogsDir(data), id)
	if isDir(dir) || !isDir(pending) {
		t.Fatalf("log directory not moved: %s %v, %s %v", dir, isDir(dir), pending, isDir(pending))
	}
	core := &coreLogs{registered: map[string]bool{}, stored: map[string][]byte{}}
	s := NewLogShipper(data, core.ship, slog.New(slog.DiscardHandler), nil)
	s.Pass(context.Background())
	if isDir(pending) {
		t.Fatal("the pending log directory outlived shipping")
	}
	if !core.registered[id] || len(core.stored) != 2 {
		t.Fatalf("registered %v, %d segments stored", core.registered, len(core.stored))
	}
	var seqs []int64
	for _, raw := range core.stored {
		if err := logseg.ReadSegment(bytes.NewReader(raw), func(r logseg.Record) error { seqs = append(seqs, r.Seq); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(seqs) != 110 {
		t.Fatalf("%d records stored, want 110", len(seqs))
	}
	if got := testutil.ToFloat64(s.shipped); got <= 0 {
		t.Fatalf("shipped bytes counted %v", got)
	}
}
