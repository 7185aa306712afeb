package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/store"
)

// LogIndex stores shipped log segments (docs/node-protocol.md section 5.24); *logs.Index is one.
type LogIndex interface {
	Have(ctx context.Context, owner logs.Owner, info node.LogSegmentInfo) (bool, error)
	Put(ctx context.Context, owner logs.Owner, info node.LogSegmentInfo, data []byte) error
	Register(ctx context.Context, id string, owner logs.Owner) (*logs.Workload, error)
	Workload(ctx context.Context, id string) (*logs.Workload, error)
}

// segmentUpload is the segment a session is receiving, piece by piece; only the session's
// handler touches it.
type segmentUpload struct {
	info  node.LogSegmentInfo
	owner logs.Owner
	data  []byte
}

// onLogSegment answers one log_segment (section 5.24): a piece with no segment registers the
// workload's log; a first piece of a segment the core holds is answered have; other pieces are
// gathered in order and the last one stores the segment. Every answer is a log_segment_ack.
func (s *Server) onLogSegment(ctx context.Context, c *conn, env *node.Envelope) {
	answer := func(ack node.LogSegmentAck) { _ = s.write(ctx, c, node.TypeLogSegmentAck, env.ID, ack) }
	refuse := func(code abierrors.Code, msg string) {
		c.upload = nil
		answer(node.LogSegmentAck{Code: string(code), Message: msg})
	}
	if s.cfg.Logs == nil {
		refuse(abierrors.Unimplemented, "this core keeps no shipped logs")
		return
	}
	var m node.LogSegment
	if err := json.Unmarshal(env.Body, &m); err != nil || m.Segment.WorkloadID == "" {
		refuse(abierrors.BadMessage, "log_segment body is malformed or names no workload")
		return
	}
	info := m.Segment
	if m.Offset == 0 {
		c.upload = nil
		owner, code, why := s.logOwner(ctx, c, info.WorkloadID)
		if why != "" {
			refuse(code, why)
			return
		}
		if info.SHA256 == "" { // registration only
			answer(node.LogSegmentAck{Stored: true})
			return
		}
		if info.Bytes <= 0 || info.Bytes > node.LogSegmentMaxBytes {
			refuse(abierrors.BadMessage, fmt.Sprintf("a segment holds 1 to %d bytes", node.LogSegmentMaxBytes))
			return
		}
		have, err := s.cfg.Logs.Have(ctx, owner, info)
		if errors.Is(err, logs.ErrBadSegment) {
			refuse(abierrors.BadMessage, err.Error())
			return
		}
		if err != nil {
			s.log.Warn("look up a shipped log segment", "node_id", c.nodeID, "err", err)
			refuse(abierrors.Unavailable, "the log index could not be read; try again later")
			return
		}
		if have {
			answer(node.LogSegmentAck{Stored: true, Have: true})
			return
		}
		c.upload = &segmentUpload{info: info, owner: owner, data: make([]byte, 0, info.Bytes)}
	}
	u := c.upload
	switch {
	case u == nil || !sameSegment(u.info, info) || m.Offset != int64(len(u.data)):
		refuse(abierrors.BadMessage, "a log_segment piece out of order; start the segment again at offset 0")
		return
	case len(m.Data) > node.LogSegmentChunkBytes || int64(len(u.data)+len(m.Data)) > info.Bytes:
		refuse(abierrors.BadMessage, "a log_segment piece larger than allowed or than its segment")
		return
	}
	u.data = append(u.data, m.Data...)
	if !m.Last {
		answer(node.LogSegmentAck{NextOffset: int64(len(u.data))})
		return
	}
	c.upload = nil
	err := s.cfg.Logs.Put(ctx, u.owner, info, u.data)
	switch {
	case errors.Is(err, logs.ErrBadSegment):
		refuse(abierrors.BadMessage, err.Error())
	case err != nil:
		s.log.Warn("store a shipped log segment", "node_id", c.nodeID, "workload_id", info.WorkloadID, "err", err)
		refuse(abierrors.Unavailable, "the segment could not be stored; try again later")
	default:
		answer(node.LogSegmentAck{Stored: true})
	}
}

// logOwner finds who owns workload id's log for this session's node: the owner registered for
// it, or, at its first segment, its workload record, which must place it on this node. It
// returns a refusal code and reason instead when the node may not ship it.
func (s *Server) logOwner(ctx context.Context, c *conn, id string) (logs.Owner, abierrors.Code, string) {
	w, err := s.cfg.Logs.Workload(ctx, id)
	if err == nil {
		if w.NodeID != c.nodeID {
			return logs.Owner{}, abierrors.BadMessage, fmt.Sprintf("workload %s's log belongs to another node", id)
		}
		return logs.Owner{ProjectID: w.ProjectID, Project: w.Project, Service: w.Service, Replica: w.Replica, NodeID: w.NodeID}, "", ""
	}
	if !errors.Is(err, logs.ErrNotFound) {
		s.log.Warn("read a workload's shipped log", "node_id", c.nodeID, "workload_id", id, "err", err)
		return logs.Owner{}, abierrors.Unavailable, "the log index could not be read; try again later"
	}
	wl, err := s.cfg.Catalog.GetWorkload(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && wl.NodeID != c.nodeID):
		return logs.Owner{}, abierrors.NotFound, fmt.Sprintf("workload %s is not one of this node's", id)
	case err != nil:
		s.log.Warn("read a workload to ship its log", "node_id", c.nodeID, "workload_id", id, "err", err)
		return logs.Owner{}, abierrors.Unavailable, "the workload could not be read; try again later"
	}
	owner := logs.Owner{ProjectID: wl.ProjectID, Project: wl.Project, Service: wl.Service, Replica: wl.Replica, NodeID: c.nodeID}
	if _, err := s.cfg.Logs.Register(ctx, id, owner); err != nil {
		s.log.Warn("register a workload's log", "node_id", c.nodeID, "workload_id", id, "err", err)
		return logs.Owner{}, abierrors.Unavailable, "the log index could not be written; try again later"
	}
	return owner, "", ""
}

// sameSegment reports whether a and b describe the same segment upload.
func sameSegment(a, b node.LogSegmentInfo) bool {
	return a.WorkloadID == b.WorkloadID && a.SHA256 == b.SHA256 && a.Bytes == b.Bytes && a.FirstSeq == b.FirstSeq && a.LastSeq == b.LastSeq
}
