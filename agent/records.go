package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/internal/logseg"
)

// recordFollowInterval is how often a followed app_logs stream looks for new records.
const recordFollowInterval = 100 * time.Millisecond

// recordSource is where the stamped records of one workload are: its log
// directory while the workload exists, or the records kept of it once removed.
type recordSource struct {
	dir  string // the log directory; "" when only kept records remain
	kept string // the kept records file of a removed workload
}

// recordsOf finds the stamped records of workload id (docs/logs.md): those a
// log writer keeps in its log directory, or those kept of a removed workload.
// It reports false when the workload's output has no records (a driver
// without a log writer), so callers fall back to the driver's Logs.
func (c *commands) recordsOf(id string) (recordSource, bool) {
	if c.dataDir == "" || !strings.HasPrefix(id, "wl_") || strings.ContainsAny(id, "/\\.") {
		return recordSource{}, false
	}
	if dir := reconcile.LogDir(c.dataDir, id); isDir(dir) {
		return recordSource{dir: dir}, true
	}
	if p := reconcile.PreviousRecordsPath(c.dataDir, id); isFile(p) {
		return recordSource{kept: p}, true
	}
	return recordSource{}, false
}

func isDir(p string) bool  { fi, err := os.Stat(p); return err == nil && fi.IsDir() }
func isFile(p string) bool { fi, err := os.Stat(p); return err == nil && fi.Mode().IsRegular() }

// read calls fn with the records of src from sequence from on.
func (src recordSource) read(from int64, fn func(logseg.Record) error) (int64, error) {
	if src.dir != "" {
		return logseg.ReadFrom(src.dir, from, fn)
	}
	raw, err := os.ReadFile(src.kept)
	if err != nil {
		return from, err
	}
	next := from
	for _, line := range strings.Split(string(raw), "\n") {
		r, err := logseg.Parse([]byte(line))
		if err != nil || r.Seq < next {
			continue
		}
		if err := fn(r); err != nil {
			return next, err
		}
		next = r.Seq + 1
	}
	return next, nil
}

func recordLine(id string, r logseg.Record) node.LogLine {
	t := r.Time
	return node.LogLine{Time: &t, Stream: r.Stream, Line: string(r.Text), WorkloadID: id, Seq: r.Seq, Partial: r.Partial}
}

// queryRecords answers logs_query from stamped records: those within
// q.Since and q.Until, the newest q.Tail of them when set, and the newest
// that fit answerBudget; dropped reports that older ones were left out.
func queryRecords(src recordSource, q node.LogsQuery) ([]node.LogLine, bool, error) {
	var lines []node.LogLine
	size, dropped := 0, false
	from := src.startFor(q.Since)
	dropped = from > 1 && q.Since == nil
	_, err := src.read(from, func(r logseg.Record) error {
		if (q.Since != nil && r.Time.Before(*q.Since)) || (q.Until != nil && r.Time.After(*q.Until)) {
			return nil
		}
		lines = append(lines, recordLine(q.WorkloadID, r))
		size += len(r.Text) + 128 // the JSON around a line
		for size > answerBudget || (q.Tail > 0 && len(lines) > q.Tail) {
			size -= len(lines[0].Line) + 128
			lines, dropped = lines[1:], true
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("read logs of %s: %w", q.WorkloadID, err)
	}
	if lines == nil {
		lines = []node.LogLine{}
	}
	return lines, dropped, nil
}

// errAnswerFull stops a read once an answer holds all it can carry.
var errAnswerFull = errors.New("answer full")

// afterRecords answers a logs_query with after_seq: the records after q.AfterSeq within
// q.Since and q.Until, oldest first, as many as fit answerBudget; more reports that further
// records were left for the next query (docs/logs.md section 7).
func afterRecords(src recordSource, q node.LogsQuery) ([]node.LogLine, bool, error) {
	lines := []node.LogLine{}
	size, more := 0, false
	_, err := src.read(q.AfterSeq+1, func(r logseg.Record) error {
		if size+len(r.Text)+128 > answerBudget {
			more = true
			return errAnswerFull
		}
		if (q.Since != nil && r.Time.Before(*q.Since)) || (q.Until != nil && r.Time.After(*q.Until)) {
			return nil
		}
		lines = append(lines, recordLine(q.WorkloadID, r))
		size += len(r.Text) + 128
		return nil
	})
	if err != nil && !errors.Is(err, errAnswerFull) {
		return nil, false, fmt.Errorf("read logs of %s: %w", q.WorkloadID, err)
	}
	return lines, more, nil
}

// startFor is the sequence a query for records since since (nil: the newest
// that fit one answer) can start reading at, so a long log is not read
// whole: the first sealed segment that ends at or after since, or the
// newest segments that hold twice an answer's bytes.
func (src recordSource) startFor(since *time.Time) int64 {
	if src.dir == "" {
		return 1
	}
	segs, err := logseg.Segments(src.dir)
	if err != nil || len(segs) == 0 {
		return 1
	}
	if since != nil {
		for _, s := range segs {
			if !s.LastTime.Before(*since) {
				return s.FirstSeq
			}
		}
		return segs[len(segs)-1].LastSeq + 1
	}
	var raw int64
	for i := len(segs) - 1; i >= 0; i-- {
		raw += segs[i].RawBytes
		if raw >= 2*answerBudget {
			return segs[i].FirstSeq
		}
	}
	return 1
}

// followRecords serves app_logs from stamped records: the newest tail
// records, then every new record in sequence order, in batches, until ctx
// ends. No record is sent twice and none is skipped.
func followRecords(ctx context.Context, src recordSource, id string, tail int, send func([]node.LogLine) error) error {
	first, _, err := queryRecords(src, node.LogsQuery{WorkloadID: id, Tail: tail})
	if err != nil {
		return err
	}
	next := int64(1)
	if n := len(first); n > 0 {
		next = first[n-1].Seq + 1
		for len(first) > 0 {
			k := min(len(first), 500)
			if err := send(first[:k]); err != nil {
				return err
			}
			first = first[k:]
		}
	}
	return followRecordsFrom(ctx, src, id, next, send)
}

// followRecordsFrom sends every record from sequence next on, in sequence order and in
// batches, until ctx ends; the core follows this way after the records it holds shipped
// (logs_query's after_seq, docs/logs.md section 7).
func followRecordsFrom(ctx context.Context, src recordSource, id string, next int64, send func([]node.LogLine) error) error {
	t := time.NewTicker(recordFollowInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var batch []node.LogLine
		size := 0
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			err := send(batch)
			batch, size = nil, 0
			return err
		}
		n, err := src.read(next, func(r logseg.Record) error {
			batch = append(batch, recordLine(id, r))
			size += len(r.Text) + 128
			if len(batch) >= 500 || size >= answerBudget/2 {
				return flush()
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := flush(); err != nil {
			return err
		}
		next = n
	}
}

// dropped says which records the log directory's disk bound removed before
// they were shipped (docs/logs.md section 3.3), or "" when none were.
func (src recordSource) dropped() string {
	if src.dir == "" {
		return ""
	}
	drops, err := logseg.Drops(src.dir)
	if err != nil || len(drops) == 0 {
		return ""
	}
	var records int64
	for _, d := range drops {
		records += d.LastSeq - d.FirstSeq + 1
	}
	return fmt.Sprintf("%d segments (%d records, sequence %d to %d) were dropped on this node when its log disk limit was reached",
		len(drops), records, drops[0].FirstSeq, drops[len(drops)-1].LastSeq)
}
