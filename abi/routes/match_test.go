package routes

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// TestCodesMatchABIErrors: the codes of InvalidError are the ones
// abi/errors declares (abi/routes cannot import it: Go guests link this
// package, and abi/errors brings net/http).
func TestCodesMatchABIErrors(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]abierrors.Code{
		CodePathPrefixInvalid: abierrors.RoutePathPrefixInvalid,
		CodeHeaderInvalid:     abierrors.RouteHeaderInvalid,
		CodeMatchDuplicate:    abierrors.RouteMatchDuplicate,
		CodeMatchUnsupported:  abierrors.RouteMatchUnsupported,
	} {
		if got != string(want) {
			t.Errorf("abi/routes code %q, abi/errors %q", got, want)
		}
		if want.HTTPStatus() != 422 {
			t.Errorf("%s: HTTP status %d, want 422", want, want.HTTPStatus())
		}
	}
}

func TestValidateMatch(t *testing.T) {
	t.Parallel()
	up := []Upstream{{WorkloadID: "wl_1", Address: "10.0.0.1:8080", Healthy: true}}
	ok := Table{Routes: []Route{
		{Hostname: "a.test", Upstreams: up},
		{Hostname: "a.test", Upstreams: up, PathPrefix: "/api"},
		{Hostname: "a.test", Upstreams: up, PathPrefix: "/api", StripPrefix: true, Headers: []HeaderMatch{{"X-Env", "canary"}}},
		{Hostname: "a.test", Upstreams: up, Headers: []HeaderMatch{{"x-env", "canary"}, {"Accept", "text/event-stream"}}},
		{Hostname: "a.test", Upstreams: up, PathPrefix: "/v1/users:batch@x/~me"},
		{Hostname: "b.test", Upstreams: up, TLSMode: TLSPassthrough},
	}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid table with match conditions: %v", err)
	}
	for _, tc := range []struct {
		name  string
		route Route
		code  string
		want  string
	}{
		{"relative prefix", Route{PathPrefix: "api"}, CodePathPrefixInvalid, `start with "/"`},
		{"root prefix", Route{PathPrefix: "/"}, CodePathPrefixInvalid, "leave path_prefix out"},
		{"trailing slash", Route{PathPrefix: "/api/"}, CodePathPrefixInvalid, `ends with "/"`},
		{"dot dot segment", Route{PathPrefix: "/api/../admin"}, CodePathPrefixInvalid, `".."`},
		{"dot dot inside", Route{PathPrefix: "/a..b"}, CodePathPrefixInvalid, `".."`},
		{"dot segment", Route{PathPrefix: "/api/./x"}, CodePathPrefixInvalid, `"." segment`},
		{"empty segment", Route{PathPrefix: "/api//x"}, CodePathPrefixInvalid, "empty segment"},
		{"NUL", Route{PathPrefix: "/api\x00"}, CodePathPrefixInvalid, "NUL"},
		{"escape", Route{PathPrefix: "/a%2Fb"}, CodePathPrefixInvalid, "not a URL path character"},
		{"query", Route{PathPrefix: "/a?b"}, CodePathPrefixInvalid, "not a URL path character"},
		{"space", Route{PathPrefix: "/a b"}, CodePathPrefixInvalid, "not a URL path character"},
		{"too long", Route{PathPrefix: "/" + strings.Repeat("a", MaxPathPrefixLen)}, CodePathPrefixInvalid, "longer than"},
		{"strip without prefix", Route{StripPrefix: true}, CodePathPrefixInvalid, "strip_prefix needs"},
		{"name not a token", Route{Headers: []HeaderMatch{{"X Env", "a"}}}, CodeHeaderInvalid, "not an HTTP token"},
		{"name with colon", Route{Headers: []HeaderMatch{{"X-Env:", "a"}}}, CodeHeaderInvalid, "not an HTTP token"},
		{"empty name", Route{Headers: []HeaderMatch{{"", "a"}}}, CodeHeaderInvalid, "not an HTTP token"},
		{"host header", Route{Headers: []HeaderMatch{{"Host", "a.test"}}}, CodeHeaderInvalid, "route by hostname"},
		{"empty value", Route{Headers: []HeaderMatch{{"X-Env", ""}}}, CodeHeaderInvalid, "is empty"},
		{"value with CRLF", Route{Headers: []HeaderMatch{{"X-Env", "a\r\nX-Evil: 1"}}}, CodeHeaderInvalid, "control character"},
		{"value with spaces around", Route{Headers: []HeaderMatch{{"X-Env", " a"}}}, CodeHeaderInvalid, "white space"},
		{"name twice", Route{Headers: []HeaderMatch{{"X-Env", "a"}, {"x-env", "b"}}}, CodeHeaderInvalid, "matched twice"},
		{"too many", Route{Headers: manyHeaders(MaxHeaderMatches + 1)}, CodeHeaderInvalid, "at most"},
		{"passthrough with prefix", Route{TLSMode: TLSPassthrough, PathPrefix: "/api"}, CodeMatchUnsupported, "passthrough"},
	} {
		tc.route.Hostname = "a.test"
		err := (Table{Routes: []Route{tc.route}}).Validate()
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Code != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an *InvalidError %s with %q", tc.name, err, tc.code, tc.want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\r\n\x00") {
			t.Errorf("%s: the error %q carries raw control characters", tc.name, err)
		}
	}
	for name, tbl := range map[string][]Route{
		"same prefix":                 {{Hostname: "a.test", PathPrefix: "/api"}, {Hostname: "a.test", PathPrefix: "/api"}},
		"same headers in other order": {{Hostname: "a.test", Headers: []HeaderMatch{{"A", "1"}, {"B", "2"}}}, {Hostname: "a.test", Headers: []HeaderMatch{{"b", "2"}, {"a", "1"}}}},
		"no conditions twice":         {{Hostname: "a.test"}, {Hostname: "a.test"}},
	} {
		err := (Table{Routes: tbl}).Validate()
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Code != CodeMatchDuplicate || !strings.Contains(err.Error(), "repeated hostname") {
			t.Errorf("%s: %v, want %s", name, err, CodeMatchDuplicate)
		}
	}
	mixed := Table{Routes: []Route{{Hostname: "a.test", TLSMode: TLSACME}, {Hostname: "a.test", PathPrefix: "/api"}}}
	if err := mixed.Validate(); err == nil || !strings.Contains(err.Error(), CodeMatchUnsupported) {
		t.Errorf("routes of one hostname with two tls modes: %v", err)
	}
	if err := (Table{Routes: []Route{{Hostname: "a.test", Headers: []HeaderMatch{{"X-Env", "a"}}}, {Hostname: "a.test", Headers: []HeaderMatch{{"X-Env", "b"}}}}}).Validate(); err != nil {
		t.Errorf("two values of one header are two match sets: %v", err)
	}
}

