package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/identity"
)

// verifyGate is a verification hook that counts verifications, records how many ran at once
// and holds each one until released.
type verifyGate struct {
	mu                      sync.Mutex
	running, most, verified int
	entered                 chan struct{}
	release                 chan struct{}
}

func newVerifyGate() *verifyGate {
	g := &verifyGate{entered: make(chan struct{}, 256), release: make(chan struct{})}
	close(g.release) // open until hold is called
	return g
}

// hold makes the next verifications wait for the returned release func.
func (g *verifyGate) hold() func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{})
	g.release = ch
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (g *verifyGate) hook(ctx context.Context) {
	g.mu.Lock()
	g.running++
	g.verified++
	g.most = max(g.most, g.running)
	release := g.release
	g.mu.Unlock()
	g.entered <- struct{}{}
	select {
	case <-release:
	case <-ctx.Done():
	}
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
}

func (g *verifyGate) counts() (verified, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.verified, g.most
}

// loginFixture is an identity fixture whose password verifications go through gate and whose
// logins run at most concurrency verifications at once.
func loginFixture(t *testing.T, concurrency int, gate *verifyGate, change func(*Config)) *fixture {
	t.Helper()
	clk := &fakeClock{t: time.Now()}
	f := newFixtureWith(t, func(c *Config) {
		c.Tokens = testTokens(storeOf(c), identity.WithClock(clk.now),
			identity.WithLoginConcurrency(concurrency), identity.WithVerifyHookForTest(gate.hook))
		c.Now = clk.now
		if change != nil {
			change(c)
		}
	})
	f.clock = clk
	if code, out := f.as(f.admin, "POST", "/api/v1/users", map[string]any{"name": "carol", "password": testPassword}); code != 201 {
		t.Fatalf("create carol: %d %v", code, out)
	}
	return f
}

// generousSources lets the tests of other limits make all their attempts from one address.
func generousSources(c *Config) { c.LoginLimit = LoginLimit{PerSecond: 1000, Burst: 1000} }

type loginAnswer struct {
	code       int
	problem    string
	retryAfter string
}

// tryLogin posts one login and returns its status, problem code and Retry-After.
func (f *fixture) tryLogin(name, password string) loginAnswer {
	raw, _ := json.Marshal(map[string]string{"name": name, "password": password})
	resp, err := http.Post(f.srv.URL+"/api/v1/login", "application/json", bytes.NewReader(raw))
	if err != nil {
		return loginAnswer{code: -1, problem: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(body, &out)
	c, _ := out["code"].(string)
	return loginAnswer{code: resp.StatusCode, problem: c, retryAfter: resp.Header.Get("Retry-After")}
}

// waitEntered waits until n verifications have entered the gate, for at most 30 s.
func (g *verifyGate) waitEntered(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case <-g.entered:
		case <-timeout:
			t.Fatalf("fewer than %d verifications started within 30 s", n)
		}
	}
}

func wantThrottled(t *testing.T, what string, a loginAnswer, code string) {
	t.Helper()
	if n, err := strconv.Atoi(a.retryAfter); a.code != 429 || a.problem != code || err != nil || n < 1 {
		t.Errorf("%s: %d %s Retry-After %q; want 429 %s with Retry-After in whole seconds", what, a.code, a.problem, a.retryAfter, code)
	}
}

// TestLoginVerificationsBounded: parallel logins never run more password verifications at
// once than the bound, unknown names included; the excess is answered 429 login_busy with
// Retry-After at once, without a verification. Before, every attempt verified at once (64 MiB
// of argon2id each).
func TestLoginVerificationsBounded(t *testing.T) {
	t.Parallel()
	gate := newVerifyGate()
	f := loginFixture(t, 2, gate, generousSources)
	release := gate.hold()
	t.Cleanup(release) // a failed test must not leave verifications held
	const n = 8
	answers := make(chan loginAnswer, n)
	for i := range n {
		name := "carol"
		if i%2 == 1 {
			name = "nobody-" + strconv.Itoa(i) // unknown names take a slot too
		}
		go func() { answers <- f.tryLogin(name, "not the password, not at all") }()
	}
	gate.waitEntered(t, 2)
	// With two verifications held, every other attempt is answered without waiting for them.
	for range n - 2 {
		select {
		case a := <-answers:
			wantThrottled(t, "an attempt beyond the bound", a, "login_busy")
		case <-time.After(30 * time.Second):
			t.Fatalf("an attempt beyond the bound was not answered while the bound was full")
		}
	}
	release()
	for range 2 {
		if a := <-answers; a.code != 401 || a.problem != "unauthenticated" {
			t.Errorf("a verified wrong password: %+v; want 401 unauthenticated", a)
		}
	}
	if verified, most := gate.counts(); verified != 2 || most != 2 {
		t.Fatalf("%d verifications ran, at most %d at once; want 2 and 2", verified, most)
	}
	// Freed slots serve the next login, the right password included.
	if a := f.tryLogin("carol", testPassword); a.code != 200 {
		t.Fatalf("login once the slots are free: %+v", a)
	}
}

