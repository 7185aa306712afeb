package routes

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Request matching (docs/routes.md section 3). A hostname may have several
// routes, each with its own match conditions: an optional path prefix and
// any number of request-header matches. A request is given to the route of
// its host that matches it and comes first in [CompareRoutes] order:
//
//  1. the longest path prefix (a route without one has length zero);
//  2. then the most header matches;
//  3. then, between routes both conditions leave equal (two routes whose
//     header sets differ), the smaller header set by [CompareHeaderSets].
//
// Steps 1 and 2 are the order of the Kubernetes Gateway API's HTTPRoute
// rules; step 3 makes the order total, since a table never holds two
// routes of one hostname with the same prefix and header set
// ([Table.Validate] refuses that with [CodeMatchDuplicate]).

// HeaderMatch is one request-header condition of a route: the request must
// carry a field Name (compared case-insensitively, as HTTP does) one of
// whose lines has exactly Value (compared byte for byte, after the HTTP
// parser trimmed the line's surrounding white space). Repeated lines of a
// field are not joined: {"x-env","a"} matches a request with the lines
// "X-Env: b" and "X-Env: a", and not one with the line "X-Env: a, b".
type HeaderMatch struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Limits of a route's match conditions, enforced by [Table.Validate].
const (
	// MaxPathPrefixLen is the longest path prefix a route may have, in bytes.
	MaxPathPrefixLen = 1024
	// MaxHeaderMatches is the most header matches one route may have.
	MaxHeaderMatches = 16
	// MaxHeaderValueLen is the longest header value a match may name, in bytes.
	MaxHeaderValueLen = 4096
)

// The codes of [InvalidError]: a route table refused for its match
// conditions. abi/errors declares the same codes; they never change meaning.
const (
	// CodePathPrefixInvalid: a path_prefix that is not "/" followed by
	// segments of URL path characters, or that has "..", an empty or "."
	// segment, a trailing "/", a NUL or is longer than MaxPathPrefixLen;
	// or strip_prefix without a path_prefix.
	CodePathPrefixInvalid = "route_path_prefix_invalid"
	// CodeHeaderInvalid: a header match whose name is not an HTTP token or
	// is Host, whose value is empty, has control characters or
	// surrounding white space or is longer than MaxHeaderValueLen, a name
	// repeated within one route, or more than MaxHeaderMatches matches.
	CodeHeaderInvalid = "route_header_invalid"
	// CodeMatchDuplicate: two routes of one hostname with the same path
	// prefix and the same header matches (names compared case-insensitively).
	CodeMatchDuplicate = "route_match_duplicate"
	// CodeMatchUnsupported: match conditions on a passthrough route (the
	// gateway sees no HTTP there), or routes of one hostname whose
	// tls_mode differ (TLS is chosen by hostname, before any request).
	CodeMatchUnsupported = "route_match_unsupported"
)

// InvalidError is the error of [Table.Validate] for a route whose match
// conditions are refused. Code is one of the Code constants above.
type InvalidError struct {
	Code     string
	Hostname string
	Reason   string
}

// Error is "<code>: route <hostname>: <reason>".
func (e *InvalidError) Error() string {
	return e.Code + ": route " + e.Hostname + ": " + e.Reason
}

func invalid(code, host, format string, args ...any) error {
	return &InvalidError{Code: code, Hostname: host, Reason: fmt.Sprintf(format, args...)}
}

// Conditions returns the number of match conditions of r: one for a path
// prefix, one for each header match.
func (r *Route) Conditions() int {
	n := len(r.Headers)
	if r.PathPrefix != "" {
		n++
	}
	return n
}

// MatchKey returns a string that is equal for two routes of one hostname
// exactly when their match conditions are the same: the path prefix and
// the header matches, names lower case, sorted. "" for a route without
// conditions.
func (r *Route) MatchKey() string {
	if r.PathPrefix == "" && len(r.Headers) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(r.PathPrefix)
	for _, h := range sortedHeaders(r.Headers) {
		b.WriteByte(0)
		b.WriteString(strings.ToLower(h.Name))
		b.WriteByte(0)
		b.WriteString(h.Value)
	}
	return b.String()
}

// sortedHeaders returns hs sorted by [CompareHeaders], a copy when hs is
// not sorted yet.
func sortedHeaders(hs []HeaderMatch) []HeaderMatch {
	if slices.IsSortedFunc(hs, CompareHeaders) {
		return hs
	}
	c := slices.Clone(hs)
	slices.SortFunc(c, CompareHeaders)
	return c
}

// CompareHeaders orders header matches by name compared case-insensitively
// (ASCII), then by name byte for byte, then by value.
func CompareHeaders(a, b HeaderMatch) int {
	if c := compareFold(a.Name, b.Name); c != 0 {
		return c
	}
	return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Value, b.Value))
}

// compareFold compares a and b as if both were ASCII lower case, without
// allocating.
func compareFold(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := lower(a[i]), lower(b[i])
		if ca != cb {
			return cmp.Compare(ca, cb)
		}
	}
	return cmp.Compare(len(a), len(b))
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// CompareHeaderSets orders two sorted header sets element by element with
// [CompareHeaders]; a set that is a prefix of the other comes first.
func CompareHeaderSets(a, b []HeaderMatch) int {
	return slices.CompareFunc(a, b, CompareHeaders)
}

