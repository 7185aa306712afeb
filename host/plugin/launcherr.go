package plugin

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
)

// StderrTailBytes bounds how much of a plugin's stderr [StderrTail] keeps.
const StderrTailBytes = 4096

// StderrTailLines is how many of the last stderr lines [StderrTail.Lines]
// returns.
const StderrTailLines = 20

// StderrTail keeps the last StderrTailBytes written to it: the plugin's own
// words when its launch fails. It is safe for concurrent use; the zero value
// is ready.
type StderrTail struct {
	mu  sync.Mutex
	buf []byte
}

// Write keeps p's bytes, dropping the oldest beyond StderrTailBytes. It never
// fails.
func (b *StderrTail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - StderrTailBytes; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// Lines returns the last StderrTailLines lines kept, without the trailing
// newline; nil when nothing was written.
func (b *StderrTail) Lines() []string {
	b.mu.Lock()
	raw := bytes.TrimSpace(b.buf)
	b.mu.Unlock()
	if len(raw) == 0 {
		return nil
	}
	ls := strings.Split(string(raw), "\n")
	if len(ls) > StderrTailLines {
		ls = ls[len(ls)-StderrTailLines:]
	}
	return ls
}

// LaunchError is a plugin binary that did not complete the go-plugin
// handshake, told in the plugin's own words (the tail of its stderr) and by
// how its process ended, rather than by go-plugin's generic guess ("not
// compiled for this architecture"). Check it with errors.As; Unwrap gives
// go-plugin's error.
type LaunchError struct {
	// Binary is the plugin's path; Args its arguments.
	Binary string
	Args   []string
	// Exit is how the process ended ("exit status 1", "signal: killed"), or
	// "" when that is not known.
	Exit string
	// Stderr holds the last lines (at most StderrTailLines) the plugin
	// wrote to stderr.
	Stderr []string
	// Err is go-plugin's handshake error.
	Err error
}

// Error gives the exit status and the stderr tail, and the first line of
// go-plugin's message only when the process did not end by itself.
func (e *LaunchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the plugin did not start (%s)", strings.Join(append([]string{e.Binary}, e.Args...), " "))
	if e.Exit != "" {
		fmt.Fprintf(&b, ": it ended with %s", e.Exit)
	}
	// A process that ended by itself explains itself on stderr, and
	// go-plugin's guess would mislead; a process still running or killed
	// after a timeout did not, so go-plugin's first line says what the
	// handshake saw.
	if e.Err != nil && (e.Exit == "" || e.Exit == "signal: killed") {
		first, _, _ := strings.Cut(e.Err.Error(), "\n")
		fmt.Fprintf(&b, "; handshake: %s", first)
	}
	if len(e.Stderr) == 0 {
		b.WriteString("; it wrote nothing to stderr")
	} else {
		b.WriteString("; its stderr ends:")
		for _, l := range e.Stderr {
			b.WriteString("\n  " + l)
		}
	}
	return b.String()
}

// Unwrap returns go-plugin's error.
func (e *LaunchError) Unwrap() error { return e.Err }
