package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strings"
)

const (
	// apiPrefix is where every path of the API lives under the server URL.
	apiPrefix = "/api/v1"
	// maxAnswer bounds a JSON answer the client decodes.
	maxAnswer = 32 << 20
	// maxProblem bounds an error answer the client reads.
	maxProblem = 64 << 10
	// defaultUserAgent is sent when WithUserAgent is not given.
	defaultUserAgent = "berth-go-client"
)

// Client calls Berth's HTTP API. It is safe for concurrent use by several
// goroutines; its configuration does not change after New.
type Client struct {
	base      string // scheme://host[:port][/path], no trailing slash
	token     string
	hc        *http.Client
	userAgent string
	optErr    error // the first error of an Option, returned by New
	// idemKey, when not empty, is sent as Idempotency-Key on every mutating call.
	idemKey string
}

// HeaderIdempotencyKey names the request header that makes a mutating call replayable
// (docs/api.md section 1.7); HeaderIdempotencyReplayed is "true" on an answer replayed from the
// server's record.
const (
	HeaderIdempotencyKey      = "Idempotency-Key"
	HeaderIdempotencyReplayed = "Idempotency-Replayed"
)

// HeaderPolicyWarning is the header an answer carries once per policy warning of an admission
// (a module that failed under failure_policy ignore, or one that warned while allowing).
const HeaderPolicyWarning = "Berth-Policy-Warning"

// WithIdempotencyKey returns a copy of c that sends key (1 to 200 printable ASCII characters) as
// the Idempotency-Key header of every mutating call (POST, PUT, DELETE); c is unchanged. Repeating
// a call through the copy with the same arguments within 24 hours answers what the first
// successful one answered and changes nothing again; the same key with other arguments fails
// with code "idempotency_key_reused", and a repeat while the first call still runs with
// "idempotency_key_in_flight" (retry shortly). Use one key per logical change, e.g. to retry a
// call whose answer was lost. A refused or failed call records nothing: retrying it runs again.
func (c *Client) WithIdempotencyKey(key string) *Client {
	cp := *c
	cp.idemKey = key
	return &cp
}

// New returns a client of the Berth server at server, an http or https URL
// (a path prefix is kept; "/api/v1" is added to it). Without WithHTTPClient it
// uses its own *http.Client with the default transport and no overall
// timeout: bound calls with their ctx.
func New(server string, opts ...Option) (*Client, error) {
	server = strings.TrimSpace(server)
	if !strings.Contains(server, "://") {
		return nil, fmt.Errorf("berth client: server URL %q needs a scheme, e.g. http://%s", server, server)
	}
	u, err := url.Parse(server)
	if err != nil {
		return nil, fmt.Errorf("berth client: server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("berth client: server URL %q: scheme must be http or https", server)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("berth client: server URL %q has no host", server)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("berth client: server URL %q must not carry credentials, a query or a fragment", server)
	}
	c := &Client{
		base:      strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"),
		hc:        &http.Client{},
		userAgent: defaultUserAgent,
	}
	for _, o := range opts {
		o(c)
	}
	if c.optErr != nil {
		return nil, fmt.Errorf("berth client: %w", c.optErr)
	}
	return c, nil
}

// Server returns the server URL the client calls, without "/api/v1".
func (c *Client) Server() string { return c.base }

// do sends one request and decodes a 2xx JSON answer into out (nil: discard).
// A non-2xx answer becomes an *APIError.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType string, auth bool, out any) error {
	resp, err := c.send(ctx, method, path, query, body, contentType, "application/json", auth)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblem))
		return nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// doJSON sends in as a JSON body.
func (c *Client) doJSON(ctx context.Context, method, path string, in any, auth bool, out any) error {
	_, err := c.doJSONHeader(ctx, method, path, in, auth, out)
	return err
}

// doJSONHeader is doJSON that also returns the headers of a 2xx answer.
func (c *Client) doJSONHeader(ctx context.Context, method, path string, in any, auth bool, out any) (http.Header, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%s %s: encode request: %w", method, path, err)
	}
	resp, err := c.send(ctx, method, path, nil, bytes.NewReader(b), "application/json", "application/json", auth)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblem))
		return resp.Header, nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out); err != nil {
		return nil, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return resp.Header, nil
}

