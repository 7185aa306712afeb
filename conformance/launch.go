package conformance

import (
	"errors"
	"io"
	"sync"
)

// launchCase is the first case of a suite run on a binary: it launches the
// binary once with start. When that fails, it fails with the plugin's own
// words and every later case is skipped with one line, since none can run.
func launchCase(start func(t T) error) (testCase, *launchGate) {
	g := &launchGate{}
	return testCase{name: "launch", run: func(t T) {
		if err := start(t); err != nil {
			var refused *configRefusedError
			var reset *resetError
			switch {
			case errors.As(err, &refused):
				g.fail("the plugin refused its configuration")
			case errors.As(err, &reset):
				g.fail("the reset before case launch failed")
			default:
				g.fail("the plugin did not start")
			}
			t.Fatalf("%v", err)
		}
	}}, g
}

// configRefusedError is a launch failure of a plugin that started but
// refused the configuration the suite gives every case: no case can run
// with it, so they are skipped rather than each failing the same way.
type configRefusedError struct{ err error }

func (e *configRefusedError) Error() string { return e.err.Error() }
func (e *configRefusedError) Unwrap() error { return e.err }

// resetError is a failed ProviderConfig.Reset: before launch, every later
// case is skipped, since each would need the same reset.
type resetError struct{ err error }

func (e *resetError) Error() string { return e.err.Error() }
func (e *resetError) Unwrap() error { return e.err }

// launchGate records why the launch case failed, if it did.
type launchGate struct {
	mu     sync.Mutex
	reason string
}

func (g *launchGate) fail(reason string) {
	g.mu.Lock()
	g.reason = reason
	g.mu.Unlock()
}

// failed returns the reason the launch failed, or "" when it did not.
func (g *launchGate) failed() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason
}

// gated prepends the launch case to cases and makes each of them skip when
// the launch failed.
func gated(start func(t T) error, cases []testCase) []testCase {
	lc, g := launchCase(start)
	out := []testCase{lc}
	for _, c := range cases {
		run := c.run
		out = append(out, testCase{name: c.name, run: func(t T) {
			if reason := g.failed(); reason != "" {
				t.Skipf("not run: %s (see case launch)", reason)
			}
			run(t)
		}})
	}
	return out
}

// probe launches a binary of kind k once, for the launch case, and stops it.
func probe(t T, path string, args []string, k kind, stderr io.Writer) error {
	t.Helper()
	in, err := startBinary(t, path, args, k, k.cookie, stderr)
	if err != nil {
		return err
	}
	in.client.Kill()
	return nil
}
