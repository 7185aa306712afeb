package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/routes"
)

// cannedBackend is an upstream that answers every HTTP/1.1 request on a
// keep-alive connection with the same 13-byte response, read and written
// without allocating per request, so that a benchmark of the proxy counts
// the proxy's allocations (and its transport's) only.
func cannedBackend(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					// A request without a body ends at its first empty line.
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(bytes.TrimSpace(line)) == 0 {
							break
						}
					}
					if _, err := c.Write(answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// discardWriter is a ResponseWriter that keeps nothing, reused across
// iterations.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.status = code }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) Flush()                      {}

// BenchmarkProxyServeHTTP: the proxy's own cost per request (allocs/op
// above all) for a small answer of known length, the request handed to
// Proxy.ServeHTTP directly and answered by a canned upstream over a pooled
// keep-alive connection; with and without metrics and access log, and
// through a hostname of several routes chosen by path prefix and header.
func BenchmarkProxyServeHTTP(b *testing.B) {
	for _, bc := range []struct {
		name    string
		observe bool
		// match routes the request through a hostname of four routes
		// with path prefixes and headers (docs/routes.md section 3).
		match bool
	}{{"bare", false, false}, {"metrics+log", true, false}, {"bare+match", false, true}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := Config{}
			if bc.observe {
				cfg.Metrics = prometheus.NewRegistry()
				cfg.AccessLog = io.Discard
			}
			p := NewProxyWithConfig(cfg)
			b.Cleanup(func() { p.Close() })
			table, path := oneRoute(healthy("wl_bench", cannedBackend(b))), "/"
			if bc.match {
				r := table.Routes[0]
				api, canary, v2 := r, r, r
				api.PathPrefix = "/api"
				canary.PathPrefix, canary.Headers = "/api", []routes.HeaderMatch{{Name: "X-Env", Value: "canary"}}
				v2.PathPrefix = "/api/v2"
				table.Routes = append(table.Routes, api, canary, v2)
				path = "/api/users/7"
			}
			p.SetTable(table)
			ctx, cancel := context.WithCancel(context.Background())
			b.Cleanup(cancel)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+testHost+path, nil)
			if err != nil {
				b.Fatal(err)
			}
			if bc.match {
				req.Header.Set("X-Env", "canary")
			}
			req.RemoteAddr = "127.0.0.1:40000"
			req.Header.Set("User-Agent", "bench")
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				clear(w.h)
				w.status = 0
				delete(req.Header, RequestIDHeader)
				p.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					b.Fatalf("status %d", w.status)
				}
			}
		})
	}
}
