// Command berth-plugin-caddy is the external gateway adapter: a gateway
// provider plugin that serves berthd's route tables through an external
// Caddy, loaded over Caddy's admin API (docs/plugins.md section 5.7). It is
// launched by berthd in place of berth-plugin-gateway, not by hand.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/caddy"
	"github.com/berthhq/berth/sdk/provider"
)

func main() {
	admin := flag.String("admin", "127.0.0.1:2019", "address of Caddy's admin API (host:port, loopback)")
	listen := flag.String("listen", "127.0.0.1:8080", "address Caddy serves the routes on (host:port)")
	stateDir := flag.String("state-dir", "", "directory keeping the applied route table and the fencing records (empty: memory only)")
	timeout := flag.Duration("admin-timeout", 30*time.Second, "bound on one call of Caddy's admin API")
	// berthd passes the built-in gateway's flags to whichever plugin is its
	// gateway; Caddy keeps its own logs and metrics, so these are accepted
	// and not used.
	_ = flag.String("access-log", "", "accepted and not used: Caddy writes its own access log")
	_ = flag.String("metrics-socket", "", "accepted and not used: Caddy serves its own metrics")
	_ = flag.String("log-file", "", "accepted and not used: the adapter logs to berthd over stderr")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-caddy")
		return
	}
	logger := provider.NewLogger(os.Stderr)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	p, err := caddy.Open(ctx, caddy.Config{Admin: strings.TrimPrefix(*admin, "http://"), Listen: *listen, StateDir: *stateDir, Timeout: *timeout, Logger: logger})
	cancel()
	if err != nil {
		// "[ERROR]" makes the host log this line at error level.
		fmt.Fprintf(os.Stderr, "[ERROR] berth-plugin-caddy: %v\n", err)
		os.Exit(1)
	}
	provider.Serve(p)
}
