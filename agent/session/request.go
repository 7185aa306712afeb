package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/berthhq/berth/abi/node"
)

// ErrNoSession is returned by [Client.ShipLogSegment] while no welcomed session is open, or when
// the session ended before the core answered; the caller tries again later.
var ErrNoSession = errors.New("berth: no node session is open")

// requests pairs node-initiated messages with the core's answers (by re) on one session.
type requests struct {
	mu      sync.Mutex
	pending map[string]chan json.RawMessage // mu must be held
}

func (r *requests) add(id string) chan json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[string]chan json.RawMessage{}
	}
	ch := make(chan json.RawMessage, 1)
	r.pending[id] = ch
	return ch
}

func (r *requests) drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, id)
}

// answer hands body to the request re waits on; an answer to nothing pending is ignored.
func (r *requests) answer(re string, body json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.pending[re]; ok {
		ch <- body
		delete(r.pending, re)
	}
}

// refuse answers the request re waits on with a log_segment_ack carrying the error eb, and
// reports whether one was waiting.
func (r *requests) refuse(re string, eb node.ErrorBody) bool {
	body, _ := json.Marshal(node.LogSegmentAck{Code: eb.Code, Message: eb.Message})
	r.mu.Lock()
	_, ok := r.pending[re]
	r.mu.Unlock()
	if ok {
		r.answer(re, body)
	}
	return ok
}

// ShipLogSegment sends one log_segment on the current session and waits for its
// log_segment_ack (docs/node-protocol.md section 5.24), at most until ctx ends. Errors:
// [ErrNoSession] when no welcomed session is open or it ended before the answer; ctx's error.
// Safe for concurrent use, though a shipper sends one piece at a time.
func (c *Client) ShipLogSegment(ctx context.Context, seg node.LogSegment) (node.LogSegmentAck, error) {
	var ack node.LogSegmentAck
	s := c.current.Load()
	if s == nil {
		return ack, ErrNoSession
	}
	id := newID()
	ch := s.reqs.add(id)
	defer s.reqs.drop(id)
	if err := s.sendWithID(ctx, node.TypeLogSegment, id, "", seg); err != nil {
		return ack, fmt.Errorf("%w: %w", ErrNoSession, err)
	}
	select {
	case body := <-ch:
		if err := json.Unmarshal(body, &ack); err != nil {
			return ack, fmt.Errorf("decode log_segment_ack: %w", err)
		}
		return ack, nil
	case <-s.done:
		return ack, ErrNoSession
	case <-ctx.Done():
		return ack, ctx.Err()
	}
}