// TestLoginBackoffRefusesBeforeVerifying: once a name failed 10 times within a minute, an
// attempt before its next one is due is answered 429 login_backoff with Retry-After and
// verifies nothing, the right password included; when it is due exactly one of several
// parallel attempts is verified. Before, each attempt slept its delay and then verified, so
// parallel guessers multiplied the guesses the backoff allows.
func TestLoginBackoffRefusesBeforeVerifying(t *testing.T) {
	t.Parallel()
	gate := newVerifyGate()
	f := loginFixture(t, 8, gate, generousSources)
	for i := range identity.LoginFailuresFree {
		if a := f.tryLogin("carol", "a wrong guess number "+strconv.Itoa(i)); a.code != 401 {
			t.Fatalf("free failure %d: %+v", i, a)
		}
	}
	before, _ := gate.counts()
	wantThrottled(t, "a guess during the backoff", f.tryLogin("carol", "one more wrong guess"), "login_backoff")
	wantThrottled(t, "the right password during the backoff", f.tryLogin("carol", testPassword), "login_backoff")
	if after, _ := gate.counts(); after != before {
		t.Fatalf("%d verifications ran during the backoff; want none", after-before)
	}
	// Another name is not held back.
	if a := f.tryLogin("nobody", "a guess for another name"); a.code != 401 {
		t.Fatalf("another name during carol's backoff: %+v", a)
	}

	f.clock.add(time.Second)
	before, _ = gate.counts()
	const n = 6
	answers := make(chan loginAnswer, n)
	for range n {
		go func() { answers <- f.tryLogin("carol", "parallel wrong guess") }()
	}
	throttled := 0
	for range n {
		a := <-answers
		switch {
		case a.code == 401:
		case a.code == 429 && a.problem == "login_backoff":
			throttled++
		default:
			t.Errorf("a parallel guess when due: %+v", a)
		}
	}
	if after, _ := gate.counts(); after-before != 1 || throttled != n-1 {
		t.Fatalf("%d parallel guesses when due: %d verified, %d refused; want 1 and %d", n, after-before, throttled, n-1)
	}
	// The right password logs in once its turn comes, and clears the count.
	f.clock.add(identity.MaxLoginDelay)
	if a := f.tryLogin("carol", testPassword); a.code != 200 {
		t.Fatalf("the right password when due: %+v", a)
	}
	if a := f.tryLogin("carol", "wrong again, but the count was cleared"); a.code != 401 {
		t.Fatalf("a failure after a success: %+v", a)
	}
}

// TestLoginPerSourceLimit: one client address gets a burst of attempts, then 429
// login_rate_limited with Retry-After, before anything is verified.
func TestLoginPerSourceLimit(t *testing.T) {
	t.Parallel()
	gate := newVerifyGate()
	f := loginFixture(t, 8, gate, func(c *Config) { c.LoginLimit = LoginLimit{PerSecond: 0.5, Burst: 3} })
	for i := range 3 {
		if a := f.tryLogin("nobody-"+strconv.Itoa(i), "a guess"); a.code != 401 {
			t.Fatalf("attempt %d within the burst: %+v", i, a)
		}
	}
	before, _ := gate.counts()
	wantThrottled(t, "an attempt beyond the source's burst", f.tryLogin("carol", testPassword), "login_rate_limited")
	if after, _ := gate.counts(); after != before {
		t.Fatalf("a rate-limited attempt ran a verification")
	}
	f.clock.add(2 * time.Second) // one attempt earned back
	if a := f.tryLogin("carol", testPassword); a.code != 200 {
		t.Fatalf("an attempt once the source earned one back: %+v", a)
	}
}
