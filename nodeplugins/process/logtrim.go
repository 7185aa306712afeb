package process

import (
	"context"
	"time"

	"github.com/berthhq/berth/internal/logtrim"
)

// startTrimmer starts the goroutine that keeps r's log file bounded and returns
// the function that ends it. It also ends with the driver's life.
// A workload whose output goes to a log writer has no trimmer: the writer
// bounds its own directory (it returns a no-op).
func (d *Driver) startTrimmer(r record) context.CancelFunc {
	if r.LogDir != "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(d.life)
	d.trimmers.Add(1)
	go func() {
		defer d.trimmers.Done()
		t := time.NewTicker(logCheckInterval)
		defer t.Stop()
		for {
			if err := logtrim.Trim(r.LogPath, r.LogMaxBytes); err != nil {
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
