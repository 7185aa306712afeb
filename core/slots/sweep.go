package slots

import (
	"slices"
	"time"
)

// Sweep timing defaults (docs/reconciliation.md section 6).
const (
	DefaultQuiet  = 1 * time.Second  // hints must be quiet this long before a hinted sweep
	DefaultPeriod = 30 * time.Second // a sweep runs at the latest this long after the last ended
	DefaultFloor  = 5 * time.Second  // no scheduled sweep starts sooner than this after the last ended
	PageSize      = 8                // services per page of a sweep
)

// SweepConfig sets a [Sweeper]'s timing; a zero field takes its default, a negative one counts
// as zero.
type SweepConfig struct {
	Quiet  time.Duration // default DefaultQuiet
	Period time.Duration // default DefaultPeriod
	Floor  time.Duration // default DefaultFloor
}

// Sweeper is the pure scheduling state of a level-triggered sweep (docs/reconciliation.md section
// 6): one sweep at a time; the next starts once hints have been quiet for Quiet (each hint restarts
// that wait) or Period after the previous sweep ended, whichever comes first, but never sooner
// than Floor after it ended; hints during a sweep earn exactly one follow-up; [Sweeper.Force]
// runs one at once. It reads no clock: every method takes the caller's time, which should carry
// Go's monotonic reading (time.Now), so a wall-clock step neither stalls nor spins the sweep.
//
// A Sweeper is not safe for concurrent use; the loop that owns it calls it:
//
//  1. at, ok := s.Next(); when ok, arm one timer for at (at may be in the past: fire at once);
//  2. on a hint, call s.Hint(now) and go to 1;
//  3. when the timer fires, call s.Start(now); when it returns true run the sweep, paging services
//     [PageSize] at a time with [NextPage], then call s.Finish(now), s.Wake(at) with the earliest
//     backoff end the sweep reported, and go to 1.
type Sweeper struct {
	cfg      SweepConfig
	running  bool
	ended    time.Time // when the last sweep ended, or when the Sweeper was made
	hinted   bool      // a hint arrived since the last sweep started
	hintAt   time.Time // the latest such hint
	immedAt  time.Time // when an immediate sweep was asked (first sweep, Force)
	immed    bool
	followUp bool      // a hint arrived during the running sweep
	wake     time.Time // a timer-driven sweep asked by [Sweeper.Wake]; zero for none
}

// NewSweeper returns a Sweeper whose first sweep is due at now.
func NewSweeper(cfg SweepConfig, now time.Time) *Sweeper {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
		*d = max(*d, 0)
	}
	def(&cfg.Quiet, DefaultQuiet)
	def(&cfg.Period, DefaultPeriod)
	def(&cfg.Floor, DefaultFloor)
	return &Sweeper{cfg: cfg, ended: now, immed: true, immedAt: now}
}

// Hint records a committed change at now. During a sweep it earns one follow-up sweep (however
// many hints arrive); otherwise it restarts the quiet wait.
func (s *Sweeper) Hint(now time.Time) {
	s.hinted, s.hintAt = true, now
	if s.running {
		s.followUp = true
	}
}

// Force asks for a sweep at once, without waiting out the quiet wait or the floor (the
// administrative "produce now"). It reports false when a sweep is running: the caller joins that
// one instead.
func (s *Sweeper) Force(now time.Time) bool {
	if s.running {
		return false
	}
	s.immed, s.immedAt = true, now
	return true
}

// Wake asks for a timer-driven sweep at at (the end of a failure backoff a sweep reported),
// keeping the earliest asked. It keeps the floor like every scheduled sweep; zero at does nothing.
func (s *Sweeper) Wake(at time.Time) {
	if !at.IsZero() && (s.wake.IsZero() || at.Before(s.wake)) {
		s.wake = at
	}
}

// Running reports whether a sweep is in progress.
func (s *Sweeper) Running() bool { return s.running }

// Next returns when the next sweep is due, and false while a sweep runs (its Finish decides).
func (s *Sweeper) Next() (time.Time, bool) {
	if s.running {
		return time.Time{}, false
	}
	if s.immed {
		return s.immedAt, true
	}
	at := s.ended.Add(s.cfg.Period)
	if !s.wake.IsZero() && s.wake.Before(at) {
		at = s.wake
	}
	if s.hinted {
		if q := s.hintAt.Add(s.cfg.Quiet); q.Before(at) {
			at = q
		}
	}
	if floor := s.ended.Add(s.cfg.Floor); at.Before(floor) {
		at = floor
	}
	return at, true
}

// Start begins a sweep at now when one is due, and reports whether it did; it clears the hints
// and the wake the sweep covers.
func (s *Sweeper) Start(now time.Time) bool {
	at, ok := s.Next()
	if !ok || now.Before(at) {
		return false
	}
	s.running, s.hinted, s.immed, s.followUp, s.wake = true, false, false, false, time.Time{}
	return true
}

// Finish ends the running sweep at now and reports whether a hint arrived during it, that is
// whether exactly one follow-up sweep is owed (it is then due by [Sweeper.Next]). Finish without
// a running sweep does nothing and reports false.
func (s *Sweeper) Finish(now time.Time) bool {
	if !s.running {
		return false
	}
	s.running, s.ended = false, now
	f := s.followUp
	s.followUp = false
	return f
}

// NextPage returns the page of at most size ids (size < 1: [PageSize]) that follows after in
// sorted, which must be sorted ascending ("" starts at the beginning), and the cursor of the page
// after it ("" when this page is the last). A sweep reads its services page by page in id order, so
// a service is visited exactly once per sweep.
func NextPage(sorted []string, after string, size int) ([]string, string) {
	if size < 1 {
		size = PageSize
	}
	i := 0
	if after != "" {
		i, _ = slices.BinarySearch(sorted, after)
		if i < len(sorted) && sorted[i] == after {
			i++
		}
	}
	end := min(i+size, len(sorted))
	page := sorted[i:end]
	if end < len(sorted) {
		return page, page[len(page)-1]
	}
	return page, ""
}
