// Package relay owns the cluster relay's transport: the relay side (one outbound WebSocket to berthd
// carrying a yamux session, one stream per node connection) and the core side berthd mounts.
// It never reads or changes a node's payload; the stream header of abi/relay is the only thing it adds.
package relay

import (
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/hashicorp/yamux"
)

// Timeouts and budgets of the transport (docs/relay.md section 4). The numbers follow the relay's
// contract: a node waits at most 5 s for a core session, a forward is bounded at 8 s, and the
// re-registration of nodes after a reconnect is spread 75 ms apart inside 5 s.
const (
	// DefaultSessionWait is how long a new node connection waits for a core session before it is closed.
	DefaultSessionWait = 5 * time.Second
	// DefaultWriteTimeout bounds every write to a stream, to a node and to the WebSocket.
	DefaultWriteTimeout = 8 * time.Second
	// DefaultStreamOpenTimeout bounds the core's acknowledgement of a new stream.
	DefaultStreamOpenTimeout = 5 * time.Second
	// DefaultKeepAlive is the yamux ping interval on the core session.
	DefaultKeepAlive = 5 * time.Second
	// DefaultStreamWindow is each stream's receive window, the bound of what is buffered per node in
	// either direction on the mux (yamux's default and minimum).
	DefaultStreamWindow = 256 << 10
	// DefaultCopyBuffer is the size of each of a node's two copy buffers.
	DefaultCopyBuffer = 32 << 10
	// DefaultHeaderTimeout bounds reading a stream's header on the core side.
	DefaultHeaderTimeout = 5 * time.Second
	// DefaultReregisterSpacing is the pause between closing two nodes' connections after a reconnect.
	DefaultReregisterSpacing = 75 * time.Millisecond
	// DefaultReregisterWindow is the time within which every node of an older session is closed.
	DefaultReregisterWindow = 5 * time.Second
	// DefaultBackoffMin and DefaultBackoffMax bound the relay's reconnect backoff (jittered).
	DefaultBackoffMin = 250 * time.Millisecond
	DefaultBackoffMax = 10 * time.Second
	// DefaultAcceptBacklog bounds the streams opened but not yet accepted by the core.
	DefaultAcceptBacklog = 256
	// wsReadLimit bounds one WebSocket message: a yamux frame is at most its header plus one
	// stream window.
	wsReadLimit = DefaultStreamWindow + 64<<10
)

// muxConfig is the yamux configuration both sides use: keep-alives on, every open and connection
// write bounded, a fixed stream window, logs into slog.
func muxConfig(log *slog.Logger, writeTimeout, openTimeout, keepAlive time.Duration) *yamux.Config {
	return &yamux.Config{
		AcceptBacklog:          DefaultAcceptBacklog,
		EnableKeepAlive:        true,
		KeepAliveInterval:      keepAlive,
		ConnectionWriteTimeout: writeTimeout,
		MaxStreamWindowSize:    DefaultStreamWindow,
		StreamOpenTimeout:      openTimeout,
		StreamCloseTimeout:     writeTimeout,
		Logger:                 slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		LogOutput:              nil,
	}
}

// discard is a logger that drops everything, for a zero Config.
func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// guardedStream is a stream that ends its whole session when a write times out on the session's
// send queue (yamux.ErrConnectionWriteTimeout). yamux v0.1.2 leaves the session and the stream as
// they were in that case, so the peer's Read waiting for those bytes would hang until the session
// ended on its own (hashicorp/yamux#142); ending the session makes both sides see the loss at once
// and the relay reconnect.
type guardedStream struct {
	*yamux.Stream
	sess *yamux.Session
}

func (g guardedStream) Write(b []byte) (int, error) {
	n, err := g.Stream.Write(b)
	if errors.Is(err, yamux.ErrConnectionWriteTimeout) {
		_ = g.sess.Close()
	}
	return n, err
}
