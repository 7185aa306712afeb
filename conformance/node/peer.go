package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/conformance"
)

// wait bounds every single await of a case: a peer that says nothing for this
// long fails the case (the protocol's own timers are shorter or scaled).
const wait = 20 * time.Second

// peer is one side of a real node-session WebSocket, scripted by a case:
// it injects messages and awaits the other side's answers.
type peer struct {
	t   conformance.T
	ws  *websocket.Conn
	seq atomic.Int64
	// consume, when set, sees every message first and reports whether it
	// handled it (a scripted node acknowledging a pushed desired_state);
	// handled messages are not returned by await.
	consume func(*node.Envelope) bool
}

func newPeer(t conformance.T, ws *websocket.Conn) *peer {
	ws.SetReadLimit(4 << 20)
	return &peer{t: t, ws: ws}
}

// id returns a fresh message id.
func (p *peer) id() string { return "msg_conf" + strconv.FormatInt(p.seq.Add(1), 10) }

// send sends a v1 message and returns its id.
func (p *peer) send(typ node.Type, re string, body any) string {
	p.t.Helper()
	return p.sendV(node.Version, typ, re, body)
}

// sendV sends a message with envelope version v and returns its id.
func (p *peer) sendV(v int, typ node.Type, re string, body any) string {
	p.t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		p.t.Fatalf("encode %s: %v", typ, err)
	}
	id := p.id()
	frame, err := json.Marshal(node.Envelope{V: v, Type: typ, ID: id, Re: re, Body: raw})
	if err != nil {
		p.t.Fatalf("encode %s envelope: %v", typ, err)
	}
	p.sendRaw(frame)
	return id
}

// sendRaw sends one text frame as is.
func (p *peer) sendRaw(frame []byte) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), wait)
	defer cancel()
	if err := p.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		p.t.Fatalf("write frame: %v", err)
	}
}

// read returns the next envelope, or the error that ended the socket.
func (p *peer) read(ctx context.Context) (*node.Envelope, error) {
	typ, raw, err := p.ws.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, errors.New("binary frame; v1 uses text frames only (docs/node-protocol.md section 3.2)")
	}
	var env node.Envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("frame is not a JSON envelope: %w", err)
	}
	if env.V != node.Version {
		return nil, fmt.Errorf("envelope v %d, want %d", env.V, node.Version)
	}
	return &env, nil
}

// next returns the next message that is not a heartbeat, status report or
// pong (the steady-state chatter), failing the case after [wait].
func (p *peer) next() *node.Envelope {
	p.t.Helper()
	return p.await("any message", func(e *node.Envelope) bool {
		return e.Type != node.TypeHeartbeat && e.Type != node.TypeStatusReport && e.Type != node.TypePong
	})
}

// await reads until match accepts a message, failing the case after [wait]
// or when the socket ends first.
func (p *peer) await(what string, match func(*node.Envelope) bool) *node.Envelope {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), wait)
	defer cancel()
	for {
		env, err := p.read(ctx)
		if err != nil {
			p.t.Fatalf("waiting for %s: %v", what, err)
		}
		if p.consume != nil && p.consume(env) {
			continue
		}
		if match(env) {
			return env
		}
	}
}

// awaitType waits for the next message of typ.
func (p *peer) awaitType(typ node.Type) *node.Envelope {
	p.t.Helper()
	return p.await(string(typ), func(e *node.Envelope) bool { return e.Type == typ })
}

// expectError waits for the next message that is not chatter and checks that
// it is error code with the given fatality (and re, unless re is empty).
func (p *peer) expectError(code string, fatal bool, re string) node.ErrorBody {
	p.t.Helper()
	env := p.next()
	var e node.ErrorBody
	_ = json.Unmarshal(env.Body, &e)
	if env.Type != node.TypeError || e.Code != code || e.Fatal != fatal {
		p.t.Fatalf("got %s %s, want error %s fatal=%v (docs/node-protocol.md section 5.18)", env.Type, env.Body, code, fatal)
	}
	if re != "" && env.Re != re {
		p.t.Errorf("error %s has re %q, want %q", code, env.Re, re)
	}
	return e
}

// expectClosed waits until the other side ends the socket and returns the
// close status (-1 when it went without a close frame).
func (p *peer) expectClosed(within time.Duration) websocket.StatusCode {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), within)
	defer cancel()
	for {
		_, err := p.read(ctx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			p.t.Fatalf("the session was still open %s later", within)
		}
		return websocket.CloseStatus(err)
	}
}

// barrier sends a ping and waits for its pong: the other side handles a
// session's frames in order, so everything sent before was handled.
func (p *peer) barrier() {
	p.t.Helper()
	id := p.send(node.TypePing, "", struct{}{})
	p.await("pong", func(e *node.Envelope) bool { return e.Type == node.TypePong && e.Re == id })
}

func (p *peer) close() { _ = p.ws.CloseNow() }

func decode[T any](t conformance.T, env *node.Envelope) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(env.Body, &v); err != nil {
		t.Fatalf("%s body does not parse: %v: %s", env.Type, err, env.Body)
	}
	return v
}
