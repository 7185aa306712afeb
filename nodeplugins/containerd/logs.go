package containerd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/berthhq/berth/sdk/runtime"
)

const (
	logFollowInterval = 100 * time.Millisecond // how often Logs with Follow looks for new output
	logTrimInterval   = time.Second            // how often the trimmer looks at every workload's log
)

// Logs implements runtime.LogStreamer: it copies the workload's log file
// (what its shim appended from stdout and stderr), the last TailBytes when
// positive, and with Follow keeps copying new output until ctx ends, then
// returns nil. ErrNotFound for an unknown workload.
func (d *Driver) Logs(ctx context.Context, req *runtime.LogsRequest, w io.Writer) error {
	if d.isClosed() {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, errClosed)
	}
	c, err := d.load(ctx, req.WorkloadID)
	if err != nil {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
	}
	path := labels[LabelLogPath]
	var off int64
	if fi, err := os.Stat(path); err == nil && req.TailBytes > 0 && fi.Size() > req.TailBytes {
		off = fi.Size() - req.TailBytes
	}
	tick := time.NewTicker(logFollowInterval)
	defer tick.Stop()
	for {
		n, err := copyFrom(path, off, w)
		if err != nil {
			return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
		}
		off = n
		if !req.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// copyFrom writes the file at path from offset off to w and returns the new
// offset. A file shorter than off was trimmed: copying starts again at 0.
func copyFrom(path string, off int64, w io.Writer) (int64, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return off, nil
	}
	if err != nil {
		return off, fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return off, fmt.Errorf("stat log: %w", err)
	}
	if fi.Size() < off {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return off, fmt.Errorf("seek log: %w", err)
	}
	n, err := io.Copy(w, f)
	if err != nil {
		return off + n, fmt.Errorf("copy log: %w", err)
	}
	return off + n, nil
}

// trimLogs keeps every workload's log file near its limit until ctx ends.
func (d *Driver) trimLogs(ctx context.Context) {
	t := time.NewTicker(logTrimInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cs, err := d.client.Containers(ctx, fmt.Sprintf("labels.%q", LabelWorkload))
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("could not list workloads to trim their logs", "error", err)
			}
			continue
		}
		for _, c := range cs {
			labels, err := c.Labels(ctx)
			if err != nil {
				continue
			}
			maxBytes, err := strconv.ParseInt(labels[LabelLogMaxBytes], 10, 64)
			if err != nil || maxBytes <= 0 {
				maxBytes = DefaultLogMaxBytes
			}
			if err := trimLog(labels[LabelLogPath], maxBytes); err != nil {
				d.log.Warn("could not trim workload log", "workload", c.ID(), "error", err)
			}
		}
	}
}

// trimLog drops the oldest part of the file at path when it is larger than
// maxBytes, keeping the newest maxBytes/2 bytes from the start of a line when
// one begins in them. The shim keeps appending through its O_APPEND
// descriptor; what it writes between the read of the tail and the truncation
// is lost. A missing file is not an error.
func trimLog(path string, maxBytes int64) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
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
		return fmt.Errorf("read log: %w", err)
	}
	tail = tail[:n]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i+1 < len(tail) {
		tail = tail[i+1:]
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("truncate log: %w", err)
	}
	if _, err := f.WriteAt(tail, 0); err != nil {
		return fmt.Errorf("rewrite log: %w", err)
	}
	return nil
}
