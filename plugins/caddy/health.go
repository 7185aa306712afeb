package caddy

import (
	"context"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
)

// healthEvery is how often Health asks Caddy's admin API whether it answers.
const healthEvery = 5 * time.Second

var _ pluginapi.HealthReporter = (*Plugin)(nil)

// Health implements pluginapi.HealthReporter (docs/plugins.md section 2.4):
// healthy while Caddy's admin API answers GET /config/, undetected (with the
// reason) while it does not, since the adapter then cannot put any table in
// force. It reports at once, then every change, checking every 5 s, until
// ctx ends.
func (p *Plugin) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	ch := make(chan pluginapi.HealthReport, 1)
	go func() {
		defer close(ch)
		var last pluginapi.HealthReport
		t := time.NewTicker(healthEvery)
		defer t.Stop()
		for first := true; ; first = false {
			r := pluginapi.HealthReport{State: pluginapi.Healthy}
			if _, err := p.caddyConfig(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				r = pluginapi.HealthReport{State: pluginapi.Undetected, Description: "caddy's admin API at " + p.cfg.Admin + " does not answer: " + err.Error()}
			}
			if first || r != last {
				select {
				case ch <- r:
				case <-ctx.Done():
					return
				}
				last = r
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
