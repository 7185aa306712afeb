// Command berth-plugin-containerd is the "containerd" runtime driver plugin of
// the agent: OCI containers through containerd. Launched by the agent, not by hand.
// containerd's shim runs the same binary as each container's log writer
// (docs/logs.md section 4): it sets CONTAINER_ID and CONTAINER_NAMESPACE.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/nodeplugins/containerd"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

func main() {
	if logwriter.StartedByShim() {
		os.Exit(logwriter.Main(os.Args[1:]))
	}
	stateDir := flag.String("state-dir", "", "directory of the driver's fencing and idempotency records (required)")
	address := flag.String("address", envOr("BERTH_CONTAINERD_ADDRESS", containerd.DefaultAddress), "containerd socket, never Docker's (env BERTH_CONTAINERD_ADDRESS)")
	namespace := flag.String("namespace", envOr("BERTH_CONTAINERD_NAMESPACE", containerd.DefaultNamespace), "containerd namespace of Berth's workloads (env BERTH_CONTAINERD_NAMESPACE)")
	snapshotter := flag.String("snapshotter", "", "containerd snapshotter (default: the daemon's)")
	plainHTTP := flag.String("plain-http-registries", "", "comma-separated registry hosts pulled over plain HTTP (loopback always is)")
	logWriter := flag.Bool("log-writer", true, "have containerd's shim run this binary as each container's log writer, which stamps its output into segments (docs/logs.md); false appends it to one file")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-containerd")
		return
	}

	var writer string
	if *logWriter {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "berth-plugin-containerd: find own binary for the log writer: %v\n", err)
			os.Exit(1)
		}
		writer = exe
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	var hosts []string
	if *plainHTTP != "" {
		hosts = strings.Split(*plainHTTP, ",")
	}
	d, err := containerd.New(ctx, containerd.Config{
		Address: *address, Namespace: *namespace, StateDir: *stateDir, Snapshotter: *snapshotter,
		PlainHTTPRegistries: hosts, Logger: runtime.NewLogger(os.Stderr), LogWriter: writer,
	})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-plugin-containerd: %v\n", err)
		os.Exit(1)
	}
	defer d.Close()
	runtime.Serve(d)
}

// envOr returns the environment variable name, or def when it is empty. The
// agent's environment reaches the plugin, so an operator sets these for the
// agent.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
