// Package caddy is the external gateway adapter: a gateway provider
// (docs/plugins.md section 5.7) that serves Berth's route table through an
// external Caddy, pushed over Caddy's admin API as JSON config.
package caddy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/berthhq/berth/abi/routes"
)

// ServerName is the name of the HTTP server the adapter owns in Caddy's
// config (apps.http.servers.berth).
const ServerName = "berth"

// Default upstream timeouts, the built-in gateway's (docs/plugins.md
// section 5.4), in milliseconds.
const (
	defaultConnectMS        = 5_000
	defaultResponseHeaderMS = 60_000
	defaultIdleMS           = 90_000
)

// Render returns the whole Caddy config (JSON) that serves t on listen with
// Caddy's admin API kept on admin (both "host:port"): one HTTP server,
// automatic HTTPS off, one route per hostname, and a last route answering
// every other host 404 no_route. The mapping, route by route:
//
//   - hostnames match case-insensitively, with or without a trailing dot;
//     the routes of exact hostnames come before those of wildcards;
//   - a route with healthy upstreams is a reverse_proxy to them, round
//     robin, with the route's timeouts (or the defaults) as the transport's
//     dial, response-header and keep-alive idle timeouts, and flushing every
//     write when the route streams;
//   - a route without a healthy upstream answers 503 no_healthy_upstream
//     with Retry-After: 1;
//   - a route with allow_sources serves clients whose TCP peer lies in them
//     (Caddy's remote_ip matcher, which ignores forwarded headers) and
//     answers others 403 source_not_allowed;
//   - a route whose tls_mode asks for TLS (acme, manual, passthrough) is
//     never served in plain HTTP: it answers 421 tls_unavailable, as the
//     built-in gateway does until TLS is configured;
//   - a route's path_prefix is a path_regexp matcher anchored on a segment
//     boundary ("^/api(/|$)": case-sensitive, on the cleaned path, as the
//     built-in gateway matches), its header matches a header_regexp matcher
//     with one exact, anchored pattern per name (any line of the field may
//     match), and strip_prefix a rewrite handler with strip_path_prefix
//     ahead of the reverse_proxy;
//   - the routes of a hostname keep the table's precedence order (Caddy
//     tries routes in order and the first match ends), and a hostname
//     whose routes all have match conditions ends with a route answering
//     404 no_route, so a request none of them matches never falls through
//     to another hostname's (wildcard) route.
//
// Render is deterministic: the same table gives the same bytes.
func Render(t routes.Table, listen, admin string) ([]byte, error) {
	t.Normalize()
	// Exact hostnames before wildcards: Caddy tries routes in order, and
	// the built-in gateway serves a hostname's own routes before a wildcard
	// that covers it.
	t.Routes = slices.Concat(
		slices.DeleteFunc(slices.Clone(t.Routes), func(r routes.Route) bool { return strings.HasPrefix(r.Hostname, "*.") }),
		slices.DeleteFunc(slices.Clone(t.Routes), func(r routes.Route) bool { return !strings.HasPrefix(r.Hostname, "*.") }))
	rs := make([]any, 0, len(t.Routes)+1)
	for i, r := range t.Routes {
		rs = append(rs, renderRoute(r)...)
		// Normalized, a hostname's route without conditions comes last.
		if r.Conditions() > 0 && (i+1 == len(t.Routes) || t.Routes[i+1].Hostname != r.Hostname) {
			rs = append(rs, route(map[string]any{"host": []string{r.Hostname, r.Hostname + "."}},
				problem(404, "no_route", "no-route", "no route for request", "no route of this host matches the request's path and headers")))
		}
	}
	rs = append(rs, map[string]any{"handle": []any{problem(404, "no_route", "no-route", "no route for host", "no service is routed at this host")}})
	cfg := map[string]any{
		"admin": map[string]any{"listen": admin},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{ServerName: map[string]any{
			"listen":          []string{listen},
			"automatic_https": map[string]any{"disable": true},
			"routes":          rs,
		}}}},
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("render the caddy config: %w", err)
	}
	return raw, nil
}

