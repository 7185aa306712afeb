package api

import (
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
)

// LoginLimit bounds the login attempts of one client address (docs/api.md section 9.2).
type LoginLimit struct {
	// PerSecond is how many attempts a second one address earns back; zero or negative means
	// DefaultLoginLimit's.
	PerSecond float64
	// Burst is how many attempts one address may make at once; zero or negative means
	// DefaultLoginLimit's.
	Burst int
}

// DefaultLoginLimit lets one address make 10 login attempts at once and one a second after.
var DefaultLoginLimit = LoginLimit{PerSecond: 1, Burst: 10}

// maxLoginSources bounds the addresses whose login attempts are tracked at once.
const maxLoginSources = 10_000

// loginSources holds one token bucket per client address. Safe for concurrent use.
type loginSources struct {
	limit LoginLimit
	now   func() time.Time
	mu    sync.Mutex
	by    map[string]*rate.Limiter // mu
}

func newLoginSources(limit LoginLimit, now func() time.Time) *loginSources {
	if limit.PerSecond <= 0 {
		limit.PerSecond = DefaultLoginLimit.PerSecond
	}
	if limit.Burst <= 0 {
		limit.Burst = DefaultLoginLimit.Burst
	}
	return &loginSources{limit: limit, now: now, by: map[string]*rate.Limiter{}}
}

// allow takes one attempt from source's bucket and returns 0, or how long until the bucket
// holds one when it is empty. At maxLoginSources addresses, full buckets (addresses idle long
// enough to have earned their burst back) are dropped first, then arbitrary ones.
func (l *loginSources) allow(source string) time.Duration {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.by[source]
	if !ok {
		if len(l.by) >= maxLoginSources {
			l.evictLocked(now)
		}
		lim = rate.NewLimiter(rate.Limit(l.limit.PerSecond), l.limit.Burst)
		l.by[source] = lim
	}
	if lim.AllowN(now, 1) {
		return 0
	}
	missing := 1 - lim.TokensAt(now)
	return time.Duration(missing / l.limit.PerSecond * float64(time.Second))
}

// evictLocked frees room for a new address. mu must be held.
func (l *loginSources) evictLocked(now time.Time) {
	for k, lim := range l.by {
		if lim.TokensAt(now) >= float64(l.limit.Burst) {
			delete(l.by, k)
		}
	}
	for k := range l.by {
		if len(l.by) < maxLoginSources {
			return
		}
		delete(l.by, k)
	}
}

// loginSource is the address a login is counted against: the connection's peer (headers such
// as X-Forwarded-For are anyone's to write), an IPv6 peer by its /64.
func loginSource(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// throttled answers 429 with code and Retry-After: wait, in whole seconds, at least 1.
func throttled(c echo.Context, code abierrors.Code, msg string, wait time.Duration) error {
	secs := max(int64(math.Ceil(wait.Seconds())), 1)
	c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return problem(code, msg)
}

// loginThrottled maps a login refused before verification to its 429; nil for other errors.
func loginThrottled(c echo.Context, err error) error {
	var te *identity.LoginThrottledError
	if !errors.As(err, &te) {
		return nil
	}
	if errors.Is(te.Err, identity.ErrLoginBackoff) {
		return throttled(c, abierrors.LoginBackoff, "too many failed logins for this name; retry after Retry-After", te.RetryAfter)
	}
	return throttled(c, abierrors.LoginBusy, "too many logins are being verified; retry after Retry-After", te.RetryAfter)
}
