// Package pluginapi holds what every Berth plugin contract shares: handshake
// values, health reports, the fields of mutating calls and the error mapping.
//
// The contracts themselves are [github.com/berthhq/berth/abi/provider],
// [github.com/berthhq/berth/abi/runtime] and [github.com/berthhq/berth/abi/network];
// docs/plugins.md describes them.
package pluginapi

import (
	"context"
	"errors"
	"strconv"
)

// MagicCookieKey is the environment variable a host sets when it launches a
// plugin (docs/plugins.md section 1.1). Its value names the plugin kind.
const MagicCookieKey = "BERTH_PLUGIN"

// Handshake cookie values, one per plugin kind: a binary of the wrong kind
// fails the handshake.
const (
	RuntimeCookieValue  = "berth-runtime-driver-3c9d2a71"
	ProviderCookieValue = "berth-provider-8e41b6f0"
	NetworkCookieValue  = "berth-node-network-5b27e0c4"
)

// Names of the plugins in go-plugin's plugin sets.
const (
	RuntimePluginName  = "runtime-driver"
	ProviderPluginName = "provider"
	NetworkPluginName  = "node-network"
)

// Kind is a plugin kind, as named in the plugin catalog.
type Kind string

// Plugin kinds.
const (
	KindProvider Kind = "provider"
	KindRuntime  Kind = "runtime"
	KindNetwork  Kind = "network" // the node network of containers (docs/plugins.md section 7)
)

// HealthState is a plugin's health, as streamed by its Health call
// (docs/plugins.md section 2.4).
type HealthState string

// Health states. Undetected means the plugin runs but what it manages cannot
// be found (a runtime without its daemon, a provider without credentials).
const (
	Healthy    HealthState = "healthy"
	Unhealthy  HealthState = "unhealthy"
	Undetected HealthState = "undetected"
)

// Valid reports whether s is one of the three health states.
func (s HealthState) Valid() bool { return s == Healthy || s == Unhealthy || s == Undetected }

// HealthReport is one entry of a plugin's health stream. Description says why
// when State is not Healthy.
type HealthReport struct {
	State       HealthState
	Description string
}

// HealthReporter is the optional interface of a plugin that reports its own
// health. Health returns a channel that carries the current health at once
// and then every change, and is closed when ctx ends. A plugin without it is
// reported healthy for as long as it answers. Called once per host
// connection; the returned channel is owned by the plugin.
type HealthReporter interface {
	Health(ctx context.Context) (<-chan HealthReport, error)
}

// Mutation identifies one mutating call. Every mutating request of a plugin
// contract embeds it (docs/plugins.md section 1.5):
//
//  1. A call whose FencingToken is lower than the highest the plugin has seen
//     for the same resource must be refused with an error of code
//     abi/errors.StaleFencingToken, changing nothing.
//  2. A call whose IdempotencyKey was seen before must return the result
//     recorded for it, changing nothing.
//
// The SDK's FenceGuard and IdempotencyStore implement both.
type Mutation struct {
	OperationID    string // the durable operation this call belongs to; may be empty
	IdempotencyKey string // empty means the call is not deduplicated
	FencingToken   uint64 // zero is the lowest token
}

// ErrPluginExited is the cause of a call cut short because the plugin
// process exited under it.
var ErrPluginExited = errors.New("berth: plugin process exited")

// Join returns ctx, also cancelled with ErrPluginExited when life ends. life
// is a plugin process's lifetime; nil means none. The returned cancel must
// be called.
func Join(ctx, life context.Context) (context.Context, context.CancelFunc) {
	if life == nil {
		return context.WithCancel(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(life, func() { cancel(ErrPluginExited) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// CallKey is the idempotency key of one mutating call a host makes of a
// plugin, derived from what the call means and nothing random, so that the
// host retrying the same call after a crash sends the same key and the
// plugin replays instead of acting twice: "<verb>/<subject>/<rev>.<attempt>",
// e.g. "start/wl_01J.../42.3". verb names the call ("start", "stop",
// "fence-stop", "attach"), subject what it acts on (a workload id), and rev
// and attempt tell apart calls meant to act again on the same subject: for
// a workload, the desired-state revision its start attempt began at and the
// attempt's number in the agent's record (docs/plugins.md section 3.4). The
// revision keeps keys unique when a record is deleted and the same id comes
// back later, at a newer revision, counting attempts from 1 again. The host
// must use a new attempt for a call whose request differs.
func CallKey(verb, subject string, rev, attempt int64) string {
	return verb + "/" + subject + "/" + strconv.FormatInt(rev, 10) + "." + strconv.FormatInt(attempt, 10)
}
