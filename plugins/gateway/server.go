package gateway

import (
	"net/http"
	"time"
)

// NewServer returns the gateway's HTTP server for h: HTTP/1.1 and, on the
// same plain listener, HTTP/2 without TLS (h2c, prior knowledge) from
// clients; upstreams are always spoken to in HTTP/1.1 (docs/plugins.md
// section 5.4). Header reads are bounded; bodies are not, so that long
// uploads and streamed responses (server-sent events, long polls) are never
// cut.
func NewServer(h http.Handler) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    1 << 20,
	}
}
