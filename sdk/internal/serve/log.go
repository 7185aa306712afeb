package serve

import (
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns a logger that writes JSON lines in the format go-plugin's
// host parses (keys "@timestamp", "@level", "@message"), so that the host
// re-emits each line with its level and attributes under the plugin's name.
// Debug lines are included; the host filters by its own level.
func NewLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
			case slog.LevelKey:
				return slog.String("@level", strings.ToLower(levelName(a.Value)))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	}))
}

// levelName maps a slog level to the nearest hclog level name.
func levelName(v slog.Value) string {
	l, ok := v.Any().(slog.Level)
	if !ok {
		return "info"
	}
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	default:
		return "error"
	}
}
