package conformance

import (
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
			g.fail()
			t.Fatalf("%v", err)
		}
	}}, g
}

// launchGate records whether the launch case failed.
type launchGate struct {
	mu     sync.Mutex
	failed bool
}

func (g *launchGate) fail() {
	g.mu.Lock()
	g.failed = true
	g.mu.Unlock()
}

func (g *launchGate) ok() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.failed
}

// gated prepends the launch case to cases and makes each of them skip when
// the launch failed.
func gated(start func(t T) error, cases []testCase) []testCase {
	lc, g := launchCase(start)
	out := []testCase{lc}
	for _, c := range cases {
		run := c.run
		out = append(out, testCase{name: c.name, run: func(t T) {
			if !g.ok() {
				t.Skipf("not run: the plugin did not start (see case launch)")
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
