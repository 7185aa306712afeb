package ui_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/ui"
	"github.com/berthhq/berth/sdk/client"
)

// Values the tests plant and then look for in every page: none may ever be rendered.
const (
	envSecret    = "env-value-that-must-not-render-7f3a"
	secretValue  = "secret-value-that-must-not-render-91c2"
	userPassword = "correct horse battery staple, twenty+"
)

// nopHinter drops the API's reconcile hints: no reconciler runs in these tests.
type nopHinter struct{}

func (nopHinter) Hint(string) {}

// fixture is a real API (core/api over the embedded store) with the dashboard in front of it,
// served the way berthd serves them: one handler, the dashboard under /ui/.
type fixture struct {
	srv   *httptest.Server
	reg   *prometheus.Registry
	admin string
	cat   *services.Catalog
	st    *store.Store
	// rels is the API's image release store (the registry's record of pushes).
	rels *registry.Releases
}

func newFixture(t *testing.T, useTLS bool) *fixture { return newFixtureWith(t, useTLS, nil) }

// newFixtureWith is newFixture with a change to the dashboard's configuration.
func newFixtureWith(t *testing.T, useTLS bool, change func(*ui.Config)) *fixture {
	t.Helper()
	return newFixtureAPI(t, useTLS, change, nil)
}

