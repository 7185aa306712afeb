// Command berth-relay is the cluster relay: it holds one outbound session to berthd and carries
// every node connection accepted on its TLS listener to berthd over that session (docs/relay.md).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/relay"
)

const usage = `berth-relay: the cluster relay.

For a cluster whose nodes accept nothing inbound and cannot reach berthd, berth-relay runs on one
host that can. It dials berthd once (--core-url, a WebSocket carrying one multiplexed session) and
accepts the nodes' connections on its own TLS listener (--listen). Each node connection becomes one
stream to berthd; the relay never reads or changes what a node sends. When the session to berthd
is lost the relay reconnects with jittered backoff and, once it is back, asks the nodes it carried
to reconnect, spaced out over at most 5 s.

Each dial is a registration (this build, --node-id, the bound or --advertise address, and a
sequence that only grows). The first accepted one pins the cluster's credential generation; when
berthd says that generation was rotated away, the relay parks: it stays up, carries what it
carries, answers not ready and never registers again until it is restarted with the current
credential (--credential-file, from berth cluster relay-credential ensure|rotate).

/readyz on --health-listen answers 200 only while the session to berthd is established and
otherwise 503 with the reasons; /healthz and /metrics (Prometheus) are beside it. See docs/relay.md.

Usage: berth-relay --core-url wss://berthd.example:8443/... --tls-cert F --tls-key F [flags]

Flags:
`

// options are the command's flags.
type options struct {
	coreURL, coreCA, listen, healthListen string
	tlsCert, tlsKey, credentialFile       string
	nodeID, advertise                     string
	logLevel                              string
	showVersion                           bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("berth-relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.coreURL, "core-url", "", "berthd's relay endpoint, wss:// (or ws:// on loopback only) (required)")
	fs.StringVar(&o.coreCA, "core-ca", "", "PEM file of the CA that signs berthd's certificate (default: the system roots)")
	fs.StringVar(&o.listen, "listen", ":8443", "address of the TLS listener the cluster's nodes dial")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate chain the listener presents (required)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert (required)")
	fs.StringVar(&o.credentialFile, "credential-file", "", "file holding the cluster's relay credential, mode 0600 (sent as the bearer of the session)")
	fs.StringVar(&o.nodeID, "node-id", "", "the node this relay runs on as berthd knows it (nod_...), named in its registration; empty names none")
	fs.StringVar(&o.advertise, "advertise", "", "the address the nodes dial, named in the registration (default: the address --listen bound)")
	fs.StringVar(&o.healthListen, "health-listen", "127.0.0.1:9184", "address of the /readyz, /healthz and /metrics listener (empty: none)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.showVersion {
		return o, nil
	}
	var missing []string
	for _, f := range []struct{ name, v string }{{"--core-url", o.coreURL}, {"--tls-cert", o.tlsCert}, {"--tls-key", o.tlsKey}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return o, fmt.Errorf("missing %s (see --help)", strings.Join(missing, ", "))
	}
	u, err := url.Parse(o.coreURL)
	if err != nil {
		return o, fmt.Errorf("--core-url: %w", err)
	}
	switch {
	case u.Scheme == "wss" && u.Host != "":
	case u.Scheme == "ws" && isLoopback(u.Hostname()):
	default:
		return o, fmt.Errorf("--core-url %q: want a wss:// URL (ws:// only to a loopback address)", o.coreURL)
	}
	return o, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "berth-relay:", err)
		os.Exit(2)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	if o.showVersion {
		return version.Print(stdout, "berth-relay")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	var credential string
	if o.credentialFile != "" {
		b, err := securefile.ReadFile(o.credentialFile)
		if err != nil {
			return fmt.Errorf("--credential-file: %w", err)
		}
		credential = strings.TrimSpace(string(b))
	}
	clientTLS := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.coreCA != "" {
		pem, err := os.ReadFile(o.coreCA)
		if err != nil {
			return fmt.Errorf("--core-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--core-ca %s: no PEM certificate in it", o.coreCA)
		}
		clientTLS.RootCAs = pool
	}
	ln, err := tls.Listen("tcp", o.listen, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r, err := relay.Start(relay.Config{CoreURL: o.coreURL, Listener: ln, Credential: credential, Logger: log, Metrics: reg,
		Build: version.Version, NodeID: o.nodeID, Address: o.advertise,
		HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS, Proxy: http.ProxyFromEnvironment}}})
	if err != nil {
		_ = ln.Close()
		return err
	}
	log.Info("berth-relay started", "version", version.Version, "listen", ln.Addr().String(), "core", o.coreURL, "relay", r.ID())

	var health *http.Server
	if o.healthListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /readyz", r.ReadyHandler())
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		hl, err := net.Listen("tcp", o.healthListen)
		if err != nil {
			_ = r.Close()
			return fmt.Errorf("--health-listen: %w", err)
		}
		health = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = health.Serve(hl) }()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	log.Info("berth-relay stopping")
	if health != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = health.Shutdown(sctx)
		cancel()
	}
	return r.Close()
}
