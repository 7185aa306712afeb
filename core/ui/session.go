package ui

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// Cookie names. Over TLS the session and login cookies carry the __Host- prefix, which the
// browser accepts only with Secure, Path=/ and no Domain: no sibling host can plant one.
const (
	sessionCookie = "berth_session"
	loginCookie   = "berth_login_csrf"
	hostPrefix    = "__Host-"
)

// csrfField is the form field every dashboard form carries its CSRF token in.
const csrfField = "csrf"

// cookieName is name with the __Host- prefix when r came over TLS.
func cookieName(r *http.Request, name string) string {
	if r.TLS != nil {
		return hostPrefix + name
	}
	return name
}

// newCookie is a dashboard cookie: HttpOnly (no script reads it), SameSite=Strict (no other
// site's page sends it), Secure whenever the request came over TLS, Path=/ (the __Host-
// prefix needs it; the API reads no cookie, so only the dashboard sees it).
func newCookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: cookieName(r, name), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	}
}

// bearerOf is the API bearer of r's session cookie: a session token from a password login
// or a machine token pasted at login; "" without one.
func bearerOf(r *http.Request) string {
	c, err := r.Cookie(cookieName(r, sessionCookie))
	if err != nil {
		return ""
	}
	return c.Value
}

// csrfFor derives the CSRF token of a session from its bearer: the SHA-256 of a fixed label
// and the bearer. A page script cannot read the HttpOnly cookie, so another site cannot make
// the token; the token reveals nothing usable of the bearer; every berthd replica computes the
// same one, with no state to share.
func csrfFor(bearer string) string {
	sum := sha256.Sum256([]byte("berth dashboard csrf v1\x00" + bearer))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// csrfOK reports whether POST r carries the CSRF token its session (or, for the login form,
// its login cookie) expects, compared in constant time.
func (h *Handler) csrfOK(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	got := r.PostFormValue(csrfField)
	if got == "" {
		return false
	}
	var want string
	if r.URL.Path == "/ui/login" {
		c, err := r.Cookie(cookieName(r, loginCookie))
		if err != nil || len(c.Value) < 32 {
			return false
		}
		want = c.Value
	} else {
		b := bearerOf(r)
		if b == "" {
			return false
		}
		want = csrfFor(b)
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("ui: crypto/rand failed: " + err.Error()) // the runtime's own rand never fails on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// viewer is who a page is rendered for. Admin reports whether the API's whoami says the
// bearer holds the admin scope everywhere (not bound to a project): the navigation shows the
// admin pages to admins only. It hides links, nothing more; every page's reads are still the
// API's to allow.
type viewer struct {
	Name   string
	Kind   string
	Bearer string
	CSRF   string
	Admin  bool
}

// authed runs page with the session's viewer, or sends the browser to the login page when
// the session is missing or the API no longer accepts its bearer.
func (h *Handler) authed(page func(http.ResponseWriter, *http.Request, *viewer)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b := bearerOf(r)
		if b == "" {
			h.toLogin(w, r)
			return
		}
		c, ctx := h.client(r, b)
		who, err := c.Whoami(ctx)
		if err != nil {
			if client.IsCode(err, "unauthenticated") {
				http.SetCookie(w, newCookie(r, sessionCookie, "", -1))
				h.toLogin(w, r)
				return
			}
			h.apiError(w, r, err)
			return
		}
		v := &viewer{Bearer: b, CSRF: csrfFor(b)}
		v.Name, _ = who["name"].(string)
		if o, _ := who["owner"].(string); o != "" {
			v.Name = o
		}
		v.Kind, _ = who["kind"].(string)
		v.Admin = isAdmin(who)
		page(w, r, v)
	}
}

// toLogin redirects to the login page; a live stream or htmx request gets 401 instead, since
// a redirect inside it would swap the login page into a fragment.
func (h *Handler) toLogin(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/ui/stream/") || r.Header.Get("HX-Request") != "" {
		w.Header().Set("HX-Redirect", "/ui/login")
		http.Error(w, "log in again", http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// loginPage shows the login form with a fresh login CSRF cookie.
func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.renderLogin(w, r, http.StatusOK, "")
}

func (h *Handler) renderLogin(w http.ResponseWriter, r *http.Request, code int, msg string) {
	tok := randomToken()
	http.SetCookie(w, newCookie(r, loginCookie, tok, 600))
	h.render(w, r, code, "login", map[string]any{"Title": "Log in", "CSRF": tok, "Error": msg})
}

// errLoginFailed is the one message of every failed login: it never says which part failed.
const errLoginFailed = "Login failed. Check the name and password, or the token, and try again."

// login checks a password (POST /api/v1/login) or a token (GET /api/v1/whoami with it)
// through the API, and on success sets the session cookie to the bearer.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	name, password, token := r.PostFormValue("name"), r.PostFormValue("password"), strings.TrimSpace(r.PostFormValue("token"))
	c, ctx := h.client(r, "")
	var bearer string
	maxAge := 0
	switch {
	case token != "":
		tc, _ := h.client(r, token)
		if _, err := tc.Whoami(ctx); err != nil {
			h.loginFailed(w, r, err)
			return
		}
		bearer = token
	case name != "" && password != "":
		sess, err := c.Login(ctx, name, password, h.cfg.SessionTTL)
		if err != nil {
			h.loginFailed(w, r, err)
			return
		}
		bearer = sess.Token
		maxAge = int(time.Until(sess.ExpiresAt) / time.Second)
		if maxAge <= 0 {
			maxAge = int(h.cfg.SessionTTL / time.Second)
		}
	default:
		h.m.logins.WithLabelValues("failed").Inc()
		h.renderLogin(w, r, http.StatusUnauthorized, errLoginFailed)
		return
	}
	http.SetCookie(w, newCookie(r, loginCookie, "", -1))
	http.SetCookie(w, newCookie(r, sessionCookie, bearer, maxAge))
	h.m.logins.WithLabelValues("ok").Inc()
	h.log.Info("dashboard login", "remote", r.RemoteAddr, "by", map[bool]string{true: "token", false: "password"}[token != ""])
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// loginFailed answers a refused login: the generic message for a credential failure, the
// API's throttling message when it throttled, and a generic unavailability otherwise.
func (h *Handler) loginFailed(w http.ResponseWriter, r *http.Request, err error) {
	var apiErr *client.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusTooManyRequests:
		h.m.logins.WithLabelValues("throttled").Inc()
		h.renderLogin(w, r, http.StatusTooManyRequests, "Too many login attempts. Wait a minute and try again.")
	case errors.As(err, &apiErr) && apiErr.Status < 500:
		h.m.logins.WithLabelValues("failed").Inc()
		h.renderLogin(w, r, http.StatusUnauthorized, errLoginFailed)
	default:
		h.m.logins.WithLabelValues("unavailable").Inc()
		h.log.Warn("dashboard login: the API failed", "err", err)
		h.renderLogin(w, r, http.StatusServiceUnavailable, "Login is unavailable right now. Try again shortly.")
	}
}

// logout ends the session at the API (a password session is revoked; a machine token is
// left alone, it is not the dashboard's to revoke) and clears the cookie.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request, v *viewer) {
	c, ctx := h.client(r, v.Bearer)
	if err := c.Logout(ctx); err != nil {
		h.log.Warn("dashboard logout: the API refused", "err", err)
	}
	http.SetCookie(w, newCookie(r, sessionCookie, "", -1))
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// isAdmin reports whether a whoami answer holds the admin scope everywhere: "admin" among its
// scopes and no project it is bound to.
func isAdmin(who map[string]any) bool {
	if p, _ := who["project"].(string); p != "" {
		return false
	}
	scopes, _ := who["scopes"].([]any)
	for _, s := range scopes {
		if s == "admin" {
			return true
		}
	}
	return false
}
