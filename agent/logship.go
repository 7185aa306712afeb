package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/internal/logseg"
)

// Shipping sealed log segments to berthd (docs/logs.md section 6).
const (
	// shipInterval is how often the shipper looks for sealed, unshipped segments.
	shipInterval = 2 * time.Second
	// shipAnswerTimeout bounds the wait for one log_segment_ack.
	shipAnswerTimeout = 30 * time.Second
	// registeredMark, in a log directory, records that berthd knows the log's owner.
	registeredMark = ".registered"
	// refusedMark, in a log directory, records that berthd refused the log for good (the
	// workload is not this node's); its segments are not offered again.
	refusedMark = ".refused"
	// dropsCountedFile, in a log directory, holds how many of its recorded drops were counted.
	dropsCountedFile = ".drops-counted"
)

// LogShipper uploads the sealed segments of every workload's log directory to berthd over the
// node session, at most once each: a segment is marked shipped (logseg.MarkShipped) only after
// berthd acknowledged it, so an agent restarted mid-upload offers it again and berthd answers
// have for a segment it holds. A removed workload's log directory waits in the pending
// directory until all of it is shipped.
type LogShipper struct {
	dataDir string
	ship    func(ctx context.Context, seg node.LogSegment) (node.LogSegmentAck, error)
	log     *slog.Logger
	shipped prometheus.Counter
	dropped prometheus.Counter
	wake    chan struct{}
}

// NewLogShipper returns a shipper of the log directories under dataDir through ship (the
// session's [session.Client.ShipLogSegment]); reg, when not nil, gets its counters.
func NewLogShipper(dataDir string, ship func(context.Context, node.LogSegment) (node.LogSegmentAck, error), log *slog.Logger, reg prometheus.Registerer) *LogShipper {
	s := &LogShipper{dataDir: dataDir, ship: ship, log: log, wake: make(chan struct{}, 1),
		shipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_log_bytes_shipped_total",
			Help: "Compressed bytes of log segments berthd acknowledged storing (segments it held already count nothing)."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_log_segments_dropped_total",
			Help: "Log segments removed on this node before they were shipped: the log disk limit forced it, or berthd refused the log."}),
	}
	if reg != nil {
		reg.MustRegister(s.shipped, s.dropped)
	}
	return s
}

// Run ships every shipInterval, and at once after [LogShipper.Wake], until ctx ends.
func (s *LogShipper) Run(ctx context.Context) {
	t := time.NewTicker(shipInterval)
	defer t.Stop()
	for {
		s.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

// Wake asks for a pass now, without blocking: the agent calls it when a workload's status
// changes, so a new workload's log is registered with berthd while its record exists (a short
// job run's record is removed soon after it ends, docs/node-protocol.md section 5.24).
func (s *LogShipper) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// logDir is one log directory the shipper serves.
type logDir struct {
	id      string
	dir     string
	pending bool // a removed workload's, under the pending directory
}

// dirs lists the log directories: of present workloads, then those waiting after removal.
func (s *LogShipper) dirs() []logDir {
	var out []logDir
	ents, _ := os.ReadDir(filepath.Join(s.dataDir, "workloads"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "wl_") {
			if d := reconcile.LogDir(s.dataDir, e.Name()); isDir(d) {
				out = append(out, logDir{id: e.Name(), dir: d})
			}
		}
	}
	ents, _ = os.ReadDir(reconcile.PendingLogsDir(s.dataDir))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "wl_") && e.IsDir() {
			out = append(out, logDir{id: e.Name(), dir: filepath.Join(reconcile.PendingLogsDir(s.dataDir), e.Name()), pending: true})
		}
	}
	return out
}

