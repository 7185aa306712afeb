package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestTokenAndUserActions issues a token from the form (its secret on the answer page only,
// the answer not cached, the token working at the API), sees a scope the API refuses for
// machine tokens shown beside the form as typed, refuses a revoke without its CSRF token,
// revokes the token (the API then refuses it), creates a user (a refused name shown without
// the password typed), and turns a user's password login off.
func TestTokenAndUserActions(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	anon := f.browser(t)
	for _, path := range []string{"/ui/access/tokens/new", "/ui/access/users/new"} {
		if resp, _ := get(t, anon, f.srv.URL, path); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
			t.Fatalf("%s without a session answered %d, want 303 to /ui/login", path, resp.StatusCode)
		}
	}
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/access"); !strings.Contains(body, `href="/ui/access/tokens/new"`) || !strings.Contains(body, `href="/ui/access/users/new"`) {
		t.Fatalf("the access page links no token or user form:\n%s", body)
	}
	resp, body := get(t, hc, f.srv.URL, "/ui/access/tokens/new")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `aria-current="page">Access<`) {
		t.Fatalf("the token form answered %d:\n%s", resp.StatusCode, body)
	}
	csrf := csrfRE.FindStringSubmatch(body)[1]
	// A machine token cannot hold a human-only scope: the API's refusal, the form as typed.
	resp, body = post(t, hc, f.srv.URL, "/ui/access/tokens", url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]},
		"name": {"enroller"}, "scope": {"node:enroll"}})
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "<code>scope_human_only</code>") || !strings.Contains(body, `value="enroller"`) {
		t.Fatalf("a human-only scope answered %d without scope_human_only and the form as typed:\n%s", resp.StatusCode, body)
	}
	form := url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]}, "name": {"ci-reader"}, "scope": {"services:read"}, "expires_days": {"2"}}
	resp, body = post(t, hc, f.srv.URL, "/ui/access/tokens", form)
	m := regexp.MustCompile(`id="token-secret" class="secret" readonly value="(brt_[^"]+)"`).FindStringSubmatch(body)
	if resp.StatusCode != http.StatusCreated || m == nil || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("issuing a token answered %d (Cache-Control %q) without its secret:\n%s", resp.StatusCode, resp.Header.Get("Cache-Control"), body)
	}
	bearer := m[1]
	if _, err := f.api(t, bearer).ListServices(ctx, "default"); err != nil {
		t.Fatalf("the issued token does not work at the API: %v", err)
	}
	// A resubmit of the same form is the API's replay: still one token.
	post(t, hc, f.srv.URL, "/ui/access/tokens", form)
	toks, err := f.api(t, f.admin).ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tk := range toks {
		if tk.Name == "ci-reader" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the token form posted twice made %d tokens named ci-reader, want 1", n)
	}
	_, body = get(t, hc, f.srv.URL, "/ui/access")
	if strings.Contains(body, bearer) {
		t.Fatal("the access page renders an issued token's secret")
	}
	if !strings.Contains(body, `href="/ui/access/tokens/ci-reader/revoke"`) {
		t.Fatalf("the access page does not link the revocation of ci-reader:\n%s", body)
	}
	// The revocation is asked first, on a page of its own; its form posts the revoke.
	if resp, body := get(t, hc, f.srv.URL, "/ui/access/tokens/ci-reader/revoke"); resp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/ui/access/tokens/ci-reader/revoke"`) {
		t.Fatalf("the revoke confirmation answered %d without its form:\n%s", resp.StatusCode, body)
	}
	if resp, _ := post(t, hc, f.srv.URL, "/ui/access/tokens/ci-reader/revoke", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a revoke without its CSRF token answered %d, want 403", resp.StatusCode)
	}
	if _, err := f.api(t, bearer).ListServices(ctx, "default"); err != nil {
		t.Fatalf("a refused revoke revoked the token: %v", err)
	}
	if resp, body := post(t, hc, f.srv.URL, "/ui/access/tokens/ci-reader/revoke", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the revoke answered %d:\n%s", resp.StatusCode, body)
	}
	if _, err := f.api(t, bearer).ListServices(ctx, "default"); err == nil {
		t.Fatal("the revoked token still works at the API")
	}

	// Users: a name the API refuses comes back as typed, never with its password.
	const typed = "a password typed into the form, 42!"
	_, body = get(t, hc, f.srv.URL, "/ui/access/users/new")
	resp, body = post(t, hc, f.srv.URL, "/ui/access/users", url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]},
		"name": {"Not A Name"}, "kind": {"human"}, "role": {"viewer"}, "password": {typed}})
	if resp.StatusCode < 400 || !strings.Contains(body, `id="user-error"`) || !strings.Contains(body, `value="Not A Name"`) || strings.Contains(body, typed) {
		t.Fatalf("a refused user answered %d (the API's problem and the name as typed, not the password, wanted):\n%s", resp.StatusCode, body)
	}
	resp, body = post(t, hc, f.srv.URL, "/ui/access/users", url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]},
		"name": {"dev"}, "kind": {"human"}, "role": {"viewer"}, "password": {typed}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("creating a user answered %d:\n%s", resp.StatusCode, body)
	}
	users, err := f.api(t, f.admin).ListUsers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gen int64
	for _, u := range users {
		if u.Name == "dev" && (len(u.Roles) != 1 || u.Roles[0] != "viewer" || !u.PasswordEnabled) {
			t.Fatalf("the user dev reads back as %+v", u)
		}
		if u.Name == "dev" {
			gen = u.Generation
		}
	}
	if gen == 0 {
		t.Fatalf("the user dev was not created: %+v", users)
	}
	_, body = get(t, hc, f.srv.URL, "/ui/access")
	if !strings.Contains(body, `href="/ui/access/users/dev/credential"`) {
		t.Fatalf("the access page does not link dev's credential actions:\n%s", body)
	}
	resp, body = get(t, hc, f.srv.URL, "/ui/access/users/dev/credential")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `name="op" value="revoke_password"`) || !strings.Contains(body, `name="expected_generation" value="`+strconv.FormatInt(gen, 10)+`"`) {
		t.Fatalf("dev's credential page answered %d without its forms at generation %d:\n%s", resp.StatusCode, gen, body)
	}
	if resp, _ := get(t, hc, f.srv.URL, "/ui/access/users/nobody/credential"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the credential page of an unknown user answered %d, want 404", resp.StatusCode)
	}
	if resp, body := post(t, hc, f.srv.URL, "/ui/access/users/dev/credential", url.Values{"csrf": {csrf}, "op": {"revoke_password"}, "expected_generation": {strconv.FormatInt(gen, 10)}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("turning dev's password login off answered %d:\n%s", resp.StatusCode, body)
	}
	users, _ = f.api(t, f.admin).ListUsers(ctx)
	for _, u := range users {
		if u.Name == "dev" && u.PasswordEnabled {
			t.Fatal("dev's password login is still on")
		}
	}
}
