// Package routes holds the gateway route table: the complete mapping from
// hostnames to upstream workloads that core computes and pushes to the gateway.
package routes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// Table is the complete route table. Routes are sorted by Hostname; a hostname
// appears at most once. Revision increases with every table core pushes.
type Table struct {
	Revision     int64         `json:"revision"`
	Routes       []Route       `json:"routes"`
	Certificates []Certificate `json:"certificates,omitempty"` // every certificate the gateway may serve
	Challenges   []Challenge   `json:"challenges,omitempty"`   // ACME HTTP-01 answers to serve
	Excluded     []Exclusion   `json:"excluded,omitempty"`     // hostnames withheld by claims (for status)
}

// Certificate is one PEM chain and its private key (PKCS#8 or EC/RSA PEM) for Names (exact host
// names or "*.example.com" wildcards). The gateway picks by SNI: exact name first, then wildcard.
type Certificate struct {
	Names    []string  `json:"names"`
	CertPEM  string    `json:"cert_pem"`
	KeyPEM   string    `json:"key_pem"`
	NotAfter time.Time `json:"not_after"`
}

// Challenge is one ACME HTTP-01 answer: GET http://Host/.well-known/acme-challenge/Token answers
// KeyAuth (text/plain) on the plain listener, before any redirect or route.
type Challenge struct {
	Host    string `json:"host"`
	Token   string `json:"token"`
	KeyAuth string `json:"key_auth"`
}

// Exclusion is a hostname the table does not serve and why (e.g. "claimed by shop/web and blog/www").
type Exclusion struct {
	Hostname string `json:"hostname"`
	Reason   string `json:"reason"`
}

// Route sends HTTP requests for Hostname (lower case, no port) to Upstreams in turn.
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
}

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

// TLS modes of a route (docs/wasm-abi.md section 6.2). A mode outside these
// is refused when the table is compiled ([Table.Validate]).
const (
	// TLSNone: the route is served in plain HTTP on the gateway's listener;
	// the gateway terminates no TLS (put a TLS terminator in front of it).
	TLSNone = "none"
	// TLSACME and TLSPassthrough are reserved for a gateway that terminates
	// TLS with ACME certificates, or passes TLS through to the workload. The
	// gateway today serves neither and never serves such a route in plain
	// HTTP: it answers 421 tls_unavailable.
	TLSACME        = "acme"
	TLSPassthrough = "passthrough"
)

// KnownTLSMode reports whether m is a TLS mode of this package ("" counts
// as TLSNone).
func KnownTLSMode(m string) bool {
	switch m {
	case "", TLSNone, TLSACME, TLSPassthrough:
		return true
	}
	return false
}

// Validate reports the first thing in t a gateway cannot route, or nil: an
// empty, repeated or unnormalized hostname (it must be lower case, without a
// port or trailing dot), an unknown TLS mode, an allow_sources entry that is
// not a masked CIDR prefix, or an upstream without a workload id or whose
// address is not "host:port". Route compilers' output is checked with it
// (docs/wasm-abi.md section 6.2).
func (t Table) Validate() error {
	seen := make(map[string]bool, len(t.Routes))
	for _, r := range t.Routes {
		h := r.Hostname
		if h == "" || seen[h] {
			return fmt.Errorf("route table has an empty or repeated hostname %q", h)
		}
		seen[h] = true
		if h != strings.ToLower(h) || strings.HasSuffix(h, ".") || strings.ContainsAny(h, ":/[] ") {
			return fmt.Errorf("route %s: hostname must be lower case, without port or trailing dot", h)
		}
		if err := r.Timeouts.Validate(); err != nil {
			return fmt.Errorf("route %s: %w", h, err)
		}
		if !KnownTLSMode(r.TLSMode) {
			return fmt.Errorf("route %s: unknown tls_mode %q (want %q, %q or %q)", h, r.TLSMode, TLSNone, TLSACME, TLSPassthrough)
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
	return nil
}

// Upstream is one workload serving a route. Address is "host:port". Only
// healthy upstreams receive traffic.
type Upstream struct {
	WorkloadID string `json:"workload_id"`
	Address    string `json:"address"`
	Healthy    bool   `json:"healthy"`
}

// Normalize sorts routes by hostname and upstreams by workload id, in place.
func (t *Table) Normalize() {
	sort.Slice(t.Routes, func(i, j int) bool { return t.Routes[i].Hostname < t.Routes[j].Hostname })
	for i := range t.Routes {
		u := t.Routes[i].Upstreams
		sort.Slice(u, func(a, b int) bool { return u[a].WorkloadID < u[b].WorkloadID })
	}
}

// Digest returns the hex SHA-256 of the normalized table's routes (the revision
// is left out), so two tables that route the same way have the same digest.
func (t Table) Digest() string {
	c := Table{Routes: append([]Route(nil), t.Routes...)}
	c.Normalize()
	raw, _ := json.Marshal(c.Routes) // plain structs: cannot fail
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
