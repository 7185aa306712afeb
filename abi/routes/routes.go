// Package routes holds the gateway route table: the complete mapping from
// hostnames to upstream workloads that core computes and pushes to the gateway.
package routes

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// Table is the complete route table. Routes are sorted by [CompareRoutes]:
// by Hostname, and the routes of one hostname in precedence order. A
// hostname may have several routes that differ in their match conditions
// (path prefix, request headers; docs/routes.md section 3), never two with
// the same ones. Revision increases with every table core pushes.
//
// Certificates, Challenges and Excluded are added by the core after route
// compilation (docs/plugins.md section 5.6); a route compiler's output never
// carries them (docs/wasm-abi.md section 6.2).
type Table struct {
	Revision int64   `json:"revision"`
	Routes   []Route `json:"routes"`
	// Certificates are every certificate the gateway may serve on its TLS
	// listener, chosen by SNI ([Certificate]).
	Certificates []Certificate `json:"certificates,omitempty"`
	// Challenges are the ACME HTTP-01 answers the gateway serves on its
	// plain listener ([Challenge]).
	Challenges []Challenge `json:"challenges,omitempty"`
	// Excluded are hostnames the table withholds, with the reason, for
	// status only: the gateway serves no route for them.
	Excluded []Exclusion `json:"excluded,omitempty"`
}

// Redacted returns a copy of t whose certificates keep their names and
// not_after but no PEM: the form for status answers and logs (an API
// listing the table in force must use it). The gateway needs t itself.
func (t Table) Redacted() Table {
	c := t
	c.Certificates = make([]Certificate, len(t.Certificates))
	for i, cert := range t.Certificates {
		c.Certificates[i] = Certificate{Names: append([]string(nil), cert.Names...), NotAfter: cert.NotAfter}
	}
	if t.Certificates == nil {
		c.Certificates = nil
	}
	return c
}

// LogValue implements slog.LogValuer: a table is logged by its revision,
// digest and counts, never whole, so that no key reaches a log through it.
func (t Table) LogValue() slog.Value {
	return slog.GroupValue(slog.Int64("revision", t.Revision), slog.String("sha256", t.Digest()),
		slog.Int("routes", len(t.Routes)), slog.Int("certificates", len(t.Certificates)),
		slog.Int("challenges", len(t.Challenges)), slog.Int("excluded", len(t.Excluded)))
}

// Certificate is one PEM chain (leaf first) and its private key (PKCS#8, or
// EC or RSA PEM) for Names: exact host names ("shop.example.com") or
// wildcards one label deep ("*.example.com"), lower case, without port or
// trailing dot. The gateway picks by SNI: a certificate naming the host
// exactly first, then one whose wildcard covers it (docs/plugins.md section
// 5.6). NotAfter is the leaf's expiry, for status.
//
// KeyPEM is a secret: String, GoString and LogValue leave it out, so a
// Certificate printed with fmt or logged with log/slog never shows it; only
// the JSON form (the table as it travels to the gateway and is stored
// there, 0600) carries it.
type Certificate struct {
	Names    []string  `json:"names"`
	CertPEM  string    `json:"cert_pem"`
	KeyPEM   string    `json:"key_pem"`
	NotAfter time.Time `json:"not_after"`
}

// String describes c by its names and expiry, never its key.
func (c Certificate) String() string {
	return fmt.Sprintf("certificate %s (not after %s)", strings.Join(c.Names, ","), c.NotAfter.UTC().Format(time.RFC3339))
}

// GoString is String, so that %#v does not print the key either.
func (c Certificate) GoString() string { return c.String() }

// LogValue implements slog.LogValuer: names and not_after, never the key.
func (c Certificate) LogValue() slog.Value {
	return slog.GroupValue(slog.Any("names", c.Names), slog.Time("not_after", c.NotAfter))
}

// Covers reports whether c names host (lower case, no port): exactly, or
// through a wildcard one label deep ("*.example.com" covers
// "a.example.com", not "example.com" nor "a.b.example.com").
func (c Certificate) Covers(host string) bool {
	for _, n := range c.Names {
		if n == host || WildcardOf(host) == n {
			return true
		}
	}
	return false
}

// WildcardOf returns the wildcard name one label deep that covers host
// ("a.example.com" gives "*.example.com"), or "" when host has fewer than
// two labels.
func WildcardOf(host string) string {
	i := strings.IndexByte(host, '.')
	if i <= 0 || i == len(host)-1 {
		return ""
	}
	return "*" + host[i:]
}

