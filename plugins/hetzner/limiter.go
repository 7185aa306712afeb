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
// hcloud client: every API call of the plugin waits for a token of the
// steady pace, and for the end of a pause. A 429, or an answer saying the
// budget is empty (RateLimit-Remaining: 0), pauses every caller until the
// moment its RateLimit-Reset names; a request answered 429 was not carried
// out and is sent again after the pause. Safe for concurrent use.
type limiter struct {
	base http.RoundTripper
	pace *rate.Limiter
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	until   time.Time     // calls wait until then; mu must be held
	changed chan struct{} // closed and replaced when until changes; mu must be held
	pauses  int           // pauses begun, for tests and logs
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
		if err := l.waitPause(ctx); err != nil {
			return nil, err
		}
		if err := l.pace.Wait(ctx); err != nil {
			return nil, fmt.Errorf("waiting for this plugin's share of the Hetzner API budget: %w", ctxErr(ctx, err))
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
			return nil, err
		}
		l.observe(resp)
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

// waitPause returns when no pause is on, or with ctx's error.
func (l *limiter) waitPause(ctx context.Context) error {
	for {
		until, _ := l.PausedUntil()
		d := until.Sub(l.now())
		if until.IsZero() || d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the Hetzner API rate limit to reset at %s: %w", until.UTC().Format(time.RFC3339), ctx.Err())
		case <-t.C:
		}
	}
}

// observe reads the rate-limit headers of an answer and starts a pause on
// a 429 or an empty budget.
func (l *limiter) observe(resp *http.Response) {
	remaining, errR := strconv.Atoi(resp.Header.Get("RateLimit-Remaining"))
	empty := errR == nil && remaining <= 0
	if resp.StatusCode != http.StatusTooManyRequests && !empty {
		return
	}
	until := l.now().Add(time.Second) // without a usable header: a short pause
	if reset, err := strconv.ParseInt(resp.Header.Get("RateLimit-Reset"), 10, 64); err == nil && reset > 0 {
		until = time.Unix(reset, 0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !until.After(l.until) {
		return
	}
	started := !l.until.After(l.now())
	l.until = until
	close(l.changed)
	l.changed = make(chan struct{})
	if started {
		l.pauses++
		l.log.Warn("hetzner API rate limit reached: every call waits for the reset",
			"status", resp.StatusCode, "remaining", resp.Header.Get("RateLimit-Remaining"),
			"reset", until.UTC().Format(time.RFC3339), "wait", until.Sub(l.now()).Round(time.Second).String())
	}
}
