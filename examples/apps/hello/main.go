// Command hello is Berth's example service: a tiny HTTP server that answers
// which workload served the request, with a health endpoint for checks.
//
// It listens on HOST:PORT (HOST empty means all interfaces, PORT defaults to
// 8080), answers "GET /" with "<GREETING> from <BERTH_WORKLOAD_ID> (<hostname>)"
// (GREETING defaults to "hello")
// and "GET /healthz" with "ok", and shuts down gracefully on SIGTERM or
// interrupt, giving requests in flight up to 5 seconds.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// shutdownGrace bounds how long requests in flight may take after SIGTERM.
const shutdownGrace = 5 * time.Second

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, nil))
	if err := run(logger); err != nil {
		logger.Error("hello: exiting", "error", err)
		os.Exit(1)
	}
}

// run listens on the configured address and serves until SIGTERM or interrupt.
func run(logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("HOST"), port))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	workloadID := os.Getenv("BERTH_WORKLOAD_ID")
	if workloadID == "" {
		workloadID = "unknown"
	}
	hostname, err := os.Hostname()
	if err != nil {
		hostname = "unknown"
	}
	word := os.Getenv("GREETING")
	if word == "" {
		word = "hello"
	}
	logger.Info("hello: listening", "addr", ln.Addr().String(), "workload_id", workloadID, "hostname", hostname)
	return serve(ctx, ln, newHandler(word, workloadID, hostname))
}

// serve serves h on ln until ctx is done, then shuts down gracefully within
// shutdownGrace. It returns nil after a clean shutdown.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// newHandler returns the service's routes: "GET /" greets with word, the
// workload id and hostname, "GET /healthz" answers "ok"; anything else is 404.
func newHandler(word, workloadID, hostname string) http.Handler {
	greeting := fmt.Sprintf("%s from %s (%s)\n", word, workloadID, hostname)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, greeting)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}
