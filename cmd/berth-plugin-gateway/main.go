// Command berth-plugin-gateway is the edge gateway provider plugin: it serves
// HTTP on --listen with the gateway's reverse proxy and takes route tables from
// berthd over go-plugin. It is launched by berthd, not by hand.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address the HTTP proxy listens on (host:port)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-gateway")
		return
	}

	logger := provider.NewLogger(os.Stderr)
	// The previous gateway may still be exiting after a crash of berthd.
	ln, err := gateway.Listen(context.Background(), *listen, 3*time.Second)
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-gateway: cannot listen on %s: %v\n", *listen, err)
		os.Exit(1)
	}
	proxy := gateway.NewProxy(logger)
	srv := &http.Server{
		Handler:           proxy,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    1 << 20,
		// No ReadTimeout or WriteTimeout: they would cut long uploads and
		// streamed responses (server-sent events, long polls).
	}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			logger.Error("http server stopped", "error", err)
			os.Exit(1)
		}
	}()
	logger.Info("gateway listening", "addr", ln.Addr().String())
	provider.Serve(gateway.NewPlugin(proxy))
}
