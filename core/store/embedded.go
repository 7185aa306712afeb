package store

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// embeddedServer is FerretDB running in this process over SQLite.
type embeddedServer struct {
	dir    string // the SQLite files
	uri    string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned and the SQLite backend is closed
}

// ferretNewMu serialises ferretdb.New, which writes a FerretDB package-level variable
// (version.Get().Package); two stores opened at once in one process would race on it.
// It is the only state shared between Stores.
var ferretNewMu sync.Mutex

// startEmbedded starts FerretDB with its SQLite files in dir (created 0700) on a loopback port.
// Its lifetime is independent of any request ctx; stop ends it.
func startEmbedded(dir string, log *slog.Logger) (*embeddedServer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create embedded store directory %s: %w", dir, err)
	}
	sqliteURL := (&url.URL{Scheme: "file", Path: dir + "/"}).String()

	ferretNewMu.Lock()
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: sqliteURL,
		Logger:    slog.New(newQuietHandler(log.Handler())).With("component", "ferretdb"),
	})
	ferretNewMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("store: start embedded FerretDB in %s: %w", dir, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	srv := &embeddedServer{dir: dir, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(srv.done)
		_ = f.Run(ctx) // always nil; returns once ctx ends and the backend is closed
	}()
	// The TCP listener is bound by ferretdb.New, so MongoDBURI does not block here.
	srv.uri = f.MongoDBURI()
	return srv, nil
}

// stop cancels FerretDB and waits, bounded by ctx, until it has closed its connections and files.
func (e *embeddedServer) stop(ctx context.Context) error {
	e.cancel()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("store: wait for embedded FerretDB to stop: %w", ctx.Err())
	}
}

// quietHandler passes FerretDB's records to the Berth logger quieter: its Info (connection
// chatter) and Warn (dumps of commands it answered with an error, such as the driver's
// endSessions at shutdown) become Debug or below; its Error becomes Warn.
type quietHandler struct{ next slog.Handler }

func newQuietHandler(next slog.Handler) *quietHandler { return &quietHandler{next: next} }

func quieter(l slog.Level) slog.Level {
	switch {
	case l >= slog.LevelError:
		return slog.LevelWarn
	case l >= slog.LevelWarn:
		return slog.LevelDebug
	}
	return l - 4
}

func (h *quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, quieter(l))
}

func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = quieter(r.Level)
	return h.next.Handle(ctx, r)
}

func (h *quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &quietHandler{next: h.next.WithAttrs(attrs)}
}

func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{next: h.next.WithGroup(name)}
}
