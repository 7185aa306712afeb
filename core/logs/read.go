package logs

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/logseg"
)

// Live reads the part of a workload's log its node has not shipped yet (logs_query with
// after_seq, docs/node-protocol.md section 5.17).
type Live interface {
	// After returns the node's records of workloadID after sequence after within since and
	// until, oldest first, as many as one answer holds, and whether more follow. after 0 asks
	// for the newest lines that fit one answer (records without sequence numbers included).
	// Errors: [ErrLiveUnavailable] (wrapped) when the node cannot be asked.
	After(ctx context.Context, nodeID, workloadID string, after int64, since, until *time.Time) ([]node.LogLine, bool, error)
}

// ErrLiveUnavailable is returned (wrapped) by a [Live] whose node has no live session or is gone.
var ErrLiveUnavailable = errors.New("berth: the live tail is unavailable")

// Limits of one merged read.
const (
	// DefaultReadBytes bounds the text of one answer; the oldest lines beyond it are left out.
	DefaultReadBytes = 4 << 20
	// liveAsks bounds the logs_query round trips of one read.
	liveAsks = 32
)

// Query selects what [Index.Read] returns. WorkloadID is required.
type Query struct {
	WorkloadID string
	// NodeID is the node that runs or ran the workload; empty means the one its shipped log names.
	NodeID string
	// Since and Until bound the lines by their write time; nil means unbounded.
	Since, Until *time.Time
	// Grep keeps only lines whose text it matches; nil keeps all.
	Grep *regexp.Regexp
	// Tail keeps the newest Tail lines; zero keeps as many as MaxBytes allows.
	Tail int
	// MaxBytes bounds the lines' text; zero means DefaultReadBytes.
	MaxBytes int
}

// Result is a merged read: shipped lines, then the live tail, in sequence order, each once.
type Result struct {
	NodeID string
	Lines  []node.LogLine
	// NextSeq is one past the newest sequence read (0 when no line had one): a follower asks
	// its node for the records after NextSeq-1.
	NextSeq int64
	// Shipped is how many shipped segments were read.
	Shipped int
	// LiveUnavailable says why the node's live tail could not be read ("" when it was).
	LiveUnavailable string
	// Truncated reports that older lines were left out for Tail or MaxBytes.
	Truncated bool
}

// Read merges workload q.WorkloadID's shipped segments with its node's live tail (live may be
// nil: shipped only) by sequence number: every record once, in order, shipped ones first; the
// node is asked only for what comes after the newest shipped sequence. Sequences removed by
// retention or by the node's disk bound are absent. Errors: [ErrNotFound] when there is no
// shipped log and no node to ask; the store's and the blob store's.
func (x *Index) Read(ctx context.Context, q Query, live Live) (*Result, error) {
	if q.MaxBytes <= 0 {
		q.MaxBytes = DefaultReadBytes
	}
	res := &Result{NodeID: q.NodeID}
	w, err := x.Workload(ctx, q.WorkloadID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if w == nil && q.NodeID == "" {
		return nil, err
	}
	if res.NodeID == "" {
		res.NodeID = w.NodeID
	}
	out := lineRing{max: q.MaxBytes, tail: q.Tail}
	keep := func(l node.LogLine) {
		if q.Grep == nil || q.Grep.MatchString(l.Line) {
			out.add(l)
		}
	}
	var shippedTo int64
	if w != nil {
		first := x.firstToRead(w.Segments, q)
		if first > 0 {
			out.truncated = true // older segments were not read
		}
		for i, ref := range w.Segments {
			shippedTo = max(shippedTo, ref.LastSeq)
			if i < first || (q.Since != nil && ref.LastTime.Before(*q.Since)) || (q.Until != nil && ref.FirstTime.After(*q.Until)) {
				continue
			}
			res.Shipped++
			err := x.ReadSegment(ctx, ref, func(r logseg.Record) error {
				if (q.Since != nil && r.Time.Before(*q.Since)) || (q.Until != nil && r.Time.After(*q.Until)) {
					return nil
				}
				t := r.Time
				keep(node.LogLine{Time: &t, Stream: r.Stream, Line: string(r.Text), WorkloadID: q.WorkloadID, Seq: r.Seq, Partial: r.Partial})
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("logs: read shipped log of %s: %w", q.WorkloadID, err)
			}
		}
	}
	next := shippedTo
	switch {
	case live == nil || res.NodeID == "":
		res.LiveUnavailable = "no node to ask"
	default:
		after := shippedTo
		for range liveAsks {
			lines, more, err := live.After(ctx, res.NodeID, q.WorkloadID, after, q.Since, q.Until)
			if err != nil {
				if !errors.Is(err, ErrLiveUnavailable) && !errors.Is(err, context.Canceled) && w == nil {
					return nil, err
				}
				res.LiveUnavailable = err.Error()
				break
			}
			for _, l := range lines {
				if l.Seq > 0 && l.Seq <= after {
					continue // a node that does not know after_seq answers its newest lines
				}
				keep(l)
				next = max(next, l.Seq)
			}
			if !more || after == next || next == 0 {
				break
			}
			after = next
		}
	}
	res.Lines, res.Truncated = out.lines(), out.truncated
	if next > 0 {
		res.NextSeq = next + 1
	}
	return res, nil
}

// scanFactor bounds the shipped bytes a read without since goes through: the newest segments
// holding scanFactor times the answer's bound (grepScanFactor with grep, which may keep few
// lines of many).
const (
	scanFactor     = 2
	grepScanFactor = 64
)

// firstToRead is the index of the oldest segment a read needs. With since it is the first
// (segments before since are skipped by time); without, only the newest segments whose raw
// bytes reach the scan bound can contribute to an answer that keeps the newest lines, so a
// week of log is not read to answer its last lines.
func (x *Index) firstToRead(segs []SegmentRef, q Query) int {
	if q.Since != nil {
		return 0
	}
	limit := int64(q.MaxBytes) * scanFactor
	if q.Grep != nil {
		limit = int64(q.MaxBytes) * grepScanFactor
	}
	var raw int64
	for i := len(segs) - 1; i >= 0; i-- {
		if q.Until != nil && segs[i].FirstTime.After(*q.Until) {
			continue // read for nothing: after until
		}
		raw += max(segs[i].RawBytes, segs[i].Bytes)
		if raw >= limit {
			return i
		}
	}
	return 0
}

// lineRing keeps the newest lines within a byte bound and a count.
type lineRing struct {
	max, tail int
	size      int
	buf       []node.LogLine
	truncated bool
}

func (r *lineRing) add(l node.LogLine) {
	r.buf = append(r.buf, l)
	r.size += len(l.Line)
	for len(r.buf) > 1 && (r.size > r.max || (r.tail > 0 && len(r.buf) > r.tail)) {
		r.size -= len(r.buf[0].Line)
		r.buf[0] = node.LogLine{}
		r.buf, r.truncated = r.buf[1:], true
	}
}

func (r *lineRing) lines() []node.LogLine {
	if r.buf == nil {
		return []node.LogLine{}
	}
	return r.buf
}