// newFixtureAPI is newFixtureWith with a change to the API's configuration as well, made
// with the fixture's store and bundle store before the API is built.
func newFixtureAPI(t *testing.T, useTLS bool, change func(*ui.Config), apiChange func(*store.Store, *bundles.Store, *api.Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	ctx := context.Background()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	tokens := identity.NewTokens(st, identity.WithArgon2Params(identity.Argon2Params{Memory: 64, Time: 1, Threads: 1, KeyLen: 32, SaltLen: 16}))
	_, admin, err := tokens.EnsureAdmin(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(dir, "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rels := registry.NewReleases(st, nil)
	ops := operations.NewQueue(st, operations.Config{})
	if err := ops.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	runnerReg := runners.NewRegistry(st, runners.Config{})
	orch := &api.Orchestration{Leases: leases.NewManager(st, leases.Config{Owner: "brd_ui_test"}), Runners: runnerReg,
		Operations: ops, Placement: placement.NewService(st, runnerReg, ops)}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(dir, secrets.KeyringFile), true)
	if err != nil {
		t.Fatal(err)
	}
	apiCfg := api.Config{Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: nopHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Changelog: changelog.New(st, 1, nil),
		Secrets:       &api.SecretsConfig{Store: secrets.NewStore(st, kr, nil)},
		ImageReleases: rels,
		Runtime:       rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Certificates: certs.NewStatusReader(st), DNSRecords: dnsrecords.NewReader(st),
		Orchestration: orch}
	if apiChange != nil {
		apiChange(st, bs, &apiCfg)
	}
	apiSrv := api.New(apiCfg)
	mreg := prometheus.NewRegistry()
	cfg := ui.Config{API: apiSrv, StreamInterval: 50 * time.Millisecond, Metrics: mreg}
	if change != nil {
		change(&cfg)
	}
	dash := ui.New(cfg)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ui.Owns(r.URL.Path) {
			dash.ServeHTTP(w, r)
			return
		}
		apiSrv.ServeHTTP(w, r)
	})
	var srv *httptest.Server
	if useTLS {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	f := &fixture{srv: srv, admin: admin, cat: cat, reg: mreg, st: st, rels: rels}
	f.seed(t)
	return f
}

// seed writes a service whose environment holds envSecret, a secret holding secretValue,
// and a human user with userPassword.
func (f *fixture) seed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	p, _, err := f.cat.EnsureProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	svc := &services.Service{Name: "web", Bundle: "web", BundleDigest: "sha256:" + strings.Repeat("ab", 32),
		Command: []string{"./web"}, Env: map[string]string{"DB_PASSWORD": envSecret}, Replicas: 1, Port: 8080}
	if _, _, err := f.cat.PutService(ctx, p, svc, nil); err != nil {
		t.Fatal(err)
	}
	c := f.api(t, f.admin)
	if _, err := c.PutSecret(ctx, "default", "db-password", []byte(secretValue)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateUser(ctx, client.NewUser{Name: "ops", Roles: []string{"admin"}, Password: userPassword}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) api(t *testing.T, token string) *client.Client {
	t.Helper()
	c, err := client.New(f.srv.URL, client.WithToken(token), client.WithHTTPClient(f.srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// browser is a cookie-keeping HTTP client that does not follow redirects.
func (f *fixture) browser(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	hc := *f.srv.Client()
	hc.Jar = jar
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	hc.Timeout = 30 * time.Second
	return &hc
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// get fetches path and returns the answer and its body.
func get(t *testing.T, hc *http.Client, base, path string) (*http.Response, string) {
	t.Helper()
	resp, err := hc.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func post(t *testing.T, hc *http.Client, base, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	resp, err := hc.PostForm(base+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login logs hc in with form fields (plus the login page's CSRF token) and returns the answer.
func login(t *testing.T, hc *http.Client, base string, form url.Values) (*http.Response, string) {
	t.Helper()
	_, body := get(t, hc, base, "/ui/login")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the login page has no CSRF field:\n%s", body)
	}
	form.Set("csrf", m[1])
	return post(t, hc, base, "/ui/login", form)
}

// TestPagesCarryCSPAndRenderNoSecret logs in with a password and with a token, opens every
// page and asset, and checks each answer carries the Content-Security-Policy and no page
// shows a secret value, an environment value or the session's bearer.
func TestPagesCarryCSPAndRenderNoSecret(t *testing.T) {
	f := newFixture(t, false)
	for _, how := range []string{"password", "token"} {
		t.Run(how, func(t *testing.T) {
			hc := f.browser(t)
			form := url.Values{"name": {"ops"}, "password": {userPassword}}
			if how == "token" {
				form = url.Values{"token": {f.admin}}
			}
			resp, body := login(t, hc, f.srv.URL, form)
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
				t.Fatalf("login answered %d (Location %q):\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
			}
			var bearer string
			for _, c := range resp.Cookies() {
				if c.Name == "berth_session" {
					bearer = c.Value
				}
			}
			if bearer == "" {
				t.Fatal("no session cookie after login")
			}
			paths := []string{"/ui/", "/ui/services", "/ui/nodes", "/ui/workloads", "/ui/nodes/no-such-node", "/ui/services/default/web", "/ui/services/default/web/undo",
				"/ui/operations", "/ui/operations?state=failed", "/ui/changelog", "/ui/domains", "/ui/registry", "/ui/secrets", "/ui/access", "/ui/plugins", "/ui/jobs", "/ui/deploy",
				"/ui/backups", "/ui/access/tokens/new", "/ui/access/users/new", "/ui/backups/default/bkp_none/restore", "/ui/services/default/web/promote/v1",
				"/ui/access/tokens/some-token/revoke", "/ui/access/users/ops/credential",
				"/ui/login", "/ui/no-such-page", "/ui/assets/app.css", "/ui/assets/app.js", "/ui/assets/vendor/htmx.min.js"}
			for _, p := range paths {
				resp, body := get(t, hc, f.srv.URL, p)
				if got := resp.Header.Get("Content-Security-Policy"); got != ui.ContentSecurityPolicy {
					t.Errorf("%s: Content-Security-Policy %q, want %q", p, got, ui.ContentSecurityPolicy)
				}
				if !strings.Contains(ui.ContentSecurityPolicy, "default-src 'self'") {
					t.Fatalf("the policy lost default-src 'self'")
				}
				for _, secret := range []string{envSecret, secretValue, userPassword, bearer, f.admin} {
					if strings.Contains(body, secret) {
						t.Errorf("%s renders a secret value (%.8s...)", p, secret)
					}
				}
				if strings.HasSuffix(p, ".html") || !strings.Contains(p, "/assets/") {
					if strings.Contains(body, "<script>") || strings.Contains(body, " style=") || strings.Contains(body, "<style") {
						t.Errorf("%s has inline script or style", p)
					}
				}
			}
			_, body = get(t, hc, f.srv.URL, "/ui/services/default/web")
			if !strings.Contains(body, "default/web") {
				t.Errorf("the service page does not name the service:\n%s", body)
			}
		})
	}
}

// TestPostWithoutCSRFTokenRefused posts every form of a logged-in session without its CSRF
// token, and with another session's, and sees 403 and no effect; with the token the same
// logout works.
func TestPostWithoutCSRFTokenRefused(t *testing.T) {
	f := newFixture(t, false)
	hc := f.browser(t)
	if resp, _ := login(t, hc, f.srv.URL, url.Values{"token": {f.admin}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	other := f.browser(t)
	login(t, other, f.srv.URL, url.Values{"name": {"ops"}, "password": {userPassword}})
	_, page := get(t, other, f.srv.URL, "/ui/")
	otherToken := csrfRE.FindStringSubmatch(page)[1]
	for _, p := range []string{"/ui/logout", "/ui/services/default/web/restart", "/ui/services/default/web/undo", "/ui/deploy"} {
		for _, tok := range []string{"", otherToken, "forged"} {
			form := url.Values{"expected_revision": {"1"}}
			if tok != "" {
				form.Set("csrf", tok)
			}
			resp, _ := post(t, hc, f.srv.URL, p, form)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s with csrf %q: %d, want 403", p, tok, resp.StatusCode)
			}
		}
	}
	want := "# HELP berth_ui_csrf_refusals_total Dashboard form posts refused for a missing or wrong CSRF token.\n# TYPE berth_ui_csrf_refusals_total counter\nberth_ui_csrf_refusals_total 12\n"
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "berth_ui_csrf_refusals_total"); err != nil {
		t.Error(err)
	}
	// The session still works (the refused logout did nothing) ...
	if resp, _ := get(t, hc, f.srv.URL, "/ui/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after refused posts the overview answers %d", resp.StatusCode)
	}
	// ... and a login form posted without its own CSRF token is refused too.
	fresh := f.browser(t)
	resp, _ := post(t, fresh, f.srv.URL, "/ui/login", url.Values{"token": {f.admin}})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("login without CSRF token: %d, want 403", resp.StatusCode)
	}
	_, page = get(t, hc, f.srv.URL, "/ui/")
	resp, _ = post(t, hc, f.srv.URL, "/ui/logout", url.Values{"csrf": {csrfRE.FindStringSubmatch(page)[1]}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout with its token: %d", resp.StatusCode)
	}
	if resp, _ := get(t, hc, f.srv.URL, "/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after logout the overview answers %d, want a redirect to login", resp.StatusCode)
	}
}

// TestSessionCookieFlags checks the session cookie is HttpOnly and SameSite=Strict, and over
// TLS also Secure with the __Host- prefix; over plain HTTP it cannot be Secure.
func TestSessionCookieFlags(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[useTLS], func(t *testing.T) {
			f := newFixture(t, useTLS)
			hc := f.browser(t)
			resp, _ := login(t, hc, f.srv.URL, url.Values{"name": {"ops"}, "password": {userPassword}})
			var raw string
			for _, v := range resp.Header.Values("Set-Cookie") {
				if strings.Contains(v, "berth_session=") {
					raw = v
				}
			}
			if raw == "" {
				t.Fatalf("no session cookie set: %v", resp.Header.Values("Set-Cookie"))
			}
			for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/"} {
				if !strings.Contains(raw, want) {
					t.Errorf("session cookie %q lacks %s", raw, want)
				}
			}
			if useTLS != strings.Contains(raw, "Secure") {
				t.Errorf("session cookie %q: Secure is %v over TLS=%v", raw, !useTLS, useTLS)
			}
			if useTLS != strings.HasPrefix(raw, "__Host-berth_session=") {
				t.Errorf("session cookie %q: __Host- prefix must be present exactly over TLS", raw)
			}
			if resp, _ := get(t, hc, f.srv.URL, "/ui/"); resp.StatusCode != http.StatusOK {
				t.Fatalf("the overview with the cookie: %d", resp.StatusCode)
			}
		})
	}
}

// TestLoginFailureIsGeneric checks a wrong password, an unknown user and a wrong token are
// answered with the same page, which names neither part.
func TestLoginFailureIsGeneric(t *testing.T) {
	f := newFixture(t, false)
	strip := regexp.MustCompile(`name="csrf" value="[^"]+"`)
	var first string
	for i, form := range []url.Values{
		{"name": {"ops"}, "password": {"a wrong password, twenty chars long"}},
		{"name": {"nobody"}, "password": {userPassword}},
		{"token": {"brt_" + strings.Repeat("A", 43)}},
		{"token": {"not a token at all"}},
	} {
		resp, body := login(t, f.browser(t), f.srv.URL, form)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("attempt %d: %d, want 401", i, resp.StatusCode)
		}
		if !strings.Contains(body, "Login failed.") {
			t.Errorf("attempt %d: no generic failure message:\n%s", i, body)
		}
		for _, hint := range []string{"unknown user", "wrong password", "no such user", "invalid token", "user_not_found"} {
			if strings.Contains(strings.ToLower(body), hint) {
				t.Errorf("attempt %d hints %q", i, hint)
			}
		}
		body = strip.ReplaceAllString(body, "")
		if i == 0 {
			first = body
		} else if body != first {
			t.Errorf("attempt %d answered differently from attempt 0", i)
		}
	}
	want := "# HELP berth_ui_logins_total Dashboard logins by result: ok, failed, throttled, unavailable.\n# TYPE berth_ui_logins_total counter\nberth_ui_logins_total{result=\"failed\"} 4\n"
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "berth_ui_logins_total"); err != nil {
		t.Error(err)
	}
}

// TestStreamSendsLiveRegion opens the overview's live stream and reads one SSE message that
// carries the rendered region, then sees it end when the request does.
func TestStreamSendsLiveRegion(t *testing.T) {
	f := newFixture(t, false)
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/ui/stream/services", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("stream Content-Type %q", ct)
	}
	var got strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), "\n\n") || !strings.Contains(got.String(), "data: ") {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("stream ended before a message: %v\n%s", err, got.String())
		}
	}
	if !strings.Contains(got.String(), "default/web") {
		t.Fatalf("the stream's message does not carry the services region:\n%s", got.String())
	}
	// Without a session the stream is refused, not redirected into the fragment.
	anon := f.browser(t)
	if resp, _ := get(t, anon, f.srv.URL, "/ui/stream/services"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("stream without a session: %d, want 401", resp.StatusCode)
	}
}

