package pluginapi

import (
	"context"
	"fmt"

	pluginv1 "github.com/berthhq/berth/abi/proto/plugin/v1"
)

// ServeHealth is the server side of a Health stream: it sends impl's reports
// (or one Healthy report when impl is not a [HealthReporter]) until ctx ends,
// and returns nil then. A report with an invalid state is sent as Unhealthy
// naming the bug. Used by the SDK's gRPC servers.
func ServeHealth(ctx context.Context, impl any, send func(*pluginv1.HealthReport) error) error {
	hr, ok := impl.(HealthReporter)
	if !ok {
		if err := send(&pluginv1.HealthReport{State: string(Healthy)}); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	ch, err := hr.Health(ctx)
	if err != nil {
		return ToStatus(fmt.Errorf("health: %w", err))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r, ok := <-ch:
			if !ok {
				<-ctx.Done()
				return nil
			}
			if !r.State.Valid() {
				r = HealthReport{State: Unhealthy, Description: fmt.Sprintf("plugin reported invalid health state %q", r.State)}
			}
			if err := send(&pluginv1.HealthReport{State: string(r.State), Description: r.Description}); err != nil {
				return err
			}
		}
	}
}

// HealthStream is the client side of a Health stream.
type HealthStream interface {
	Recv() (*pluginv1.HealthReport, error)
}

// RecvHealth turns a Health stream into a channel, closed when the stream
// ends (the plugin exited or ctx of the call ended). The host uses it.
func RecvHealth(s HealthStream) <-chan HealthReport {
	ch := make(chan HealthReport, 1)
	go func() {
		defer close(ch)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			ch <- HealthReport{State: HealthState(r.GetState()), Description: r.GetDescription()}
		}
	}()
	return ch
}

// WatchHealth opens a plugin's Health stream with open, under ctx joined with life (the plugin
// process's lifetime, see [Join]), and returns its reports on a channel closed when ctx ends,
// the plugin exits or the stream ends. what names the call in errors ("runtime driver: health").
// It is the client side every plugin contract shares.
func WatchHealth(ctx, life context.Context, what string, open func(context.Context) (HealthStream, error)) (<-chan HealthReport, error) {
	ctx, cancel := Join(ctx, life)
	stream, err := open(ctx)
	if err != nil {
		cancel()
		return nil, FromStatus(ctx, what, err)
	}
	ch := RecvHealth(stream)
	out := make(chan HealthReport)
	go func() {
		defer cancel()
		defer close(out)
		for r := range ch {
			select {
			case out <- r:
			case <-ctx.Done():
				for range ch { // the stream ends with ctx; drain so its reader exits
				}
				return
			}
		}
	}()
	return out, nil
}

// APIVersions converts the wire's API versions to ints.
func APIVersions(v []int32) []int {
	var out []int
	for _, x := range v {
		out = append(out, int(x))
	}
	return out
}