func manyHeaders(n int) []HeaderMatch {
	out := make([]HeaderMatch, n)
	for i := range out {
		out[i] = HeaderMatch{Name: "X-H" + strings.Repeat("a", i), Value: "1"}
	}
	return out
}

func TestPathMatches(t *testing.T) {
	for _, tc := range []struct {
		prefix, path string
		want         bool
	}{
		{"/api", "/api", true},
		{"/api", "/api/", true},
		{"/api", "/api/x/y", true},
		{"/api", "/apix", false},
		{"/api", "/ap", false},
		{"/api", "/", false},
		{"/api", "/API", false},
		{"/api", "//api/x", true},
		{"/api", "/x/../api/y", true},
		{"/api", "/api/../admin", false},
		{"/api", "/api/./x", true},
		{"/api/v1", "/api/v1x", false},
		{"/api/v1", "/api/v1/z", true},
		{"", "/anything", true},
		{"", "", true},
	} {
		if got := PathMatches(tc.prefix, tc.path); got != tc.want {
			t.Errorf("PathMatches(%q, %q) = %v, want %v", tc.prefix, tc.path, got, tc.want)
		}
	}
	for _, tc := range [][3]string{{"/api", "/api/x?", "/x?"}, {"/api", "/api", "/"}, {"/api", "/api/", "/"}, {"/api", "/api/a/b/", "/a/b/"}, {"/api", "//api//b", "/b"}} {
		if got := StripPath(tc[0], tc[1]); got != tc[2] {
			t.Errorf("StripPath(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
	if n := testing.AllocsPerRun(100, func() { PathMatches("/api", "/api/users/7") }); n != 0 {
		t.Errorf("PathMatches of a clean path allocates %v times", n)
	}
}

// TestPrecedence: a normalized table lists the routes of a hostname in
// precedence order, whatever order they came in: longest prefix, then most
// headers, then by prefix and header set; the order is total, so every
// shuffle normalizes to the same table and digest.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	want := []Route{
		{Hostname: "a.test", PathPrefix: "/api/v2"},
		{Hostname: "a.test", PathPrefix: "/api", Headers: []HeaderMatch{{"X-Env", "canary"}}},
		{Hostname: "a.test", PathPrefix: "/api"},
		{Hostname: "a.test", PathPrefix: "/web"},
		{Hostname: "a.test", Headers: []HeaderMatch{{"Accept", "text/html"}, {"X-Env", "canary"}}},
		{Hostname: "a.test", Headers: []HeaderMatch{{"accept", "text/html"}}},
		{Hostname: "a.test", Headers: []HeaderMatch{{"X-Env", "beta"}}},
		{Hostname: "a.test", Headers: []HeaderMatch{{"X-Env", "canary"}}},
		{Hostname: "a.test"},
		{Hostname: "b.test", PathPrefix: "/x"},
		{Hostname: "b.test"},
	}
	if err := (Table{Routes: want}).Validate(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	digest := (Table{Routes: want}).Digest()
	for range 50 {
		got := Table{Routes: slices.Clone(want)}
		for i := range got.Routes {
			got.Routes[i].Headers = slices.Clone(got.Routes[i].Headers)
			hs := got.Routes[i].Headers
			rng.Shuffle(len(hs), func(a, b int) { hs[a], hs[b] = hs[b], hs[a] })
		}
		rng.Shuffle(len(got.Routes), func(a, b int) { got.Routes[a], got.Routes[b] = got.Routes[b], got.Routes[a] })
		if d := got.Digest(); d != digest {
			t.Fatalf("a shuffled table digests to %s, want %s", d, digest)
		}
		got.Normalize()
		for i := range want {
			if got.Routes[i].MatchKey() != want[i].MatchKey() || got.Routes[i].Hostname != want[i].Hostname {
				t.Fatalf("normalized position %d: %+v, want %+v", i, got.Routes[i], want[i])
			}
		}
	}
	// Digest leaves the caller's header and upstream order alone.
	r := []Route{{Hostname: "a.test", Headers: []HeaderMatch{{"B", "1"}, {"A", "1"}},
		Upstreams: []Upstream{{WorkloadID: "wl_2"}, {WorkloadID: "wl_1"}}}}
	_ = Table{Routes: r}.Digest()
	if r[0].Headers[0].Name != "B" || r[0].Upstreams[0].WorkloadID != "wl_2" {
		t.Errorf("Digest sorted the caller's slices: %+v", r[0])
	}
	// A route without conditions encodes as before they existed, so the
	// digests of existing tables do not change.
	raw, err := json.Marshal([]Route{{Hostname: "a.test", Upstreams: []Upstream{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(raw); got != `[{"hostname":"a.test","project":"","service":"","upstreams":[]}]` {
		t.Errorf("a route without conditions encodes as %s", got)
	}
}