// TestActionsCarryTheFormsIdempotencyKey submits the same rendered restart form twice (a
// double click, a resubmitted page): the API restarts once, replaying the first answer;
// a newly rendered form restarts again.
func TestActionsCarryTheFormsIdempotencyKey(t *testing.T) {
	f := newFixture(t, false)
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	keyRE := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)
	restart := func() url.Values {
		_, page := get(t, hc, f.srv.URL, "/ui/services/default/web")
		return url.Values{"csrf": {csrfRE.FindStringSubmatch(page)[1]}, "idempotency_key": {keyRE.FindStringSubmatch(page)[1]}}
	}
	generation := func() int64 {
		s, err := f.api(t, f.admin).GetService(context.Background(), "default", "web")
		if err != nil {
			t.Fatal(err)
		}
		return s.RestartGeneration
	}
	form := restart()
	for i := range 2 {
		if resp, body := post(t, hc, f.srv.URL, "/ui/services/default/web/restart", form); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("restart %d: %d\n%s", i, resp.StatusCode, body)
		}
	}
	if g := generation(); g != 1 {
		t.Fatalf("one form submitted twice restarted %d times, want 1", g)
	}
	if resp, _ := post(t, hc, f.srv.URL, "/ui/services/default/web/restart", restart()); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("restart from a new form: %d", resp.StatusCode)
	}
	if g := generation(); g != 2 {
		t.Fatalf("a second form restarted to generation %d, want 2", g)
	}
}

