package plugin

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter is an hclog.Logger that writes to a slog.Logger. go-plugin
// logs through it, and it re-emits the JSON log lines a plugin writes to its
// stderr with their level and attributes.
type hclogAdapter struct {
	l    *slog.Logger
	name string
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHclogAdapter(l *slog.Logger) *hclogAdapter { return &hclogAdapter{l: l} }

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...interface{}) {
	if level == hclog.Off {
		return
	}
	a.l.Log(context.Background(), slogLevel(level), msg, args...)
}

func (a *hclogAdapter) Trace(msg string, args ...interface{}) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...interface{}) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...interface{})  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...interface{})  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...interface{}) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(level hclog.Level) bool {
	return a.l.Enabled(context.Background(), slogLevel(level))
}

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []interface{} { return nil }

func (a *hclogAdapter) With(args ...interface{}) hclog.Logger {
	return &hclogAdapter{l: a.l.With(args...), name: a.name}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return &hclogAdapter{l: a.l.With("logger", name), name: name}
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l.With("logger", name), name: name}
}

// SetLevel is ignored: the slog handler decides.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

func (a *hclogAdapter) GetLevel() hclog.Level {
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(lv) {
			return lv
		}
	}
	return hclog.Off
}

func (a *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(a.l.Handler(), slog.LevelInfo)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}

// lineLogger is an io.Writer that logs every complete line written to it.
// go-plugin writes a plugin's os.Stdout and os.Stderr (as replaced by
// go-plugin's server after the handshake) to it.
type lineLogger struct {
	l      *slog.Logger
	stream string

	mu  sync.Mutex
	buf []byte // mu must be held
}

const maxLogLine = 64 << 10

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.l.Info(string(bytes.TrimRight(w.buf[:i], "\r")), "stream", w.stream)
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLogLine {
		w.l.Info(string(w.buf), "stream", w.stream, "truncated", true)
		w.buf = nil
	}
	return len(p), nil
}
