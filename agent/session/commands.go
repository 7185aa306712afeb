package session

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
)

// Commands serves the core's on-demand requests (docs/node-protocol.md
// sections 5.15 to 5.17). The session calls each method on its own goroutine.
type Commands interface {
	// Command answers one command. The result must fit the 1 MiB message
	// limit; a result that does not is replaced by an error result.
	Command(ctx context.Context, cmd node.Command) node.CommandResult
	// Stream serves one stream: it calls send with each batch of lines until
	// its source ends (return nil: stream_end completed) or ctx ends
	// (stream_close or the session's end). An error ends it with reason
	// error; one wrapping an *abierrors.Error before anything was sent is
	// answered as a refused open (command_result error with its code).
	Stream(ctx context.Context, open node.StreamOpen, send func(lines []node.LogLine) error) error
}

// KeyStore persists a rotated cluster signing key (section 5.21).
// *localstore.Store satisfies it.
type KeyStore interface {
	SetClusterKey(ctx context.Context, pub ed25519.PublicKey) error
}

// streams tracks one session's open streams.
type streams struct {
	mu   sync.Mutex
	open map[string]context.CancelFunc
	wg   sync.WaitGroup
}

// onCommand answers a command on its own goroutine.
func (s *conn) onCommand(ctx context.Context, env node.Envelope) error {
	c := s.c
	var cmd node.Command
	if err := json.Unmarshal(env.Body, &cmd); err != nil || cmd.Kind == "" {
		return s.sendError(ctx, env.ID, berrors.BadMessage, "command body does not parse or has no kind", false)
	}
	if c.cfg.Commands == nil {
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error",
			Error: &node.ErrorBody{Code: string(berrors.Unimplemented), Message: "this agent serves no commands"}})
	}
	s.streams.wg.Add(1)
	go func() {
		defer s.streams.wg.Done()
		res := c.cfg.Commands.Command(ctx, cmd)
		if err := s.send(ctx, node.TypeCommandResult, env.ID, res); err != nil && ctx.Err() == nil {
			c.log.Warn("send command_result", "kind", cmd.Kind, "error", err)
			_ = s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error",
				Detail: "the answer exceeds the message limit",
				Error:  &node.ErrorBody{Code: string(berrors.Internal), Message: err.Error()}})
		}
	}()
	return nil
}

// onStreamOpen starts a stream, refusing a duplicate id and one beyond
// node.MaxStreamsPerSession open streams with a command_result error.
func (s *conn) onStreamOpen(ctx context.Context, env node.Envelope) error {
	c := s.c
	var open node.StreamOpen
	if err := json.Unmarshal(env.Body, &open); err != nil || open.StreamID == "" {
		return s.sendError(ctx, env.ID, berrors.BadMessage, "stream_open body does not parse or has no stream_id", false)
	}
	refuse := func(code berrors.Code, msg string) error {
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error", Detail: string(code),
			Error: &node.ErrorBody{Code: string(code), Message: msg}})
	}
	if c.cfg.Commands == nil || open.Kind != node.StreamAppLogs {
		return refuse(berrors.Unimplemented, fmt.Sprintf("stream kind %q is not served", open.Kind))
	}
	st := &s.streams
	st.mu.Lock()
	if _, dup := st.open[open.StreamID]; dup {
		st.mu.Unlock()
		return refuse(berrors.BadMessage, "a stream with this id is open")
	}
	if len(st.open) >= node.MaxStreamsPerSession {
		st.mu.Unlock()
		return refuse(berrors.StreamLimit, fmt.Sprintf("%d streams are open on this session", node.MaxStreamsPerSession))
	}
	sctx, cancel := context.WithCancel(ctx)
	st.open[open.StreamID] = cancel
	st.wg.Add(1)
	st.mu.Unlock()
	go func() {
		defer st.wg.Done()
		var seq int64
		err := c.cfg.Commands.Stream(sctx, open, func(lines []node.LogLine) error {
			if err := sctx.Err(); err != nil {
				return err // closed: send nothing more
			}
			seq++
			// The write runs under the session's context, not the stream's: the WebSocket
			// library closes the whole connection when a write's context ends mid-write, and a
			// stream_close must end one stream, never the session.
			return s.send(ctx, node.TypeStreamData, "", node.StreamData{StreamID: open.StreamID, Seq: seq, Lines: lines})
		})
		st.mu.Lock()
		_, stillOpen := st.open[open.StreamID]
		delete(st.open, open.StreamID)
		st.mu.Unlock()
		cancel()
		if ctx.Err() != nil {
			return // the session ended
		}
		end := node.StreamEnd{StreamID: open.StreamID, Reason: node.StreamCompleted}
		var ae *berrors.Error
		switch {
		case !stillOpen:
			end.Reason = node.StreamCancelled
		case err != nil && seq == 0 && errors.As(err, &ae):
			_ = refuse(ae.Code, ae.Message)
			return
		case err != nil:
			end.Reason, end.Detail = node.StreamError, err.Error()
		}
		if err := s.send(ctx, node.TypeStreamEnd, env.ID, end); err != nil {
			c.log.Warn("send stream_end", "stream_id", open.StreamID, "error", err)
		}
	}()
	return nil
}

// onStreamClose stops a stream; it then ends with stream_end cancelled.
// An unknown id is ignored (section 5.16).
func (s *conn) onStreamClose(ctx context.Context, env node.Envelope) error {
	var cl node.StreamClose
	if err := json.Unmarshal(env.Body, &cl); err != nil {
		return s.sendError(ctx, env.ID, berrors.BadMessage, "stream_close body does not parse", false)
	}
	st := &s.streams
	st.mu.Lock()
	cancel, ok := st.open[cl.StreamID]
	delete(st.open, cl.StreamID)
	st.mu.Unlock()
	if ok {
		cancel()
	}
	return nil
}

// onSigningKeyRotate verifies a rotation against the pinned key, persists
// the new key and pins it (section 5.21). A bad signature is answered with
// bad_signature and changes nothing.
func (s *conn) onSigningKeyRotate(ctx context.Context, env node.Envelope) error {
	c := s.c
	pub, r, err := node.VerifyRotate(env.Body, c.clusterKey())
	if err != nil {
		c.log.Warn("refused signing_key_rotate; keeping the pinned key", "error", err)
		return s.sendError(ctx, env.ID, berrors.BadSignature, "signing_key_rotate signature does not verify against the pinned signing key", false)
	}
	if c.cfg.Keys == nil {
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error",
			Error: &node.ErrorBody{Code: string(berrors.Unimplemented), Message: "this agent cannot persist a new signing key"}})
	}
	if err := c.cfg.Keys.SetClusterKey(ctx, pub); err != nil {
		c.log.Error("persist rotated signing key", "error", err)
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error",
			Error: &node.ErrorBody{Code: string(berrors.Internal), Message: "the node could not persist the new key"}})
	}
	c.key.Store(&pub)
	c.log.Info("cluster signing key rotated", "key_id", r.KeyID)
	return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok", Detail: "pinned key " + r.KeyID})
}
