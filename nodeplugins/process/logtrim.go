package process

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// startTrimmer starts the goroutine that keeps r's log file bounded and returns
// the function that ends it. It also ends with the driver's life.
func (d *Driver) startTrimmer(r record) context.CancelFunc {
	ctx, cancel := context.WithCancel(d.life)
	d.trimmers.Add(1)
	go func() {
		defer d.trimmers.Done()
		t := time.NewTicker(logCheckInterval)
		defer t.Stop()
		for {
			if err := trimLog(r.LogPath, r.LogMaxBytes); err != nil {
				d.log.Warn("could not trim workload log", "workload", r.WorkloadID, "path", r.LogPath, "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return cancel
}

// trimLog drops the oldest part of the file at path when it is larger than
// maxBytes, keeping the newest maxBytes/2 bytes from the start of a line when
// one begins in them. The workload keeps appending through its own O_APPEND
// descriptor; what it writes between the read of the tail and the truncation
// is lost. A missing file is not an error.
func trimLog(path string, maxBytes int64) error {
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
