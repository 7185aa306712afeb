package hetzner

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// max429Retries bounds how often one request is sent again after a 429.
const max429Retries = 8

// limiter is the plugin's one rate limiter, an http.RoundTripper under the
// hcloud client. Every API call of the plugin waits for:
//
//   - a token of the steady pace (golang.org/x/time/rate), the plugin's
//     share of the project's budget;
//   - the end of a pause: a 429, or an answer saying the budget is empty
//     (RateLimit-Remaining: 0), pauses every caller until the moment its
//     RateLimit-Reset names;
//   - room in the budget: no more requests are in flight than the last
//     answer's RateLimit-Remaining allows, and while the budget is unknown
//     (at the start, after a pause) one request goes first to learn it.
//
// A request answered 429 was not carried out and is sent again after the
// pause. Safe for concurrent use.
type limiter struct {
	base http.RoundTripper
	pace *rate.Limiter
	log  *slog.Logger
	now  func() time.Time

	mu        sync.Mutex
	until     time.Time     // calls wait until then; mu must be held
	known     bool          // remaining holds the last answer's budget; mu must be held
	remaining int           // mu must be held
	window    int64         // the RateLimit-Reset that remaining came with; mu must be held
	inflight  int           // requests sent and not answered; mu must be held
	changed   chan struct{} // closed and replaced at every change; mu must be held
}

func newLimiter(base http.RoundTripper, perHour, burst int, log *slog.Logger) *limiter {
	return &limiter{
		base: base, pace: rate.NewLimiter(rate.Limit(float64(perHour)/3600), burst),
		log: log, now: time.Now, changed: make(chan struct{}),
	}
}

// PausedUntil returns the end of the current pause (zero when none) and a
// channel closed at the next change.
func (l *limiter) PausedUntil() (time.Time, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.until.After(l.now()) {
		return time.Time{}, l.changed
	}
	return l.until, l.changed
}

// RoundTrip implements http.RoundTripper.
func (l *limiter) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if err := l.pace.Wait(ctx); err != nil {
			return nil, fmt.Errorf("waiting for this plugin's share of the Hetzner API budget: %w", ctxErr(ctx, err))
		}
		if err := l.admit(ctx); err != nil {
			return nil, err
		}
		r := req
		if attempt > 0 {
			r = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, fmt.Errorf("resend after a 429: %w", err)
				}
				r.Body = body
			}
		}
		resp, err := l.base.RoundTrip(r)
		if err != nil {
			l.done(nil)
			return nil, err
		}
		l.done(resp)
		if resp.StatusCode != http.StatusTooManyRequests || attempt >= max429Retries || (req.Body != nil && req.GetBody == nil) {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}
}

// ctxErr prefers ctx's own error, so that a deadline stays matchable.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// admit returns when the request may go, counted in flight, or with ctx's
// error.
func (l *limiter) admit(ctx context.Context) error {
	for {
		l.mu.Lock()
		now := l.now()
		if !l.until.After(now) && !l.until.IsZero() {
			// The pause is over: the budget is full again, but learn it anew.
			l.until, l.known = time.Time{}, false
		}
		until, changed := l.until, l.changed
		ok := until.IsZero() && ((l.known && l.inflight < l.remaining) || (!l.known && l.inflight == 0))
		if ok {
			l.inflight++
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		var timer *time.Timer
		var fired <-chan time.Time
		if !until.IsZero() {
			timer = time.NewTimer(until.Sub(now))
			fired = timer.C
		}
		var err error
		select {
		case <-ctx.Done():
			err = fmt.Errorf("waiting for room in the Hetzner API budget: %w", ctx.Err())
			if !until.IsZero() {
				err = fmt.Errorf("waiting for the Hetzner API rate limit to reset at %s: %w", until.UTC().Format(time.RFC3339), ctx.Err())
			}
		case <-changed:
		case <-fired:
		}
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// done ends a request in flight: it reads the rate-limit headers of its
// answer (nil: none came) and starts a pause on a 429 or an empty budget.
func (l *limiter) done(resp *http.Response) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	defer l.signalLocked()
	if resp == nil {
		return
	}
	remaining, errR := strconv.Atoi(resp.Header.Get("RateLimit-Remaining"))
	reset, errS := strconv.ParseInt(resp.Header.Get("RateLimit-Reset"), 10, 64)
	if errR == nil {
		// Answers arrive out of order: the one with the later reset is the
		// newer; within one reset, the budget only shrinks.
		switch {
		case !l.known || errS != nil || reset > l.window:
			l.known, l.remaining, l.window = true, remaining, reset
		case reset == l.window:
			l.remaining = min(l.remaining, remaining)
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests && (errR != nil || remaining > 0) {
		return
	}
	now := l.now()
	until := now.Add(time.Second) // without a usable header: a short pause
	if errS == nil && reset > 0 && time.Unix(reset, 0).After(now) {
		until = time.Unix(reset, 0)
	}
	if !until.After(l.until) {
		return
	}
	if !l.until.After(now) {
		l.log.Warn("hetzner API rate limit reached: every call waits for the reset",
			"status", resp.StatusCode, "remaining", resp.Header.Get("RateLimit-Remaining"),
			"reset", until.UTC().Format(time.RFC3339), "wait", until.Sub(now).Round(time.Second).String())
	}
	l.until = until
}

// signalLocked wakes every waiter. mu must be held.
func (l *limiter) signalLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}