// Challenge is one ACME HTTP-01 answer: the gateway answers
// GET http://Host/.well-known/acme-challenge/Token on its plain listener with
// KeyAuth (text/plain), before any redirect or route (RFC 8555 section 8.3).
// Host is a hostname of the table's routes or of its Excluded entries.
type Challenge struct {
	Host    string `json:"host"`
	Token   string `json:"token"`
	KeyAuth string `json:"key_auth"`
}

// Exclusion is a hostname the table does not serve and why, such as
// "claimed by shop/web and blog/www".
type Exclusion struct {
	Hostname string `json:"hostname"`
	Reason   string `json:"reason"`
}

// Route sends HTTP requests for Hostname (lower case, no port) to Upstreams
// in turn. A route with match conditions (PathPrefix, Headers) takes only
// the requests that meet all of them; among the routes of a hostname that
// match a request, the first in [CompareRoutes] order takes it.
type Route struct {
	Hostname  string     `json:"hostname"`
	Project   string     `json:"project"`
	Service   string     `json:"service"`
	Upstreams []Upstream `json:"upstreams"`
	// TLSMode is one of the TLS modes below; empty means TLSNone.
	TLSMode string `json:"tls_mode,omitempty"`
	// AllowSources lists the CIDR prefixes (masked, such as "10.0.0.0/8" or
	// "fd00::/8"; one address is "/32" or "/128") whose clients may use the
	// route; empty means every source. The gateway compares the address of
	// the TCP peer, never a forwarded header, and refuses others with 403
	// source_not_allowed (docs/plugins.md section 5).
	AllowSources []string `json:"allow_sources,omitempty"`
	// Timeouts bound the gateway's exchanges with the route's upstreams;
	// zero fields mean the gateway's defaults (docs/plugins.md section 5.4).
	Timeouts Timeouts `json:"timeouts,omitzero"`
	// Stream reports whether the gateway sends every write of an upstream's
	// response on at once, whatever its type and length. Without it only
	// text/event-stream and responses of unknown length are streamed so;
	// others are written in full buffers (docs/plugins.md section 5.2).
	Stream bool `json:"stream,omitempty"`
	// HTTPSRedirect reports whether plain-HTTP requests for the route get a
	// 308 to the same path and query under https:// (once a certificate
	// covers the hostname; HTTP-01 answers come first). Only for TLS modes
	// acme, manual and passthrough.
	HTTPSRedirect bool `json:"https_redirect,omitempty"`
	// HSTSMaxAgeS, when above zero, is the max-age in seconds of the
	// Strict-Transport-Security header the gateway adds to the route's
	// answers over TLS (never over plain HTTP). Only for TLS modes acme and
	// manual, at most MaxHSTSMaxAgeS.
	HSTSMaxAgeS int64 `json:"hsts_max_age_s,omitempty"`
	// PathPrefix, when set, limits the route to requests whose path (as
	// [CleanPath] gives it) is PathPrefix or continues it with "/": "/api"
	// takes "/api" and "/api/x", not "/apix" ([PathMatches]). It starts
	// with "/", has no trailing "/", no "..", no empty segment and no
	// %-escapes; empty means every path.
	PathPrefix string `json:"path_prefix,omitempty"`
	// StripPrefix reports whether the upstream receives the path without
	// PathPrefix ("/api/x" as "/x", "/api" as "/"; [StripPath]); without
	// it the path is passed on unchanged. Only with a PathPrefix.
	StripPrefix bool `json:"strip_prefix,omitempty"`
	// Headers, when set, limit the route to requests that carry every one
	// of them ([HeaderMatch]); names are unique within a route, compared
	// case-insensitively. [Table.Normalize] sorts them by [CompareHeaders].
	Headers []HeaderMatch `json:"headers,omitempty"`
}

// MaxHSTSMaxAgeS is the largest HSTS max-age a route may set: two years.
const MaxHSTSMaxAgeS = 2 * 365 * 24 * 3600

// MaxTimeoutMS is the largest timeout a route (and a service) may set: one
// hour, in milliseconds.
const MaxTimeoutMS = 3_600_000

