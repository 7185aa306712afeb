package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/caddytest"
	"github.com/berthhq/berth/internal/proctest"
)

// caddyPeer is how the gateway benchmarks configure Caddy as a reverse
// proxy to their backend.
type caddyPeer struct {
	backend string
	// accessLog, when not "", is the file Caddy writes its access log
	// to (JSON lines).
	accessLog string
	// certDir, when not "", holds cert.pem and key.pem: Caddy then
	// terminates TLS with them (HTTP/2 and HTTP/1.1 by ALPN).
	certDir string
}

// startCaddy runs Caddy (make bench installs it, as make test does for the
// Caddy adapter's tests) with its admin API on a free port, as the Caddy
// adapter's tests start it (internal/caddytest), and loads a configuration
// equivalent to the nginx peer's: one server, a reverse_proxy to the
// backend with a keep-alive pool of as many idle connections per host as
// nginx's (256), automatic HTTPS off, no access log unless asked, HTTP/3
// off. It returns the server's address.
func startCaddy(b *testing.B, peer caddyPeer) string {
	b.Helper()
	dir := b.TempDir()
	admin, addr := proctest.FreeAddr(b), proctest.FreeAddr(b)
	srv, err := caddytest.StartDir(caddytest.Binary(b), admin, dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	server := map[string]any{
		"listen":          []string{addr},
		"automatic_https": map[string]any{"disable": true},
		"protocols":       []string{"h1", "h2"},
		"routes": []any{map[string]any{"handle": []any{map[string]any{
			"handler":   "reverse_proxy",
			"upstreams": []any{map[string]any{"dial": peer.backend}},
			"transport": map[string]any{
				"protocol":   "http",
				"keep_alive": map[string]any{"enabled": true, "max_idle_conns_per_host": 256},
			},
		}}}},
	}
	apps := map[string]any{"http": map[string]any{"servers": map[string]any{"bench": server}}}
	cfg := map[string]any{"admin": map[string]any{"listen": admin}, "apps": apps}
	if peer.certDir != "" {
		server["tls_connection_policies"] = []any{map[string]any{}}
		apps["tls"] = map[string]any{"certificates": map[string]any{"load_files": []any{map[string]any{
			"certificate": filepath.Join(peer.certDir, "cert.pem"), "key": filepath.Join(peer.certDir, "key.pem"),
		}}}}
	}
	if peer.accessLog != "" {
		server["logs"] = map[string]any{}
		cfg["logging"] = map[string]any{"logs": map[string]any{
			"default": map[string]any{"exclude": []string{"http.log.access"}},
			"access": map[string]any{
				"writer":  map[string]any{"output": "file", "filename": peer.accessLog},
				"encoder": map[string]any{"format": "json"},
				"include": []string{"http.log.access"},
			},
		}}
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Post("http://"+admin+"/load", "application/json", bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("load the caddy config: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("load the caddy config: %s: %s", resp.Status, body)
	}
	return addr
}