// TestStreamSaysWhenTheSessionEnds opens a live stream, ends the session at the API (the
// user's sessions revoked), and sees the stream replace the region with a login link and end.
func TestStreamSaysWhenTheSessionEnds(t *testing.T) {
	f := newFixture(t, false)
	hc := f.browser(t)
	resp, _ := login(t, hc, f.srv.URL, url.Values{"name": {"ops"}, "password": {userPassword}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/ui/stream/nodes", nil)
	stream, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if _, err := f.api(t, f.admin).ChangeCredential(ctx, "ops", "revoke_sessions", 0, ""); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(stream.Body) // the stream ends by itself once it told the page
	if err != nil {
		t.Fatalf("read the stream: %v\n%s", err, b)
	}
	if !strings.Contains(string(b), `id="session-ended"`) {
		t.Fatalf("the stream did not say the session ended:\n%s", b)
	}
}

// TestStreamFollowsTheChangeFeed gives the dashboard a change feed (Config.Wake): a stream
// sends only keep-alives while the feed is quiet, even when the state changed, and the new
// state once the feed signals.
func TestStreamFollowsTheChangeFeed(t *testing.T) {
	wake := make(chan struct{}, 1)
	f := newFixtureWith(t, false, func(c *ui.Config) {
		c.Wake = func(context.Context) <-chan struct{} { return wake }
		c.StreamInterval = 20 * time.Millisecond
	})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/ui/stream/services", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := make(chan string, 64)
	go func() {
		defer close(events)
		buf := make([]byte, 64<<10)
		var pending strings.Builder
		for {
			n, err := resp.Body.Read(buf)
			pending.WriteString(string(buf[:n]))
			for {
				s := pending.String()
				i := strings.Index(s, "\n\n")
				if i < 0 {
					break
				}
				select {
				case events <- s[:i]:
				case <-ctx.Done():
					return
				}
				pending.Reset()
				pending.WriteString(s[i+2:])
			}
			if err != nil {
				return
			}
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended waiting for %s", what)
			}
			return e
		case <-ctx.Done():
			t.Fatalf("no %s in time", what)
		}
		return ""
	}
	next("the stream's opening comment")
	if e := next("the first region"); !strings.Contains(e, "default/web") {
		t.Fatalf("first message: %q", e)
	}
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.cat.PutService(ctx, p, &services.Service{Name: "api", Bundle: "api", BundleDigest: "sha256:" + strings.Repeat("cd", 32),
		Command: []string{"./api"}, Replicas: 1}, nil); err != nil {
		t.Fatal(err)
	}
	// Ten ticks of a quiet feed: keep-alives only, the new service not yet sent.
	for range 10 {
		if e := next("a keep-alive"); e != ": keep-alive" {
			t.Fatalf("a quiet feed sent %q, want a keep-alive", e)
		}
	}
	wake <- struct{}{}
	for range 100 {
		e := next("the region after the wake-up")
		if strings.HasPrefix(e, "data: ") {
			if !strings.Contains(e, "default/api") {
				t.Fatalf("the region after the wake-up lacks the new service: %q", e)
			}
			return
		}
	}
	t.Fatal("no region after the wake-up")
}

// TestCachedPageFollowsTheGeneration gives the dashboard a change generation it controls: a
// page whose data was read is served from the session's cache while the generation stands
// still (a service written meanwhile is not shown yet) and read again once it moves.
func TestCachedPageFollowsTheGeneration(t *testing.T) {
	var gen atomic.Uint64
	f := newFixtureWith(t, false, func(c *ui.Config) {
		c.Generation = gen.Load
		c.CacheMaxAge = time.Hour
	})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/services"); !strings.Contains(body, "default/web") {
		t.Fatalf("the services page lacks default/web:\n%s", body)
	}
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.cat.PutService(ctx, p, &services.Service{Name: "api", Bundle: "api", BundleDigest: "sha256:" + strings.Repeat("cd", 32),
		Command: []string{"./api"}, Replicas: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, hc, f.srv.URL, "/ui/services"); strings.Contains(body, "default/api") {
		t.Fatal("the services page read the API again although the generation stood still")
	}
	gen.Add(1)
	if _, body := get(t, hc, f.srv.URL, "/ui/services"); !strings.Contains(body, "default/api") {
		t.Fatalf("the services page did not read again after the generation moved:\n%s", body)
	}
}

// TestGenerationMovesOnAWrite checks ui.Generation over the real read view: it stands still
// while nothing is written and moves after a write to a followed collection returned.
func TestGenerationMovesOnAWrite(t *testing.T) {
	f := newFixture(t, false)
	gen := ui.Generation(f.st.View(), "services", "nodes")
	g0 := gen()
	if g1 := gen(); g1 != g0 {
		t.Fatalf("the generation moved from %d to %d with no write", g0, g1)
	}
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.cat.PutService(ctx, p, &services.Service{Name: "api", Bundle: "api", BundleDigest: "sha256:" + strings.Repeat("cd", 32),
		Command: []string{"./api"}, Replicas: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if g2 := gen(); g2 == g0 {
		t.Fatal("the generation did not move after a service was written")
	}
}

// TestWorkloadPages lists a workload on the workloads page, links it to its own page, and
// shows there its status and, when its node does not answer, why its output is missing; a
// node the API does not know is the API's 404.
func TestWorkloadPages(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := f.cat.GetService(ctx, p, "web")
	if err != nil {
		t.Fatal(err)
	}
	wl, err := f.cat.CreateWorkload(ctx, svc, 0, "node-gone")
	if err != nil {
		t.Fatal(err)
	}
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	resp, body := get(t, hc, f.srv.URL, "/ui/workloads")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/ui/workloads/`+wl.ID+`"`) {
		t.Fatalf("the workloads page (%d) does not link %s:\n%s", resp.StatusCode, wl.ID, body)
	}
	resp, body = get(t, hc, f.srv.URL, "/ui/workloads/"+wl.ID)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="workload-status">creating<`) ||
		!strings.Contains(body, "The node did not give the output") {
		t.Fatalf("the workload page (%d) lacks the status or the reason its output is missing:\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(body, `hx-sse:connect="/ui/stream/logs/`+wl.ID+`?after=0"`) {
		t.Fatalf("the workload page does not follow its output live:\n%s", body)
	}
	// The live log follows through the API; without a node to ask it says so in the output
	// (once), and keeps the stream open to try again.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, f.srv.URL+"/ui/stream/logs/"+wl.ID, nil)
	stream, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if ct := stream.Header.Get("Content-Type"); stream.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("the log stream answered %d %q", stream.StatusCode, ct)
	}
	sc := bufio.NewScanner(stream.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			if !strings.Contains(sc.Text(), `class="log-note"`) || !strings.Contains(sc.Text(), "unavailable") {
				t.Fatalf("the log stream's first message is not the note that the output is unavailable: %q", sc.Text())
			}
			break
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, hc, f.srv.URL, "/ui/workloads/wl_nosuch"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an unknown workload answered %d, want 404", resp.StatusCode)
	}
	if resp, _ := get(t, hc, f.srv.URL, "/ui/nodes/no-such-node"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an unknown node answered %d, want 404", resp.StatusCode)
	}
}

// TestScaleWritesTheRuntimeSpec scales a service from its page's form: the API's runtime spec
// then states the new total; the same rendered form sent again with a stale spec revision is
// the API's conflict, not a second write.
func TestScaleWritesTheRuntimeSpec(t *testing.T) {
	f := newFixture(t, false)
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	_, page := get(t, hc, f.srv.URL, "/ui/services/default/web")
	m := csrfRE.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `id="scale"`) {
		t.Fatalf("the service page has no scale form:\n%s", page)
	}
	form := url.Values{"csrf": {m[1]}, "replicas": {"3"}, "spec_revision": {""}, "idempotency_key": {"ui-test-scale-1"}}
	if resp, body := post(t, hc, f.srv.URL, "/ui/services/default/web/scale", form); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("scale answered %d:\n%s", resp.StatusCode, body)
	}
	doc, err := f.api(t, f.admin).GetRuntimeSpec(context.Background(), "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if doc.Source != "operator" || doc.Spec.Replicas.Total != 3 {
		t.Fatalf("after scaling the spec is %s with %d replicas, want operator with 3", doc.Source, doc.Spec.Replicas.Total)
	}
	form.Set("replicas", "5")
	form.Set("idempotency_key", "ui-test-scale-2")
	if resp, _ := post(t, hc, f.srv.URL, "/ui/services/default/web/scale", form); resp.StatusCode != http.StatusConflict {
		t.Fatalf("a scale with a stale spec revision answered %d, want 409", resp.StatusCode)
	}
	if resp, _ := post(t, hc, f.srv.URL, "/ui/services/default/web/scale", url.Values{"csrf": {m[1]}, "replicas": {"-1"}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a negative replica count answered %d, want 400", resp.StatusCode)
	}
}
