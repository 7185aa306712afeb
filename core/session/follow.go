package session

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// ChangeLog is what a session needs of the cluster's change log to let a node
// follow it (docs/node-protocol.md section 7.4). *changelog.Log satisfies it.
type ChangeLog interface {
	// HashAt returns the hash of entry seq and whether it exists.
	HashAt(ctx context.Context, seq int64) (string, bool, error)
	// Range returns up to limit consecutive entries from fromSeq.
	Range(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, error)
	// Changed returns a channel closed after the next append.
	Changed() <-chan struct{}
}

// DefaultLogFollowDelay is [Config.LogFollowDelay]'s default: with 1,000 sessions and a burst
// of appends (enrollments, policy decisions), a follower at the head takes at most one batch a
// second instead of one per append, and an entry reaches every node within about a second.
const DefaultLogFollowDelay = time.Second

// follow is one session's change-log follower state. At most one
// log_entries batch is in flight: the next is sent once the node acknowledged
// the previous one (section 7.4).
type follow struct {
	mu    sync.Mutex
	acked int64  // newest seq the node acknowledged (or held at hello)
	hash  string // its hash
	sent  int64  // newest seq sent; > acked while a batch is in flight
	kick  chan struct{}
}

// checkHello compares hello's log position with the core's log and returns
// whether the node's copy diverged: its log_seq is beyond the core's head or
// its log_hash differs from the core's entry at that seq.
func checkHello(ctx context.Context, cl ChangeLog, h *node.Hello) (bool, error) {
	if h.LogSeq <= 0 {
		return false, nil
	}
	want, ok, err := cl.HashAt(ctx, h.LogSeq)
	if err != nil {
		return false, fmt.Errorf("read change-log entry %d: %w", h.LogSeq, err)
	}
	return !ok || want != h.LogHash, nil
}

// startFollow begins delivering the change log to c from the node's position
// in hello; on divergence it first answers log_diverged (non-fatal) and
// delivers from seq 1. It runs until ctx ends.
func (s *Server) startFollow(ctx context.Context, c *conn, hello *node.Hello, helloID string) error {
	cl := s.cfg.Changelog
	if cl == nil {
		return nil
	}
	diverged, err := checkHello(ctx, cl, hello)
	if err != nil {
		return err
	}
	f := &follow{kick: make(chan struct{}, 1)}
	if diverged {
		s.log.Warn("node's change-log copy diverged; it refollows from seq 1", "node_id", c.nodeID, "log_seq", hello.LogSeq)
		s.sendError(ctx, c, helloID, abierrors.LogDiverged,
			fmt.Sprintf("log_seq %d with log_hash %q does not match this core's change log; move the copy aside and refollow from seq 1", hello.LogSeq, hello.LogHash), false)
	} else {
		f.acked, f.hash, f.sent = hello.LogSeq, hello.LogHash, hello.LogSeq
	}
	c.follow.Store(f)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runFollow(ctx, c, f)
	}()
	return nil
}

// runFollow sends a batch whenever none is in flight and the log holds
// entries beyond the acknowledged seq: after the handshake, after each ack
// and after each append.
func (s *Server) runFollow(ctx context.Context, c *conn, f *follow) {
	cl := s.cfg.Changelog
	for {
		changed := cl.Changed()
		f.mu.Lock()
		idle := f.sent == f.acked
		from := f.acked + 1
		f.mu.Unlock()
		if idle {
			entries, err := cl.Range(ctx, from, node.MaxLogBatch)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("read change log for a follower", "node_id", c.nodeID, "from_seq", from, "err", err)
			} else if len(entries) > 0 {
				entries = s.fitFrame(c, entries)
				f.mu.Lock()
				f.sent = entries[len(entries)-1].Seq
				f.mu.Unlock()
				if err := s.write(ctx, c, node.TypeLogEntries, "", node.LogEntries{FromSeq: from, Entries: entries}); err != nil {
					s.log.Info("send log_entries", "node_id", c.nodeID, "err", err)
					c.cancel()
					return
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		case <-changed:
			if !idle || s.cfg.LogFollowDelay <= 0 {
				continue
			}
			// At the head and woken by an append: let the burst end, so its entries go
			// out as one batch (the delay bounds how late an entry reaches a node).
			t := time.NewTimer(s.cfg.LogFollowDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// fitFrame returns the longest prefix of entries whose log_entries frame
// stays within node.MaxMessageBytes (docs/node-protocol.md sections 3.2 and
// 7.4): the entries' encoded sizes, with their separators, stay within
// changelog.MaxEntryBytes, which leaves changelog.FrameOverheadBytes for the
// envelope. The log refuses larger entries when they are written, so the
// first entry always fits; one stored before that rule is sent alone, and
// its size is logged as the reason the node cannot take it.
func (s *Server) fitFrame(c *conn, entries []node.LogEntry) []node.LogEntry {
	total := 0
	for i, e := range entries {
		n, err := changelog.EntrySize(e)
		if err != nil {
			s.log.Error("size a change-log entry for a follower", "node_id", c.nodeID, "seq", e.Seq, "err", err)
			return entries[:max(i, 1)]
		}
		if i > 0 {
			n++ // the comma before it
		}
		if total+n > changelog.MaxEntryBytes {
			if i == 0 {
				s.log.Error("a change-log entry is larger than one frame; the node cannot take it", "node_id", c.nodeID, "seq", e.Seq, "bytes", n, "limit", changelog.MaxEntryBytes)
				return entries[:1]
			}
			return entries[:i]
		}
		total += n
	}
	return entries
}

// onLogAck records a node's acknowledgement. An ack is taken only when it
// covers entries of the batch in flight (acked < seq <= sent) and carries the
// core's hash at that seq; any other ack, including one that skips past what
// was sent, is ignored (section 7.4). A taken ack that stops short of the
// batch ends it too: the rest is sent again from seq + 1.
func (s *Server) onLogAck(ctx context.Context, c *conn, env *node.Envelope) {
	f := c.follow.Load()
	var ack node.LogAck
	if err := json.Unmarshal(env.Body, &ack); err != nil {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "log_ack body is malformed", false)
		return
	}
	if f == nil {
		return
	}
	f.mu.Lock()
	inRange := ack.Seq > f.acked && ack.Seq <= f.sent
	f.mu.Unlock()
	if !inRange {
		s.log.Warn("ignored a log_ack outside the batch in flight", "node_id", c.nodeID, "seq", ack.Seq)
		return
	}
	want, ok, err := s.cfg.Changelog.HashAt(ctx, ack.Seq)
	if err != nil || !ok || want != ack.Hash {
		s.log.Warn("ignored a log_ack whose hash does not match", "node_id", c.nodeID, "seq", ack.Seq, "err", err)
		return
	}
	f.mu.Lock()
	if ack.Seq > f.acked {
		f.acked, f.hash, f.sent = ack.Seq, ack.Hash, ack.Seq
	}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// LogPosition returns the newest change-log seq nodeID acknowledged on its
// live session and whether it has one that follows the log.
func (s *Server) LogPosition(nodeID string) (int64, bool) {
	s.mu.Lock()
	c := s.sessions[nodeID]
	s.mu.Unlock()
	if c == nil {
		return 0, false
	}
	f := c.follow.Load()
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acked, true
}
