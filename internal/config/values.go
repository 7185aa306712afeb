package config

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
)

// LevelValue is a pflag.Value holding a log level ("debug", "info", "warn",
// "error", or one of those with an offset like "info+2"); Set refuses
// anything else, so a file names the line of a bad level.
type LevelValue struct{ L *slog.Level }

// String returns the level's name.
func (v LevelValue) String() string {
	if v.L == nil {
		return "info"
	}
	return strings.ToLower(v.L.String())
}

// Set parses s as a level.
func (v LevelValue) Set(s string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	*v.L = l
	return nil
}

// Type names the value in usage text.
func (LevelValue) Type() string { return "level" }

// AddrValue is a pflag.Value holding a HOST:PORT listen address; Set refuses
// a value without a port or with a port outside 0 to 65535. Off, when not
// empty, is one more accepted word (such as "off").
type AddrValue struct {
	S   *string
	Off string
}

// String returns the address.
func (v AddrValue) String() string {
	if v.S == nil {
		return ""
	}
	return *v.S
}

// Set checks s and stores it.
func (v AddrValue) Set(s string) error {
	if v.Off != "" && s == v.Off {
		*v.S = s
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("listen address %q: want HOST:PORT: %w", s, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("listen address %q: port %q is not a number from 0 to 65535", s, port)
	}
	*v.S = s
	return nil
}

// Type names the value in usage text.
func (AddrValue) Type() string { return "host:port" }