// Pass ships what is sealed and unshipped in every log directory once, and counts new drops.
// It stops early when the session is away or ctx ends; the next pass goes on.
func (s *LogShipper) Pass(ctx context.Context) {
	s.prunePending()
	for _, d := range s.dirs() {
		if ctx.Err() != nil {
			return
		}
		s.countDrops(d.dir)
		if d.pending {
			sealLeftover(d.dir)
		}
		done, err := s.shipDir(ctx, d)
		if err != nil {
			s.log.Debug("log shipping paused", "workload_id", d.id, "error", err)
			return
		}
		if d.pending && done && !hasOpenRecords(d.dir) {
			if err := os.RemoveAll(d.dir); err != nil {
				s.log.Warn("remove a shipped log directory", "workload_id", d.id, "error", err)
			}
		}
	}
}

// sealLeftover seals the records a removed workload's log writer left in the open segment of
// dir (a writer killed before it sealed at the end of the output), so they are shipped too; a
// writer still alive holds the directory and is left to finish.
func sealLeftover(dir string) {
	fi, err := os.Stat(filepath.Join(dir, logseg.CurrentFile))
	if err != nil || fi.Size() == 0 {
		return
	}
	w, err := logseg.OpenWriter(dir, logseg.WriterOptions{MaxDiskBytes: -1})
	if err != nil {
		return // held by a live writer, or unreadable: the next pass tries again
	}
	_ = w.Close() // seals what recovery found
}

// shipDir ships the unshipped sealed segments of d in sequence order and reports whether none
// is left unshipped. An error means the session is away: stop for now.
func (s *LogShipper) shipDir(ctx context.Context, d logDir) (bool, error) {
	if isFile(filepath.Join(d.dir, refusedMark)) {
		return true, nil
	}
	segs, err := logseg.Segments(d.dir)
	if err != nil {
		return false, nil
	}
	if !isFile(filepath.Join(d.dir, registeredMark)) {
		ok, err := s.send(ctx, d, node.LogSegment{Segment: node.LogSegmentInfo{WorkloadID: d.id}})
		if err != nil || !ok {
			return !ok && isFile(filepath.Join(d.dir, refusedMark)), err
		}
		if f, err := os.Create(filepath.Join(d.dir, registeredMark)); err == nil {
			_ = f.Close()
		}
	}
	for _, seg := range segs {
		if logseg.Shipped(d.dir, seg.Name) {
			continue
		}
		ok, err := s.shipSegment(ctx, d, seg)
		if err != nil {
			return false, err
		}
		if !ok {
			return isFile(filepath.Join(d.dir, refusedMark)), nil
		}
	}
	return true, nil
}

// shipSegment uploads one sealed segment piece by piece and marks it shipped once berthd
// acknowledged it; it reports whether it did.
func (s *LogShipper) shipSegment(ctx context.Context, d logDir, seg logseg.Segment) (bool, error) {
	raw, err := os.ReadFile(filepath.Join(d.dir, seg.Name))
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil // pruned meanwhile: counted as a drop when it was one
	}
	if err != nil {
		s.log.Warn("read a log segment to ship it", "workload_id", d.id, "segment", seg.Name, "error", err)
		return false, nil
	}
	info := node.LogSegmentInfo{WorkloadID: d.id, Name: seg.Name, FirstSeq: seg.FirstSeq, LastSeq: seg.LastSeq,
		FirstTime: seg.FirstTime, LastTime: seg.LastTime, Records: seg.Records, RawBytes: seg.RawBytes,
		Bytes: int64(len(raw)), SHA256: seg.SHA256}
	if seg.Bytes != int64(len(raw)) {
		return false, nil // the index does not describe the file: the writer re-indexes it
	}
	var off int64
	for {
		end := min(off+node.LogSegmentChunkBytes, int64(len(raw)))
		m := node.LogSegment{Segment: info, Offset: off, Data: raw[off:end], Last: end == int64(len(raw))}
		actx, cancel := context.WithTimeout(ctx, shipAnswerTimeout)
		ack, err := s.ship(actx, m)
		cancel()
		if err != nil {
			return false, fmt.Errorf("ship %s: %w", seg.Name, err)
		}
		switch {
		case ack.Stored:
			if err := logseg.MarkShipped(d.dir, seg.Name); err != nil {
				s.log.Warn("mark a log segment shipped", "workload_id", d.id, "segment", seg.Name, "error", err)
				return false, nil
			}
			if !ack.Have {
				s.shipped.Add(float64(len(raw)))
			}
			return true, nil
		case ack.Code != "":
			s.refused(d, ack)
			return false, nil
		case ack.NextOffset != end:
			return false, nil // out of step: start over on the next pass
		}
		off = end
	}
}