// Timeouts are a route's upstream timeouts, in milliseconds; zero means the
// gateway's default, negative and values above MaxTimeoutMS are refused by
// [Timeouts.Validate] (docs/plugins.md section 5.4).
type Timeouts struct {
	// ConnectMS bounds the TCP connect to one upstream (default 5,000).
	ConnectMS int64 `json:"connect_ms,omitempty" bson:"connect_ms,omitempty"`
	// ResponseHeaderMS bounds the wait for the upstream's response headers
	// once the request is written (default 60,000).
	ResponseHeaderMS int64 `json:"response_header_ms,omitempty" bson:"response_header_ms,omitempty"`
	// IdleMS is how long a kept-alive upstream connection may stay unused
	// before the gateway closes it (default 90,000).
	IdleMS int64 `json:"idle_ms,omitempty" bson:"idle_ms,omitempty"`
}

// Validate reports the first field outside 0..MaxTimeoutMS, naming it.
func (t Timeouts) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"connect_ms", t.ConnectMS}, {"response_header_ms", t.ResponseHeaderMS}, {"idle_ms", t.IdleMS}} {
		if f.v < 0 || f.v > MaxTimeoutMS {
			return fmt.Errorf("timeouts.%s is %d; want 0 (the default) to %d milliseconds", f.name, f.v, MaxTimeoutMS)
		}
	}
	return nil
}

// TLS modes of a route (docs/wasm-abi.md section 6.2, docs/plugins.md
// section 5.6). A mode outside these is refused when the table is compiled
// ([Table.Validate]).
const (
	// TLSNone: the route is served in plain HTTP on the gateway's listener;
	// the gateway terminates no TLS (put a TLS terminator in front of it).
	TLSNone = "none"
	// TLSACME and TLSManual routes are terminated on the gateway's TLS
	// listener with a table Certificate covering the hostname (obtained
	// from an ACME CA, or put in secrets by the operator). Until one
	// exists, TLS handshakes for the name fail and plain HTTP answers 421
	// tls_unavailable, apart from HTTP-01 challenges. With a certificate,
	// plain HTTP redirects (HTTPSRedirect) or answers 421.
	TLSACME   = "acme"
	TLSManual = "manual"
	// TLSPassthrough routes are proxied as raw TCP, chosen by the SNI of
	// the ClientHello, to the route's upstreams, which terminate TLS
	// themselves.
	TLSPassthrough = "passthrough"
)

// KnownTLSMode reports whether m is a TLS mode of this package ("" counts
// as TLSNone).
func KnownTLSMode(m string) bool {
	switch m {
	case "", TLSNone, TLSACME, TLSManual, TLSPassthrough:
		return true
	}
	return false
}

// TerminatesTLS reports whether the gateway terminates TLS for mode m
// (acme and manual).
func TerminatesTLS(m string) bool { return m == TLSACME || m == TLSManual }

// ValidName reports the first problem with a hostname or certificate name
// n, or nil: it must be lower case, without port, brackets or trailing dot,
// and when wildcard is true may start with "*." (the wildcard only as the
// whole first label, followed by at least one label).
func ValidName(n string, wildcard bool) error {
	rest := n
	if wildcard && strings.HasPrefix(n, "*.") {
		rest = n[2:]
	}
	switch {
	case rest == "":
		return fmt.Errorf("name %q is empty", n)
	case rest != strings.ToLower(rest) || strings.HasSuffix(rest, ".") || strings.ContainsAny(rest, ":/[] "):
		return fmt.Errorf("name %q must be lower case, without port or trailing dot", n)
	case strings.Contains(rest, "*"):
		return fmt.Errorf("name %q has a wildcard other than its whole first label", n)
	case strings.HasPrefix(rest, ".") || strings.Contains(rest, ".."):
		return fmt.Errorf("name %q has an empty label", n)
	}
	return nil
}

