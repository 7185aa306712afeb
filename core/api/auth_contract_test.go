package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// rawDo sends one request with the headers given as they are (an empty value is sent empty)
// and returns its status and problem code.
func (f *fixture) rawDo(method, path, body string, headers map[string]string) (int, map[string]any) {
	f.t.Helper()
	hr, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if body == "" {
		hr.Body, hr.ContentLength = http.NoBody, 0
	}
	for k, v := range headers {
		hr.Header[http.CanonicalHeaderKey(k)] = []string{v}
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// TestAuthenticationContract: a route that reads no body answers an unauthenticated request
// 401 whatever it carries, and refuses the body 400 only once the bearer is good; the
// Authorization scheme is matched without regard to case; an Idempotency-Key header that is
// present but empty is 400 and runs nothing. Before, the body was refused before the bearer
// was looked at, "bearer" in lower case was 401 and an empty key ran as if absent.
func TestAuthenticationContract(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, path := range []string{"/api/v1/logout", "/api/v1/tokens/bootstrap/rotate"} {
		for _, auth := range []string{"", "Bearer brt_notatoken", "Basic Zm9vOmJhcg=="} {
			h := map[string]string{"Content-Type": "application/json"}
			if auth != "" {
				h["Authorization"] = auth
			}
			code, out := f.rawDo("POST", path, `{"x":1}`, h)
			wantCode(t, "POST "+path+" with a body and authorization "+auth, code, out, 401, "unauthenticated")
		}
	}
	code, out := f.rawDo("POST", "/api/v1/tokens/bootstrap/rotate", `{"x":1}`, map[string]string{"Authorization": "Bearer " + f.admin, "Content-Type": "application/json"})
	wantCode(t, "an authenticated POST with a body on a route that reads none", code, out, 400, "bad_request")
	if d, _ := out["detail"].(string); !strings.Contains(d, "takes no request body") {
		t.Errorf("detail %q; want it to say the route takes no body", d)
	}
	// The refused rotation changed nothing: the admin token still works.
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		if code, out := f.rawDo("GET", "/api/v1/projects", "", map[string]string{"Authorization": scheme + " " + f.admin}); code != 200 {
			t.Errorf("scheme %q: %d %v; want 200", scheme, code, out)
		}
	}
	for _, bad := range []string{"Bearer", "Bearer ", "Bearer  " + f.admin, "Bearer" + f.admin, "Token " + f.admin} {
		code, out := f.rawDo("GET", "/api/v1/projects", "", map[string]string{"Authorization": bad})
		wantCode(t, "authorization "+strings.ReplaceAll(bad, f.admin, "<admin>"), code, out, 401, "unauthenticated")
	}

	code, out = f.rawDo("PUT", "/api/v1/projects/shop", "", map[string]string{"Authorization": "Bearer " + f.admin, "Idempotency-Key": ""})
	wantCode(t, "an empty Idempotency-Key", code, out, 400, "bad_request")
	code, out = f.rawDo("GET", "/api/v1/projects/shop", "", map[string]string{"Authorization": "Bearer " + f.admin})
	wantCode(t, "the project after a request with an empty Idempotency-Key", code, out, 404, "project_not_found")
}

// TestEveryRouteAuthenticatesBeforeReadingTheBody: every /api/v1 route but login, enrollment
// and the node session answers a request without a bearer 401 unauthenticated, whatever body
// it carries, so no route refuses or reads a body for someone it has not authenticated.
func TestEveryRouteAuthenticatesBeforeReadingTheBody(t *testing.T) {
	t.Parallel()
	s := fullServer(t)
	param := regexp.MustCompile(`:[a-z0-9_]+`)
	n := 0
	for _, r := range s.e.Routes() {
		key := r.Method + " " + r.Path
		if !strings.HasPrefix(r.Path, "/api/v1/") || strings.HasSuffix(r.Path, "/*") ||
			key == "POST /api/v1/login" || key == "POST /api/v1/nodes/enroll" || key == "GET /api/v1/nodes/session" {
			continue
		}
		path := param.ReplaceAllString(r.Path, "x")
		for _, body := range []string{"", `{"x":1}`, "not json"} {
			req := httptest.NewRequest(r.Method, path, strings.NewReader(body))
			if body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			var out map[string]any
			_ = json.Unmarshal(rec.Body.Bytes(), &out)
			if rec.Code != 401 || out["code"] != "unauthenticated" {
				t.Errorf("%s without a bearer, body %q: %d %v; want 401 unauthenticated", key, body, rec.Code, out)
			}
		}
		n++
	}
	if n < 50 {
		t.Fatalf("only %d routes walked", n)
	}
}
