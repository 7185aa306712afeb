package logs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/logseg"
)

const wl = "wl_01TESTLOGSHIP0000000000000"

// writeLines writes n numbered lines from line first on through a real log writer into dir,
// sealing a segment every per lines; the rest stays in the open segment, whose writer is
// closed (sealing it) at the test's end.
func writeLines(t *testing.T, dir string, first, n, per int, now func() time.Time) {
	t.Helper()
	w, err := logseg.OpenWriter(dir, logseg.WriterOptions{SegmentBytes: 1 << 30, MaxDiskBytes: -1, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	out := w.Stream(logseg.Stdout)
	for i := first; i < first+n; i++ {
		if _, err := fmt.Fprintf(out, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
		if (i-first+1)%per == 0 {
			if err := w.Seal(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if (n % per) == 0 {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Cleanup(func() { _ = w.Close() })
}

// dirLive answers the live tail from a log directory the way the agent does (logs_query with
// after_seq reads the directory from the sequence after).
type dirLive struct{ dir string }

func (d dirLive) After(_ context.Context, _, id string, after int64, _, _ *time.Time) ([]node.LogLine, bool, error) {
	var out []node.LogLine
	_, err := logseg.ReadFrom(d.dir, after+1, func(r logseg.Record) error {
		t := r.Time
		out = append(out, node.LogLine{Time: &t, Stream: r.Stream, Line: string(r.Text), WorkloadID: id, Seq: r.Seq})
		return nil
	})
	return out, false, err
}

type goneLive struct{}

func (goneLive) After(context.Context, string, string, int64, *time.Time, *time.Time) ([]node.LogLine, bool, error) {
	return nil, false, fmt.Errorf("%w: node gone", logs.ErrLiveUnavailable)
}

func newIndex(t *testing.T, now func() time.Time, ret logs.Retention, limit int) (*logs.Index, blobs.Store) {
	t.Helper()
	bs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	x, err := logs.New(context.Background(), logs.Config{Store: storetest.Open(t), Blobs: bs, Now: now, SweepLimit: limit,
		Retention: func(string) logs.Retention { return ret }})
	if err != nil {
		t.Fatal(err)
	}
	return x, bs
}

// ship puts every sealed segment of dir the way the session does: have, else put.
func ship(t *testing.T, x *logs.Index, dir string) (stored int) {
	t.Helper()
	ctx := context.Background()
	segs, err := logseg.Segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range segs {
		info := node.LogSegmentInfo{WorkloadID: wl, Name: s.Name, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, FirstTime: s.FirstTime,
			LastTime: s.LastTime, Records: s.Records, RawBytes: s.RawBytes, Bytes: s.Bytes, SHA256: s.SHA256}
		have, err := x.Have(ctx, logs.Owner{ProjectID: "prj_1", NodeID: "nod_1"}, info)
		if err != nil {
			t.Fatal(err)
		}
		if have {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, s.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Put(ctx, logs.Owner{ProjectID: "prj_1", NodeID: "nod_1"}, info, raw); err != nil {
			t.Fatal(err)
		}
		stored++
	}
	return stored
}

func countBlobs(t *testing.T, bs blobs.Store) int {
	t.Helper()
	n := 0
	if err := bs.List(context.Background(), "logs/", func(blobs.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkLines asserts lines are exactly "line from" .. "line to", once each, in order.
func checkLines(t *testing.T, lines []node.LogLine, from, to int) {
	t.Helper()
	if len(lines) != to-from+1 {
		t.Fatalf("got %d lines, want %d (%d to %d)", len(lines), to-from+1, from, to)
	}
	for i, l := range lines {
		if want := fmt.Sprintf("line %d", from+i); l.Line != want {
			t.Fatalf("line %d is %q, want %q", i, l.Line, want)
		}
	}
}

func TestShippedAndLiveMergeOnceInOrder(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeLines(t, dir, 1, 1000, 300, time.Now) // 3 sealed segments (1-900), 100 lines open
	x, bs := newIndex(t, time.Now, logs.Retention{}, 0)
	if n := ship(t, x, dir); n != 3 {
		t.Fatalf("stored %d segments, want 3", n)
	}
	// A second upload of the same segments is answered have and stores nothing twice.
	if n := ship(t, x, dir); n != 0 {
		t.Fatalf("a second upload stored %d segments", n)
	}
	if err := x.Put(ctx, logs.Owner{ProjectID: "prj_1"}, segInfo(t, dir, 0), segBytes(t, dir, 0)); err != nil {
		t.Fatalf("a duplicate put: %v", err)
	}
	if n := countBlobs(t, bs); n != 3 {
		t.Fatalf("%d blobs after duplicate uploads, want 3", n)
	}
	w, err := x.Workload(ctx, wl)
	if err != nil || len(w.Segments) != 3 {
		t.Fatalf("workload log: %+v, %v", w, err)
	}

	res, err := x.Read(ctx, logs.Query{WorkloadID: wl}, dirLive{dir})
	if err != nil {
		t.Fatal(err)
	}
	checkLines(t, res.Lines, 1, 1000)
	if res.NextSeq != 1001 || res.LiveUnavailable != "" {
		t.Fatalf("next %d, live unavailable %q", res.NextSeq, res.LiveUnavailable)
	}

	// The node gone: the shipped segments alone, and the read says so.
	res, err = x.Read(ctx, logs.Query{WorkloadID: wl}, goneLive{})
	if err != nil {
		t.Fatal(err)
	}
	checkLines(t, res.Lines, 1, 900)
	if !strings.Contains(res.LiveUnavailable, "node gone") {
		t.Fatalf("live unavailable %q", res.LiveUnavailable)
	}

	// A small answer reads only the newest segments and says older lines were left out.
	res, err = x.Read(ctx, logs.Query{WorkloadID: wl, MaxBytes: 100}, goneLive{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Lines); !res.Truncated || n == 0 || res.Lines[n-1].Line != "line 900" || res.Shipped != 1 {
		t.Fatalf("a bounded read: truncated %v, %d segments read, %d lines", res.Truncated, res.Shipped, n)
	}

	// grep and tail.
	res, err = x.Read(ctx, logs.Query{WorkloadID: wl, Grep: regexp.MustCompile(`^line 9\d\d$`), Tail: 5}, dirLive{dir})
	if err != nil {
		t.Fatal(err)
	}
	checkLines(t, res.Lines, 995, 999)
}

func segInfo(t *testing.T, dir string, i int) node.LogSegmentInfo {
	t.Helper()
	segs, err := logseg.Segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := segs[i]
	return node.LogSegmentInfo{WorkloadID: wl, Name: s.Name, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, FirstTime: s.FirstTime,
		LastTime: s.LastTime, Records: s.Records, RawBytes: s.RawBytes, Bytes: s.Bytes, SHA256: s.SHA256}
}

func segBytes(t *testing.T, dir string, i int) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, segInfo(t, dir, i).Name))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestPutRefusesBytesThatDoNotMatch(t *testing.T) {
	dir := t.TempDir()
	writeLines(t, dir, 1, 10, 10, time.Now)
	x, bs := newIndex(t, time.Now, logs.Retention{}, 0)
	raw := segBytes(t, dir, 0)
	raw[len(raw)-1] ^= 0xff
	err := x.Put(context.Background(), logs.Owner{ProjectID: "prj_1"}, segInfo(t, dir, 0), raw)
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("put of altered bytes: %v", err)
	}
	if n := countBlobs(t, bs); n != 0 {
		t.Fatalf("%d blobs stored from altered bytes", n)
	}
}

func TestRetentionRemovesOldSegmentsBoundedPerPass(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// 4 segments written a day apart each: 100 lines each.
	for d := range 4 {
		day := clock.Add(time.Duration(d) * 24 * time.Hour)
		writeLines(t, dir, d*100+1, 100, 100, func() time.Time { return day })
	}
	x, bs := newIndex(t, func() time.Time { return clock.Add(4 * 24 * time.Hour) }, logs.Retention{MaxAge: 36 * time.Hour}, 1)
	if n := ship(t, x, dir); n != 4 {
		t.Fatalf("stored %d segments, want 4", n)
	}
	// Segments of days 0, 1 and 2 are older than 36 hours at day 4: three passes of one each.
	for pass, want := range []int{1, 1, 1, 0} {
		n, err := x.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("pass %d deleted %d, want %d", pass, n, want)
		}
	}
	if n := countBlobs(t, bs); n != 1 {
		t.Fatalf("%d blobs left, want 1", n)
	}
	res, err := x.Read(ctx, logs.Query{WorkloadID: wl}, goneLive{})
	if err != nil {
		t.Fatal(err)
	}
	checkLines(t, res.Lines, 301, 400)

	// A size cap removes the oldest beyond it; the last segment gone takes the workload's record.
	x2, bs2 := newIndex(t, time.Now, logs.Retention{MaxBytes: 1}, 0)
	ship(t, x2, dir)
	if n, err := x2.Sweep(ctx); err != nil || n != 4 {
		t.Fatalf("size sweep: %d, %v", n, err)
	}
	if n := countBlobs(t, bs2); n != 0 {
		t.Fatalf("%d blobs left after the size sweep", n)
	}
	if _, err := x2.Workload(ctx, wl); err == nil {
		t.Fatal("the workload's log record outlived its last segment")
	}
}
