package proctest

import (
	"testing"
	"time"
)

// WaitFor is WaitForEvery polling every 100 ms.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	WaitForEvery(t, timeout, 100*time.Millisecond, what, cond)
}

// WaitForEvery calls cond every interval until it reports true, and fails t once timeout has
// passed, naming what was awaited and the last state cond described.
func WaitForEvery(t testing.TB, timeout, interval time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(interval)
	}
}
