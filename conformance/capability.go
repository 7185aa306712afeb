package conformance

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// ProviderCapabilities are the provider capabilities that gate a case of
// the provider suite: a plugin that does not advertise one has that case
// skipped, and naming it in ProviderConfig.RequireCapabilities (the CLI's
// --require-capability) turns the skip into a failure (docs/plugins.md 6.3).
var ProviderCapabilities = []string{"durable_state"}

// RuntimeCapabilities are the runtime-driver capabilities that gate a case
// of the runtime suite, as [ProviderCapabilities] for providers.
var RuntimeCapabilities = []string{"outlives_driver", "logs", "stats"}

// checkRequired refuses a required capability no case of the suite is gated
// on: asking for one the suite cannot check would pass silently.
func checkRequired(suite string, required, known []string) error {
	for _, c := range required {
		if !slices.Contains(known, c) {
			return fmt.Errorf("conformance: capability %q is not one the %s suite checks; want one of %s", c, suite, strings.Join(known, ", "))
		}
	}
	return nil
}

// capabilityMarker is a T that records the capability its case was skipped
// (or failed) for: the report's runner and the subtest wrapper of go test.
type capabilityMarker interface {
	markCapability(name string)
}

// needCapability ends the case when the plugin does not advertise
// capability name: skipped, naming it, or failed when required lists it.
func needCapability(t T, required []string, name string, advertised bool) {
	t.Helper()
	if advertised {
		return
	}
	if m, ok := t.(capabilityMarker); ok {
		m.markCapability(name)
	}
	if slices.Contains(required, name) {
		t.Fatalf("capability %s is required (--require-capability %s) but the plugin does not advertise it", name, name)
	}
	t.Skipf("capability %s not advertised (--require-capability %s makes this a failure)", name, name)
}

// recT is the T of a subtest under go test: the *testing.T, recording what
// the report needs of the case (its messages and the capability it wanted).
type recT struct {
	*testing.T
	msgs       []string
	capability string
}

func (r *recT) Logf(format string, args ...any) {
	r.T.Helper()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.T.Logf(format, args...)
}

func (r *recT) Errorf(format string, args ...any) {
	r.T.Helper()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.T.Errorf(format, args...)
}

func (r *recT) Fatalf(format string, args ...any) {
	r.T.Helper()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.T.Fatalf(format, args...)
}

func (r *recT) Skipf(format string, args ...any) {
	r.T.Helper()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
	r.T.Skipf(format, args...)
}

func (r *recT) markCapability(name string) { r.capability = name }

// result is the case's outcome once its function has returned or ended.
func (r *recT) result(name string, took time.Duration) Result {
	st := Passed
	switch {
	case r.T.Failed():
		st = Failed
	case r.T.Skipped():
		st = Skipped
	}
	return Result{Name: name, Status: st, Messages: slices.Clone(r.msgs), Duration: took, Capability: r.capability}
}
