package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/websocket"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
)

// ErrNotConnected is returned by [Server.Command] and [Server.OpenStream]
// when the node has no live session on this core.
var ErrNotConnected = errors.New("berth: node has no live session")

// ErrStreamLimit is returned by [Server.OpenStream] when the session already
// has node.MaxStreamsPerSession open streams (docs/node-protocol.md section 5.15).
var ErrStreamLimit = abierrors.New(abierrors.StreamLimit, fmt.Sprintf("%d streams are open on this node's session", node.MaxStreamsPerSession))

// waiters pairs answers with the requests of one session.
type waiters struct {
	mu      sync.Mutex
	results map[string]chan node.CommandResult // request msg id -> its command_result
	streams map[string]*Stream                 // stream id -> open stream
}

// Stream is an open stream (section 5.15). Data delivers each stream_data
// in order and is closed when the stream ends; End then holds why.
type Stream struct {
	ID   string
	Data <-chan node.StreamData

	data   chan node.StreamData
	mu     sync.Mutex
	end    node.StreamEnd
	done   chan struct{}
	server *Server
	conn   *conn
}

// End returns the stream_end once Data is closed (a zero value before).
func (st *Stream) End() node.StreamEnd {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.end
}

// Close sends stream_close; the node answers stream_end cancelled, which
// closes Data. Idempotent.
func (st *Stream) Close(ctx context.Context) error {
	select {
	case <-st.done:
		return nil
	default:
	}
	return st.server.write(ctx, st.conn, node.TypeStreamClose, "", node.StreamClose{StreamID: st.ID})
}

func (st *Stream) finish(end node.StreamEnd) {
	st.mu.Lock()
	defer st.mu.Unlock()
	select {
	case <-st.done:
		return
	default:
	}
	st.end = end
	close(st.done)
	close(st.data)
}

func (s *Server) live(nodeID string) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.sessions[nodeID]
	if c == nil || !c.welcomed.Load() {
		return nil
	}
	return c
}

// Command sends a command to nodeID's live session and waits for its
// command_result, or ctx. Errors: [ErrNotConnected]; a write failure; ctx's.
func (s *Server) Command(ctx context.Context, nodeID string, cmd node.Command) (*node.CommandResult, error) {
	c := s.live(nodeID)
	if c == nil {
		return nil, ErrNotConnected
	}
	id := identity.NewID("msg_")
	ch := make(chan node.CommandResult, 1)
	c.waits.mu.Lock()
	c.waits.results[id] = ch
	c.waits.mu.Unlock()
	defer func() {
		c.waits.mu.Lock()
		delete(c.waits.results, id)
		c.waits.mu.Unlock()
	}()
	if err := s.writeID(ctx, c, id, node.TypeCommand, "", cmd); err != nil {
		return nil, err
	}
	select {
	case res := <-ch:
		return &res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// OpenStream opens a stream of kind on nodeID's live session. At most
// node.MaxStreamsPerSession are open at once per session: the next is
// refused with [ErrStreamLimit] without touching the node. A refusal by
// the node (command_result error) ends the stream with reason "error".
func (s *Server) OpenStream(ctx context.Context, nodeID, kind string, params any) (*Stream, error) {
	c := s.live(nodeID)
	if c == nil {
		return nil, ErrNotConnected
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encode stream params: %w", err)
	}
	id := identity.NewID("msg_")
	data := make(chan node.StreamData, 64)
	st := &Stream{ID: id, Data: data, data: data, done: make(chan struct{}), server: s, conn: c}
	c.waits.mu.Lock()
	if len(c.waits.streams) >= node.MaxStreamsPerSession {
		c.waits.mu.Unlock()
		return nil, ErrStreamLimit
	}
	c.waits.streams[id] = st
	c.waits.mu.Unlock()
	if err := s.writeID(ctx, c, id, node.TypeStreamOpen, "", node.StreamOpen{StreamID: id, Kind: kind, Params: raw}); err != nil {
		s.endStream(c, id, node.StreamEnd{StreamID: id, Reason: node.StreamError, Detail: err.Error()})
		return nil, err
	}
	return st, nil
}

func (s *Server) endStream(c *conn, id string, end node.StreamEnd) {
	c.waits.mu.Lock()
	st := c.waits.streams[id]
	delete(c.waits.streams, id)
	c.waits.mu.Unlock()
	if st != nil {
		st.finish(end)
	}
}

// onCommandResult hands a command_result to the request it answers: a
// command, or a stream_open the node refused.
func (s *Server) onCommandResult(c *conn, env *node.Envelope, res node.CommandResult) bool {
	c.waits.mu.Lock()
	ch := c.waits.results[env.Re]
	_, isStream := c.waits.streams[env.Re]
	c.waits.mu.Unlock()
	switch {
	case ch != nil:
		select {
		case ch <- res:
		default:
		}
		return true
	case isStream && res.Status != "ok":
		s.endStream(c, env.Re, node.StreamEnd{StreamID: env.Re, Reason: node.StreamError, Detail: res.Detail})
		return true
	}
	return false
}

// onStreamData delivers stream_data to its stream; data for an unknown or
// ended stream is dropped. A consumer that does not keep up within 5 s loses
// the stream, so one slow reader cannot stall the session.
func (s *Server) onStreamData(ctx context.Context, c *conn, env *node.Envelope) {
	var d node.StreamData
	if err := json.Unmarshal(env.Body, &d); err != nil {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "stream_data body is malformed", false)
		return
	}
	c.waits.mu.Lock()
	st := c.waits.streams[d.StreamID]
	c.waits.mu.Unlock()
	if st == nil {
		return
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case st.data <- d:
	case <-st.done:
	case <-t.C:
		_ = st.Close(ctx)
		s.endStream(c, d.StreamID, node.StreamEnd{StreamID: d.StreamID, Reason: node.StreamError, Detail: "consumer too slow"})
	}
}

func (s *Server) onStreamEnd(ctx context.Context, c *conn, env *node.Envelope) {
	var e node.StreamEnd
	if err := json.Unmarshal(env.Body, &e); err != nil {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "stream_end body is malformed", false)
		return
	}
	s.endStream(c, e.StreamID, e)
}

// endAllStreams ends every stream of a closing session.
func (s *Server) endAllStreams(c *conn) {
	c.waits.mu.Lock()
	ids := make([]string, 0, len(c.waits.streams))
	for id := range c.waits.streams {
		ids = append(ids, id)
	}
	c.waits.mu.Unlock()
	for _, id := range ids {
		s.endStream(c, id, node.StreamEnd{StreamID: id, Reason: node.StreamError, Detail: "session ended"})
	}
}

// writeID is write with a chosen message id, for requests whose answer is
// paired by re.
func (s *Server) writeID(ctx context.Context, c *conn, id string, typ node.Type, re string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", typ, err)
	}
	frame, err := json.Marshal(node.Envelope{V: node.Version, Type: typ, ID: id, Re: re, Body: raw})
	if err != nil {
		return fmt.Errorf("marshal envelope: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The write runs under the session's own context: the WebSocket library closes the whole
	// connection when a write's context ends mid-write, and a caller that gave up (an API client
	// that left) must not end the node's session.
	wctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if err := c.ws.Write(wctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("write %s to %s: %w", typ, c.nodeID, err)
	}
	return nil
}