// renderRoute returns the Caddy routes of r: one, or two with
// allow_sources (the allowed clients' and the others' 403).
func renderRoute(r routes.Route) []any {
	hosts := []string{r.Hostname, r.Hostname + "."}
	match := map[string]any{"host": hosts}
	addConditions(match, r)
	if r.TLSMode != "" && r.TLSMode != routes.TLSNone {
		return []any{route(match, problem(421, "tls_unavailable", "tls-unavailable", "tls unavailable",
			"this gateway serves plain HTTP only; the route asks for tls_mode "+r.TLSMode))}
	}
	var handle []map[string]any
	var dials []any
	for _, u := range r.Upstreams {
		if u.Healthy {
			dials = append(dials, map[string]any{"dial": u.Address})
		}
	}
	if len(dials) == 0 {
		p := problem(503, "no_healthy_upstream", "no-healthy-upstream", "no healthy upstream", "the route has no healthy upstream")
		p["headers"].(map[string]any)["Retry-After"] = []string{"1"}
		handle = []map[string]any{p}
	} else {
		if r.StripPrefix && r.PathPrefix != "" {
			handle = append(handle, map[string]any{"handler": "rewrite", "strip_path_prefix": r.PathPrefix})
		}
		handle = append(handle, proxy(r, dials))
	}
	if len(r.AllowSources) > 0 {
		allowed := map[string]any{"remote_ip": map[string]any{"ranges": r.AllowSources}}
		for k, v := range match {
			allowed[k] = v
		}
		return []any{route(allowed, handle...),
			route(match, problem(403, "source_not_allowed", "source-not-allowed", "source not allowed", "the client's address may not use this route"))}
	}
	return []any{route(match, handle...)}
}

// addConditions adds r's match conditions to the matcher set m
// (docs/routes.md section 3): the path prefix on a segment boundary, and
// each header's value exactly, as regular expressions quoted whole.
func addConditions(m map[string]any, r routes.Route) {
	if r.PathPrefix != "" {
		m["path_regexp"] = map[string]any{"pattern": "^" + regexp.QuoteMeta(r.PathPrefix) + "(/|$)"}
	}
	if len(r.Headers) > 0 {
		hs := make(map[string]any, len(r.Headers))
		for _, h := range r.Headers {
			hs[h.Name] = map[string]any{"pattern": "^" + regexp.QuoteMeta(h.Value) + "$"}
		}
		m["header_regexp"] = hs
	}
}

func route(match map[string]any, handle ...map[string]any) map[string]any {
	hs := make([]any, len(handle))
	for i, h := range handle {
		hs[i] = h
	}
	return map[string]any{"match": []any{match}, "handle": hs, "terminal": true}
}

func proxy(r routes.Route, dials []any) map[string]any {
	ms := func(v, def int64) string {
		if v == 0 {
			v = def
		}
		return strconv.FormatInt(v, 10) + "ms"
	}
	h := map[string]any{
		"handler":   "reverse_proxy",
		"upstreams": dials,
		"load_balancing": map[string]any{
			"selection_policy": map[string]any{"policy": "round_robin"},
			"retries":          len(dials) - 1,
		},
		"transport": map[string]any{
			"protocol":                "http",
			"dial_timeout":            ms(r.Timeouts.ConnectMS, defaultConnectMS),
			"response_header_timeout": ms(r.Timeouts.ResponseHeaderMS, defaultResponseHeaderMS),
			"keep_alive":              map[string]any{"enabled": true, "idle_timeout": ms(r.Timeouts.IdleMS, defaultIdleMS)},
		},
	}
	if r.Stream {
		h["flush_interval"] = -1
	}
	return h
}

// problem is a static problem+json answer marked with X-Berth-Gateway, as
// the built-in gateway's own answers are (docs/plugins.md section 5.2).
func problem(status int, code, mark, title, detail string) map[string]any {
	body, _ := json.Marshal(map[string]any{"title": title, "status": status, "code": code, "detail": detail}) // plain values: cannot fail
	return map[string]any{
		"handler":     "static_response",
		"status_code": status,
		"headers": map[string]any{
			"Content-Type":    []string{"application/problem+json"},
			"X-Berth-Gateway": []string{mark},
		},
		"body": string(body),
	}
}