// send builds and sends a request; it returns the response only for a 2xx
// status, and the caller closes its body.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType, accept string, auth bool) (*http.Response, error) {
	return c.sendWith(ctx, method, path, query, body, contentType, accept, auth, nil)
}

// sendWith is send with extra request headers (nil: none).
func (c *Client) sendWith(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType, accept string, auth bool, hdr http.Header) (*http.Response, error) {
	target := c.base + apiPrefix + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	reqBody := body
	if rc, ok := body.(io.ReadCloser); ok {
		reqBody = io.NopCloser(rc) // net/http would close it; the caller owns it
	}
	req, err := http.NewRequestWithContext(ctx, method, target, reqBody)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		setContentLength(req, body)
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", accept+", application/problem+json")
	req.Header.Set("User-Agent", c.userAgent)
	if c.idemKey != "" && (method == http.MethodPost || method == http.MethodPut || method == http.MethodDelete) {
		req.Header.Set(HeaderIdempotencyKey, c.idemKey)
	}
	for k, v := range hdr {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	if auth && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err // a *url.Error: it names the method and URL already
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeProblem(resp)
	}
	return resp, nil
}

// setContentLength gives req a length when body can report one, so large
// uploads are not sent chunked.
func setContentLength(req *http.Request, body io.Reader) {
	if req.ContentLength > 0 {
		return // bytes.Reader, strings.Reader, bytes.Buffer: set by net/http
	}
	switch b := body.(type) {
	case interface{ Len() int }:
		if n := b.Len(); n > 0 {
			req.ContentLength = int64(n)
		}
	case *os.File:
		info, err := b.Stat()
		if err != nil || !info.Mode().IsRegular() {
			return
		}
		off, err := b.Seek(0, io.SeekCurrent)
		if err != nil {
			return
		}
		if n := info.Size() - off; n > 0 {
			req.ContentLength = n
		}
	}
}

// decodeProblem turns a non-2xx answer into an *APIError. An answer that is
// not problem+json keeps the start of its body as the detail.
func decodeProblem(resp *http.Response) *APIError {
	e := &APIError{Status: resp.StatusCode}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	if resp.Header.Get("X-Berth-Gateway") != "" {
		// The edge gateway answered, not the API: a common mix-up of ports.
		e.Problem = Problem{Title: "not the Berth API", Status: resp.StatusCode, Code: "not_the_api",
			Detail: "this address is Berth's edge gateway, not its API; use berthd's --listen address (default https://127.0.0.1:7070)"}
		return e
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" || mt == "application/json" {
		if err := json.Unmarshal(raw, &e.Problem); err == nil && e.Problem.Code != "" {
			if e.Problem.Status == 0 {
				e.Problem.Status = resp.StatusCode
			}
			return e
		}
	}
	e.Problem = Problem{Title: http.StatusText(resp.StatusCode), Status: resp.StatusCode}
	detail := strings.TrimSpace(string(raw))
	if len(detail) > 200 {
		detail = detail[:200] + "…"
	}
	e.Problem.Detail = detail
	return e
}

// APIError is a non-2xx answer of the server. Problem is the decoded
// problem+json body; for an answer that is not one (a proxy's error page), its
// Code is empty and Detail holds the start of the body.
type APIError struct {
	Status  int
	Problem Problem
}

// Error reads "code: detail (status)", for example
// `service_not_found: no service "x" in project "default" (404)`.
func (e *APIError) Error() string {
	msg := e.Problem.Detail
	if msg == "" {
		msg = e.Problem.Title
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	code := e.Problem.Code
	if code == "" {
		code = "http_error"
	}
	return fmt.Sprintf("%s: %s (%d)", code, msg, e.Status)
}

// IsCode reports whether err is or wraps an *APIError whose problem code is
// code (a value of abi/errors, such as "service_not_found").
func IsCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Problem.Code == code
}

// pathEscape escapes one path segment.
func pathEscape(s string) string { return url.PathEscape(s) }
