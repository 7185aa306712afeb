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
	"os/signal"
	"syscall"
	"time"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address the HTTP proxy listens on (host:port)")
	stateDir := flag.String("state-dir", "", "directory keeping the applied route table across restarts (empty: memory only)")
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
	logger := provider.NewLogger(os.Stderr)
	// The previous gateway may still be exiting after a crash of berthd.
	ln, err := gateway.Listen(context.Background(), *listen, 3*time.Second)
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-gateway: cannot listen on %s: %v\n", *listen, err)
		os.Exit(1)
	}
	proxy := gateway.NewProxy(logger)
	plugin, err := gateway.OpenPlugin(proxy, *stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-gateway: %v\n", err)
		os.Exit(1)
	}
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
	provider.ServeDetachable(plugin)
}