// CompareRoutes is the order of a normalized table: by hostname, then, among
// routes of one hostname, in precedence order (the route a request is
// given to when several match comes first): the longest path prefix, then
// the most header matches, then by path prefix and by header set
// ([CompareHeaderSets]). Header sets are compared as [Table.Normalize]
// leaves them (sorted by [CompareHeaders]). It never allocates.
func CompareRoutes(a, b *Route) int {
	if c := strings.Compare(a.Hostname, b.Hostname); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.PathPrefix), len(a.PathPrefix)); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.Headers), len(a.Headers)); c != 0 {
		return c
	}
	if c := strings.Compare(a.PathPrefix, b.PathPrefix); c != 0 {
		return c
	}
	return CompareHeaderSets(a.Headers, b.Headers)
}

// PathMatches reports whether a request path (decoded, as
// net/url.URL.Path) falls under prefix on segment boundaries: "/api"
// covers "/api", "/api/" and "/api/x", never "/apix". An empty prefix
// covers every path. The path is compared as [CleanPath] gives it.
func PathMatches(prefix, p string) bool {
	if prefix == "" {
		return true
	}
	p = CleanPath(p)
	return strings.HasPrefix(p, prefix) && (len(p) == len(prefix) || p[len(prefix)] == '/')
}

// CleanPath returns the path routing compares: p as path.Clean gives it,
// with its trailing slash kept, so that "/api/../admin" is routed as
// "/admin" and "//api" as "/api". p itself is returned, without
// allocating, when it has no empty, "." or ".." segment.
func CleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if !needsClean(p) {
		return p
	}
	c := path.Clean(p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c
}

// needsClean reports whether p does not start with "/" or has an empty,
// "." or ".." segment before its last byte.
func needsClean(p string) bool {
	if p[0] != '/' {
		return true
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		rest := p[i+1:]
		if rest != "" && rest[0] == '/' {
			return true
		}
		if rest == "." || rest == ".." || strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
			return true
		}
	}
	return false
}

// StripPath returns p (a path [PathMatches] matched to prefix) without
// prefix, as the upstream of a route with strip_prefix receives it: "/api/x"
// gives "/x", "/api" gives "/".
func StripPath(prefix, p string) string {
	p = CleanPath(p)
	if !strings.HasPrefix(p, prefix) {
		return p
	}
	if rest := p[len(prefix):]; rest != "" {
		return rest
	}
	return "/"
}

// validateMatch checks r's match conditions: the rules of [InvalidError]'s
// codes.
func validateMatch(r *Route) error {
	h := r.Hostname
	if r.StripPrefix && r.PathPrefix == "" {
		return invalid(CodePathPrefixInvalid, h, "strip_prefix needs a path_prefix")
	}
	if p := r.PathPrefix; p != "" {
		if why := badPrefix(p); why != "" {
			return invalid(CodePathPrefixInvalid, h, "path_prefix %q %s", p, why)
		}
	}
	if r.TLSMode == TLSPassthrough && r.Conditions() > 0 {
		return invalid(CodeMatchUnsupported, h, "a passthrough route cannot have path_prefix or headers: the gateway sees only the TLS server name")
	}
	if len(r.Headers) > MaxHeaderMatches {
		return invalid(CodeHeaderInvalid, h, "%d header matches; at most %d", len(r.Headers), MaxHeaderMatches)
	}
	for i, m := range r.Headers {
		if !isToken(m.Name) {
			return invalid(CodeHeaderInvalid, h, "header name %q is not an HTTP token", m.Name)
		}
		if strings.EqualFold(m.Name, "host") {
			return invalid(CodeHeaderInvalid, h, "header name %q: route by hostname instead", m.Name)
		}
		if why := badHeaderValue(m.Value); why != "" {
			return invalid(CodeHeaderInvalid, h, "header %s value %q %s", m.Name, m.Value, why)
		}
		for _, o := range r.Headers[:i] {
			if strings.EqualFold(o.Name, m.Name) {
				return invalid(CodeHeaderInvalid, h, "header %s is matched twice; one value per name", m.Name)
			}
		}
	}
	return nil
}

// badPrefix returns why p is not a path prefix a route may have, "" when
// it is one.
func badPrefix(p string) string {
	switch {
	case len(p) > MaxPathPrefixLen:
		return fmt.Sprintf("is longer than %d bytes", MaxPathPrefixLen)
	case p[0] != '/':
		return `does not start with "/"`
	case p == "/":
		return `is "/", which every path has: leave path_prefix out`
	case strings.HasSuffix(p, "/"):
		return `ends with "/"; prefixes match on segment boundaries, write it without`
	case strings.IndexByte(p, 0) >= 0:
		return "has a NUL byte"
	case strings.Contains(p, ".."):
		return `has ".."`
	}
	for _, seg := range strings.Split(p[1:], "/") {
		switch seg {
		case "":
			return "has an empty segment"
		case ".":
			return `has a "." segment`
		}
	}
	for i := 0; i < len(p); i++ {
		if !pathChar(p[i]) {
			return fmt.Sprintf("has %q, which is not a URL path character (write the path decoded, without %%-escapes, query or fragment)", p[i])
		}
	}
	return ""
}

// pathChar reports whether c may appear in a path prefix unescaped: the
// RFC 3986 pchar set and "/", without "%".
func pathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0
}

// badHeaderValue returns why v is not a value a header match may name.
func badHeaderValue(v string) string {
	switch {
	case v == "":
		return "is empty"
	case len(v) > MaxHeaderValueLen:
		return fmt.Sprintf("is longer than %d bytes", MaxHeaderValueLen)
	case v[0] == ' ' || v[0] == '\t' || v[len(v)-1] == ' ' || v[len(v)-1] == '\t':
		return "has surrounding white space, which HTTP parsers drop"
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return "has a control character"
		}
	}
	return ""
}

// isToken reports whether s is an RFC 9110 token (a valid field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
