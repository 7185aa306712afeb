package containerd

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/berthhq/berth/internal/logtrim"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

const (
	logFollowInterval = 100 * time.Millisecond // how often Logs with Follow looks for new output
	logTrimInterval   = time.Second            // how often the trimmer looks at every workload's log
)

// Logs implements runtime.LogStreamer: it copies the workload's log file
// (what its shim appended from stdout and stderr), the last TailBytes when
// positive, and with Follow keeps copying new output until ctx ends, then
// returns nil; a workload with a log writer has its records rendered instead
// (logwriter.Render). ErrNotFound for an unknown workload.
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
	if dir := labels[LabelLogDir]; dir != "" {
		return logwriter.Render(ctx, req, dir, w)
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
			if labels[LabelLogDir] != "" {
				continue // the log writer bounds its own disk
			}
			maxBytes, err := strconv.ParseInt(labels[LabelLogMaxBytes], 10, 64)
			if err != nil || maxBytes <= 0 {
				maxBytes = DefaultLogMaxBytes
			}
			if err := logtrim.Trim(labels[LabelLogPath], maxBytes); err != nil {
				d.log.Warn("could not trim workload log", "workload", c.ID(), "error", err)
			}
		}
	}
}
