package placement

import (
	"context"
	"log/slog"
	"time"
)

// DefaultPassInterval is the period of [Service.Run] when it is given zero.
const DefaultPassInterval = 5 * time.Second

// Run reassigns placements ([Service.Pass]: failover, waiting capacity, returning stateful
// nodes), releases orphaned reservations and sweeps expired operation leases of the queue the
// Service was made with, every interval (zero: DefaultPassInterval) until ctx ends. A failed step
// is logged and the next round goes on. Every step is a compare-and-set, so several berthd
// processes may run it at once.
func (s *Service) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	if interval <= 0 {
		interval = DefaultPassInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.Pass(ctx); err != nil && ctx.Err() == nil {
			log.Warn("placement pass", "err", err)
		}
		if s.ops == nil {
			continue
		}
		if n, err := s.ops.Sweep(ctx); err != nil && ctx.Err() == nil {
			log.Warn("operation sweep", "err", err)
		} else if n > 0 {
			log.Info("expired operation leases swept", "count", n)
		}
	}
}
