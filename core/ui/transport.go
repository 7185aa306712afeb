package ui

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/berthhq/berth/sdk/client"
)

// apiBase is the base URL the dashboard's API client uses. Its requests never reach a
// network: [inProcess] hands them to the API's handler in this process.
const apiBase = "http://berthd.internal"

// remoteKey carries the browser's address into the API requests made on its behalf, so the
// API's per-address login limit counts the browser, not the dashboard.
type remoteKey struct{}

// inProcess is an http.RoundTripper that serves each request with the API's handler in this
// process: the same routing, authentication, scopes, admission and idempotency as a request
// from the network, without a loopback connection or TLS. Answers are buffered; the dashboard
// makes no streaming API calls.
type inProcess struct{ api http.Handler }

// RoundTrip implements http.RoundTripper.
func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "127.0.0.1:0"
	if addr, ok := req.Context().Value(remoteKey{}).(string); ok && addr != "" {
		in.RemoteAddr = addr
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	t.api.ServeHTTP(rec, in)
	if req.Body != nil {
		req.Body.Close()
	}
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return &http.Response{
		Status:        strconv.Itoa(rec.code) + " " + http.StatusText(rec.code),
		StatusCode:    rec.code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        rec.header,
		Body:          io.NopCloser(bytes.NewReader(rec.body.Bytes())),
		ContentLength: int64(rec.body.Len()),
		Request:       req,
	}, nil
}

// recorder is the buffered http.ResponseWriter of an in-process API call.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(p)
}

// Flush implements http.Flusher (a no-op: the answer is buffered).
func (r *recorder) Flush() {}

// client returns an API client acting with bearer for the browser request r (its context and
// address). An empty bearer sends none (login).
func (h *Handler) client(r *http.Request, bearer string) (*client.Client, context.Context) {
	c, err := client.New(apiBase, client.WithToken(bearer), client.WithUserAgent("berth-dashboard"),
		client.WithHTTPClient(&http.Client{Transport: h.api}))
	if err != nil {
		panic("ui: the fixed API base URL does not parse: " + err.Error())
	}
	return c, context.WithValue(r.Context(), remoteKey{}, r.RemoteAddr)
}
