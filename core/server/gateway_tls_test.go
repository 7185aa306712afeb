package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/tlstest"
)

// TestGatewayTLSListen: with GatewayTLSListen set, the gateway berthd
// launches serves the certificates of the tables it is given on that
// address (docs/plugins.md section 5.6).
func TestGatewayTLSListen(t *testing.T) {
	t.Parallel()
	pluginDir := filepath.Dir(conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-gateway"))
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "app "+r.Header.Get("X-Forwarded-Proto"))
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = backend.Serve(ln) }()
	t.Cleanup(func() { _ = backend.Close() })

	cfg := Config{DataDir: t.TempDir(), PluginDir: pluginDir, GatewayListen: proctest.FreeAddr(t), GatewayTLSListen: proctest.FreeAddr(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sink, err := startGateway(ctx, cfg, newProviders(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.p.Close() })

	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t, "web.example.test")
	table := abiroutes.Table{Revision: 1, Routes: []abiroutes.Route{{Hostname: "web.example.test", Project: "default", Service: "web",
		TLSMode: abiroutes.TLSManual, Upstreams: []abiroutes.Upstream{{WorkloadID: "wl_1", Address: ln.Addr().String(), Healthy: true}}}},
		Certificates: []abiroutes.Certificate{{Names: []string{"web.example.test"}, CertPEM: string(leaf.Chain), KeyPEM: string(leaf.KeyPEM), NotAfter: leaf.Cert.NotAfter}}}
	if err := sink.SetRoutes(ctx, table); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", cfg.GatewayTLSListen)
		},
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool}, ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://web.example.test/")
	if err != nil {
		t.Fatalf("HTTPS through the gateway berthd launched: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != "app https" || resp.Proto != "HTTP/2.0" {
		t.Fatalf("HTTPS: %d %s %q %v", resp.StatusCode, resp.Proto, body, err)
	}
}
