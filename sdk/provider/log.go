package provider

import (
	"io"
	"log/slog"

	"github.com/berthhq/berth/sdk/internal/serve"
)

// NewLogger returns a logger that writes JSON lines in the format go-plugin's
// host parses, so the host re-emits each line with its level and attributes
// under the plugin's name. Pass os.Stderr before calling Serve.
func NewLogger(w io.Writer) *slog.Logger { return serve.NewLogger(w) }