// Validate reports the first thing in t a gateway cannot route, or nil: an
// empty or unnormalized hostname (it must be lower case, without a port or
// trailing dot; a wildcard only as the whole first label), match conditions
// refused by the rules of [InvalidError]'s codes (an *InvalidError: a bad
// path prefix or header match, two routes of a hostname with the same
// conditions, routes of a hostname with different TLS modes), an unknown
// TLS mode, https_redirect or hsts_max_age_s on a route whose mode
// does not allow them, a certificate, challenge or exclusion that breaks
// the rules of [Certificate], [Challenge] and [Exclusion], an allow_sources entry that is
// not a masked CIDR prefix, or an upstream without a workload id or whose
// address is not "host:port". Route compilers' output is checked with it
// (docs/wasm-abi.md section 6.2).
func (t Table) Validate() error {
	seen := make(map[string]bool, len(t.Routes))
	type matchID struct{ host, key string }
	matches := make(map[matchID]bool, len(t.Routes))
	modes := make(map[string]string, len(t.Routes))
	for i := range t.Routes {
		r := &t.Routes[i]
		h := r.Hostname
		if h == "" {
			return fmt.Errorf("route table has an empty or repeated hostname %q (a route without hostname)", h)
		}
		seen[h] = true
		if err := ValidName(h, true); err != nil {
			return fmt.Errorf("route hostname: %w", err)
		}
		if err := validateMatch(r); err != nil {
			return err
		}
		id := matchID{h, r.MatchKey()}
		if matches[id] {
			return invalid(CodeMatchDuplicate, h, "repeated hostname with the same path_prefix and headers as another of its routes")
		}
		matches[id] = true
		mode := cmp.Or(r.TLSMode, TLSNone)
		if m, ok := modes[h]; ok && m != mode {
			return invalid(CodeMatchUnsupported, h, "its routes have tls_mode %q and %q; all routes of a hostname share one", m, mode)
		}
		modes[h] = mode
		if err := r.Timeouts.Validate(); err != nil {
			return fmt.Errorf("route %s: %w", h, err)
		}
		if !KnownTLSMode(r.TLSMode) {
			return fmt.Errorf("route %s: unknown tls_mode %q (want %q, %q, %q or %q)", h, r.TLSMode, TLSNone, TLSACME, TLSManual, TLSPassthrough)
		}
		if r.HTTPSRedirect && (r.TLSMode == "" || r.TLSMode == TLSNone) {
			return fmt.Errorf("route %s: https_redirect needs tls_mode %q, %q or %q", h, TLSACME, TLSManual, TLSPassthrough)
		}
		if r.HSTSMaxAgeS < 0 || r.HSTSMaxAgeS > MaxHSTSMaxAgeS {
			return fmt.Errorf("route %s: hsts_max_age_s is %d; want 0 (none) to %d seconds", h, r.HSTSMaxAgeS, MaxHSTSMaxAgeS)
		}
		if r.HSTSMaxAgeS > 0 && !TerminatesTLS(r.TLSMode) {
			return fmt.Errorf("route %s: hsts_max_age_s needs tls_mode %q or %q (the gateway writes no headers for %q)", h, TLSACME, TLSManual, r.TLSMode)
		}
		for _, src := range r.AllowSources {
			p, err := netip.ParsePrefix(src)
			if err != nil {
				return fmt.Errorf("route %s: allow_sources entry %q is not a CIDR prefix: %w", h, src, err)
			}
			if p.Masked() != p {
				return fmt.Errorf("route %s: allow_sources entry %q has host bits set; write %s", h, src, p.Masked())
			}
		}
		for _, u := range r.Upstreams {
			if u.WorkloadID == "" {
				return fmt.Errorf("route %s: an upstream has no workload_id", h)
			}
			if _, port, err := net.SplitHostPort(u.Address); err != nil || port == "" {
				return fmt.Errorf("route %s: upstream %s address %q is not host:port", h, u.WorkloadID, u.Address)
			}
		}
	}
	return t.validateTLS(seen)
}

// validateTLS checks the certificates, challenges and exclusions of t
// against the hostnames of its routes. No error names or quotes a key.
func (t Table) validateTLS(routed map[string]bool) error {
	for i, c := range t.Certificates {
		if len(c.Names) == 0 {
			return fmt.Errorf("certificate %d has no names", i)
		}
		for _, n := range c.Names {
			if err := ValidName(n, true); err != nil {
				return fmt.Errorf("certificate %d: %w", i, err)
			}
		}
		if !hasPEM(c.CertPEM, func(typ string) bool { return typ == "CERTIFICATE" }) {
			return fmt.Errorf("certificate %s: cert_pem holds no PEM CERTIFICATE block", strings.Join(c.Names, ","))
		}
		if !hasPEM(c.KeyPEM, func(typ string) bool { return strings.HasSuffix(typ, "PRIVATE KEY") }) {
			return fmt.Errorf("certificate %s: key_pem holds no PEM private key block", strings.Join(c.Names, ","))
		}
	}
	excluded := make(map[string]bool, len(t.Excluded))
	for _, e := range t.Excluded {
		if err := ValidName(e.Hostname, false); err != nil {
			return fmt.Errorf("excluded hostname: %w", err)
		}
		if routed[e.Hostname] {
			return fmt.Errorf("excluded hostname %s is also routed", e.Hostname)
		}
		if e.Reason == "" {
			return fmt.Errorf("excluded hostname %s has no reason", e.Hostname)
		}
		excluded[e.Hostname] = true
	}
	for _, c := range t.Challenges {
		if err := ValidName(c.Host, false); err != nil {
			return fmt.Errorf("challenge: %w", err)
		}
		if !routed[c.Host] && !excluded[c.Host] {
			return fmt.Errorf("challenge for %s: the host is neither routed nor excluded by the table", c.Host)
		}
		if c.Token == "" || strings.Trim(c.Token, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return fmt.Errorf("challenge for %s: token %q is not base64url", c.Host, c.Token)
		}
		if c.KeyAuth == "" || strings.ContainsAny(c.KeyAuth, " \r\n") {
			return fmt.Errorf("challenge for %s token %s: key_auth is empty or has white space", c.Host, c.Token)
		}
	}
	return nil
}

