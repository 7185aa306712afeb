// Command berth-plugin-gateway is the edge gateway provider plugin: it serves
// HTTP on --listen (and HTTPS on --tls-listen) with the gateway's reverse proxy
// and takes route tables from berthd over go-plugin. It is launched by berthd,
// not by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

// gcPercent is the gateway's GOGC unless the environment sets one.
const gcPercent = 400

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address the HTTP proxy listens on (host:port)")
	tlsListen := flag.String("tls-listen", "", "address the HTTPS listener (certificates and passthrough by SNI) listens on (empty: none)")
	stateDir := flag.String("state-dir", "", "directory keeping the applied route table across restarts (empty: memory only)")
	accessLog := flag.String("access-log", "", "file receiving one JSON line per request, rotated by size (empty: none)")
	accessLogMB := flag.Int("access-log-max-mb", 100, "size in MiB at which the access log is rotated")
	accessLogKeep := flag.Int("access-log-keep", 5, "rotated access logs kept")
	logFile := flag.String("log-file", "", "file receiving the gateway's own log as well as stderr, rotated by size (empty: stderr only)")
	metricsSocket := flag.String("metrics-socket", "", "unix socket serving the gateway's Prometheus metrics on /metrics (empty: none)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-gateway")
		return
	}
	// The gateway outlives berthd (docs/plugins.md section 5.3): once berthd
	// is gone, writes to the stderr pipe it held fail with EPIPE, which by
	// default would end this process with SIGPIPE. Ignored, a lost log line
	// is all it costs.
	signal.Ignore(syscall.SIGPIPE)
	if os.Getenv("GOGC") == "" {
		// The proxy's heap is small and short-lived; collecting less often
		// trades a few MiB for CPU on every request.
		debug.SetGCPercent(gcPercent)
	}
	var logOut io.Writer = os.Stderr
	if *logFile != "" {
		// Once berthd is gone nobody reads stderr, and a berthd that
		// reattaches never gets it back: the file keeps the log meanwhile.
		lf := &lumberjack.Logger{Filename: *logFile, MaxSize: 20, MaxBackups: 3}
		defer lf.Close()
		logOut = io.MultiWriter(bestEffort{lf}, bestEffort{os.Stderr})
	}
	logger := provider.NewLogger(logOut)
	fail := func(err error) {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-gateway: %v\n", err)
		os.Exit(1)
	}
	// The previous gateway may still be exiting after a crash of berthd.
	ln, err := gateway.Listen(context.Background(), *listen, 3*time.Second)
	if err != nil {
		fail(fmt.Errorf("cannot listen on %s: %w", *listen, err))
	}
	cfg := gateway.Config{Logger: logger}
	var tlsRaw net.Listener
	if *tlsListen != "" {
		tlsRaw, err = gateway.Listen(context.Background(), *tlsListen, 3*time.Second)
		if err != nil {
			fail(fmt.Errorf("cannot listen on %s: %w", *tlsListen, err))
		}
		cfg.HTTPSPort = tlsRaw.Addr().(*net.TCPAddr).Port
	}
	if *accessLog != "" {
		if *accessLogMB <= 0 || *accessLogKeep < 0 {
			fail(errors.New("--access-log-max-mb must be positive and --access-log-keep not negative"))
		}
		lj := &lumberjack.Logger{Filename: *accessLog, MaxSize: *accessLogMB, MaxBackups: *accessLogKeep}
		defer lj.Close()
		cfg.AccessLog = lj
	}
	reg := prometheus.NewRegistry()
	if *metricsSocket != "" {
		cfg.Metrics = reg
		if err := serveMetrics(*metricsSocket, reg); err != nil {
			// Counting goes on; only the exposition is missing.
			logger.Error("gateway metrics not served", "error", err)
		}
	}
	proxy := gateway.NewProxyWithConfig(cfg)
	defer proxy.Close()
	plugin, err := gateway.OpenPlugin(proxy, *stateDir)
	if err != nil {
		fail(err)
	}
	srv := gateway.NewServer(proxy)
	var tlsSrv *http.Server
	var tlsLn *gateway.TLSListener
	if tlsRaw != nil {
		tlsSrv, tlsLn = proxy.NewTLSServer(), proxy.NewTLSListener(tlsRaw)
	}
	if *stateDir != "" {
		err := gateway.WatchStateDir(context.Background(), *stateDir, time.Second, func(reason string) {
			logger.Warn("gateway stopping: it no longer owns its state directory", "reason", reason)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx) // ends with the process either way
			if tlsSrv != nil {
				_ = tlsSrv.Shutdown(ctx) // closes tlsLn
			}
			_ = proxy.Close()
			os.Exit(0)
		})
		if err != nil {
			fail(err)
		}
	}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			logger.Error("http server stopped", "error", err)
			os.Exit(1)
		}
	}()
	tlsAddr := ""
	if tlsSrv != nil {
		tlsAddr = tlsLn.Addr().String()
		go func() {
			if err := tlsSrv.Serve(tlsLn); err != nil && err != http.ErrServerClosed {
				logger.Error("https server stopped", "error", err)
				os.Exit(1)
			}
		}()
	}
	logger.Info("gateway listening", "addr", ln.Addr().String(), "tls_addr", tlsAddr, "access_log", *accessLog, "metrics_socket", *metricsSocket)
	provider.ServeDetachable(plugin)
}

// bestEffort is a writer whose failures are dropped, so that one dead
// destination of a tee does not silence the others.
type bestEffort struct{ w io.Writer }

func (b bestEffort) Write(p []byte) (int, error) {
	_, _ = b.w.Write(p)
	return len(p), nil
}

// serveMetrics serves reg on /metrics over the unix socket at path (0600),
// replacing a socket left by a previous gateway.
func serveMetrics(path string, reg *prometheus.Registry) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("metrics socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("metrics socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("metrics socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("metrics socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: nil}
	go func() { _ = srv.Serve(ln) }() // ends with the process
	return nil
}
