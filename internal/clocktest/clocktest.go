// Package clocktest provides a manual clock for tests of code that takes a now func: time moves
// only when the test says so, so tests of expiry and backoff need no sleeps.
package clocktest

import (
	"sync"
	"time"
)

// Clock is a manual clock. The zero value is not usable; use [New]. Safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock showing start.
func New(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
