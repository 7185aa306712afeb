// Package logtrim keeps a workload's output file bounded for the runtime
// drivers that write output to a file the workload itself appends to.
package logtrim

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Trim drops the oldest part of the file at path when it is larger than
// maxBytes, keeping the newest maxBytes/2 bytes from the start of a line when
// one begins in them. The writer (a workload or a container shim) keeps
// appending through its own O_APPEND descriptor; what it writes between the
// read of the tail and the truncation is lost. An empty path or a missing
// file is not an error.
func Trim(path string, maxBytes int64) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat log: %w", err)
	}
	size := fi.Size()
	if size <= maxBytes {
		return nil
	}
	keep := maxBytes / 2
	tail := make([]byte, keep)
	n, err := f.ReadAt(tail, size-keep)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read log tail: %w", err)
	}
	tail = tail[:n]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i+1 < len(tail) {
		tail = tail[i+1:]
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("truncate log: %w", err)
	}
	// Appending (rather than writing at offset 0) never overwrites what the
	// workload wrote since the truncation.
	af, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("reopen log: %w", err)
	}
	defer af.Close()
	if _, err := af.Write(tail); err != nil {
		return fmt.Errorf("write log tail: %w", err)
	}
	return nil
}