// send sends a piece without data (a registration) and reports whether berthd took it.
func (s *LogShipper) send(ctx context.Context, d logDir, m node.LogSegment) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, shipAnswerTimeout)
	defer cancel()
	ack, err := s.ship(actx, m)
	if err != nil {
		return false, err
	}
	if ack.Code != "" {
		s.refused(d, ack)
		return false, nil
	}
	return ack.Stored, nil
}

// refused handles a refusal: not_found (the workload is not this node's, or its record is gone
// before its log was ever registered) is final and the log is given up, counted as dropped;
// anything else is retried on a later pass.
func (s *LogShipper) refused(d logDir, ack node.LogSegmentAck) {
	if ack.Code != "not_found" {
		s.log.Info("berthd refused a log segment for now", "workload_id", d.id, "code", ack.Code, "message", ack.Message)
		return
	}
	s.log.Warn("berthd refused this workload's log; it is kept on this node only", "workload_id", d.id, "message", ack.Message)
	segs, _ := logseg.Segments(d.dir)
	n := 0
	for _, seg := range segs {
		if !logseg.Shipped(d.dir, seg.Name) {
			n++
		}
	}
	s.dropped.Add(float64(n))
	if f, err := os.Create(filepath.Join(d.dir, refusedMark)); err == nil {
		_ = f.Close()
	}
}

// countDrops adds the drops dir recorded since the last count to the dropped counter.
func (s *LogShipper) countDrops(dir string) {
	drops, err := logseg.Drops(dir)
	if err != nil || len(drops) == 0 {
		return
	}
	p := filepath.Join(dir, dropsCountedFile)
	raw, _ := os.ReadFile(p)
	counted, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	if len(drops) <= counted {
		return
	}
	s.dropped.Add(float64(len(drops) - counted))
	_ = os.WriteFile(p, []byte(strconv.Itoa(len(drops))), 0o640)
}

// pendingLimit bounds the removed workloads' log directories waiting to be shipped; beyond it
// the oldest is removed and its unshipped segments counted as dropped.
const pendingLimit = 256

// prunePending keeps at most pendingLimit pending log directories, removing the oldest.
func (s *LogShipper) prunePending() {
	ents, err := os.ReadDir(reconcile.PendingLogsDir(s.dataDir))
	if err != nil || len(ents) <= pendingLimit {
		return
	}
	type aged struct {
		name string
		mod  time.Time
	}
	var all []aged
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			all = append(all, aged{e.Name(), fi.ModTime()})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return a.mod.Compare(b.mod) })
	for _, a := range all[:max(0, len(all)-pendingLimit)] {
		dir := filepath.Join(reconcile.PendingLogsDir(s.dataDir), a.name)
		segs, _ := logseg.Segments(dir)
		n := 0
		for _, seg := range segs {
			if !logseg.Shipped(dir, seg.Name) {
				n++
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("prune pending logs", "error", err)
			return
		}
		s.dropped.Add(float64(n))
		s.log.Warn("a removed workload's unshipped log was dropped: too many wait to be shipped", "workload_id", a.name, "segments", n)
	}
}

// hasOpenRecords reports whether dir's open segment holds records not sealed yet.
func hasOpenRecords(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, logseg.CurrentFile))
	return err == nil && fi.Size() > 0
}