// hasPEM reports whether s holds a PEM block whose type passes ok.
func hasPEM(s string, ok func(typ string) bool) bool {
	rest := []byte(s)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return false
		}
		if ok(b.Type) {
			return true
		}
	}
}

// Upstream is one workload serving a route. Address is "host:port". Only
// healthy upstreams receive traffic.
type Upstream struct {
	WorkloadID string `json:"workload_id"`
	Address    string `json:"address"`
	Healthy    bool   `json:"healthy"`
}

// Normalize sorts each route's header matches by [CompareHeaders], routes by
// [CompareRoutes] (hostname, then precedence) and upstreams by workload id,
// certificates by their first name (names keep their order), challenges by
// host and token and exclusions by hostname, in place.
func (t *Table) Normalize() {
	for i := range t.Routes {
		if hs := t.Routes[i].Headers; len(hs) > 1 {
			slices.SortFunc(hs, CompareHeaders)
		}
	}
	slices.SortFunc(t.Routes, func(a, b Route) int { return CompareRoutes(&a, &b) })
	for i := range t.Routes {
		u := t.Routes[i].Upstreams
		sort.Slice(u, func(a, b int) bool { return u[a].WorkloadID < u[b].WorkloadID })
	}
	first := func(c Certificate) string {
		if len(c.Names) == 0 {
			return ""
		}
		return c.Names[0]
	}
	sort.SliceStable(t.Certificates, func(i, j int) bool { return first(t.Certificates[i]) < first(t.Certificates[j]) })
	sort.Slice(t.Challenges, func(i, j int) bool {
		a, b := t.Challenges[i], t.Challenges[j]
		return a.Host < b.Host || (a.Host == b.Host && a.Token < b.Token)
	})
	sort.Slice(t.Excluded, func(i, j int) bool { return t.Excluded[i].Hostname < t.Excluded[j].Hostname })
}

// Digest returns the hex SHA-256 of the normalized table (the revision is
// left out), so two tables that route the same way have the same digest.
// Without certificates, challenges and exclusions it is the SHA-256 of the
// JSON of the routes alone as [Table.Normalize] orders them (whatever order
// t holds them and their header matches in), the digest a route compiler
// reports (docs/wasm-abi.md section 6.2); with any of them it covers them
// too, so a renewed certificate or a new challenge changes it. t is not
// modified.
func (t Table) Digest() string {
	c := Table{Routes: append([]Route(nil), t.Routes...),
		Certificates: append([]Certificate(nil), t.Certificates...),
		Challenges:   append([]Challenge(nil), t.Challenges...),
		Excluded:     append([]Exclusion(nil), t.Excluded...)}
	for i := range c.Routes { // Normalize sorts these in place: not t's
		r := &c.Routes[i]
		if len(r.Headers) > 1 {
			r.Headers = slices.Clone(r.Headers)
		}
		if !slices.IsSortedFunc(r.Upstreams, func(a, b Upstream) int { return strings.Compare(a.WorkloadID, b.WorkloadID) }) {
			r.Upstreams = slices.Clone(r.Upstreams)
		}
	}
	c.Normalize()
	var raw []byte
	if len(c.Certificates) == 0 && len(c.Challenges) == 0 && len(c.Excluded) == 0 {
		raw, _ = json.Marshal(c.Routes) // plain structs: cannot fail
	} else {
		raw, _ = json.Marshal(c) // plain structs: cannot fail
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
