package ui

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

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
// from the network, without a loopback connection or TLS. Answers are buffered, except those
// of a request that accepts application/x-ndjson (a followed log): those stream ([inProcess.stream]).
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
	if strings.Contains(req.Header.Get("Accept"), ndjson) {
		return t.stream(req, in)
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

// ndjson is the media type of the API's streamed answers (a followed log, docs/api.md section 9).
const ndjson = "application/x-ndjson"

// stream serves in with the API's handler on a goroutine and answers as soon as the handler
// sent its status, with a body that carries its writes as they come: a followed log reaches the
// dashboard line by line. The handler's trailers (those its "Trailer" header names) are in the
// answer's Trailer once the body read io.EOF. The handler stops when req's context ends or the
// caller closes the body (its next write fails).
func (t inProcess) stream(req, in *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	sw := &streamWriter{header: http.Header{}, pw: pw, started: make(chan struct{})}
	trailer := http.Header{}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				// As net/http does for a handler on its own goroutine: the answer is cut
				// short, the process lives on.
				_ = pw.CloseWithError(fmt.Errorf("ui: the API's handler panicked: %v", p))
			}
			sw.WriteHeader(http.StatusOK) // a handler that wrote nothing answered 200
			for _, k := range sw.header.Values("Trailer") {
				for _, name := range strings.Split(k, ",") {
					name = http.CanonicalHeaderKey(strings.TrimSpace(name))
					if v := sw.header.Values(name); len(v) > 0 {
						trailer[name] = v
					}
				}
			}
			_ = pw.Close()
			if req.Body != nil {
				req.Body.Close()
			}
		}()
		t.api.ServeHTTP(sw, in)
	}()
	select {
	case <-sw.started:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:        strconv.Itoa(sw.code) + " " + http.StatusText(sw.code),
		StatusCode:    sw.code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        sw.sent,
		Body:          pr,
		ContentLength: -1,
		Trailer:       trailer,
		Request:       req,
	}, nil
}

// streamWriter is the http.ResponseWriter of a streamed in-process API call: the status and
// a copy of the headers are taken at the first WriteHeader (or Write), and every write goes
// to the pipe the answer's body reads.
type streamWriter struct {
	header  http.Header
	sent    http.Header
	code    int
	pw      *io.PipeWriter
	once    sync.Once
	started chan struct{}
}

func (w *streamWriter) Header() http.Header { return w.header }

// WriteHeader records code and the headers as sent; later calls do nothing.
func (w *streamWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(p)
}

// Flush implements http.Flusher: writes reach the reader as they are made, so it only sends
// the status when nothing was written yet.
func (w *streamWriter) Flush() { w.WriteHeader(http.StatusOK) }
