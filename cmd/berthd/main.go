// Command berthd is Berth's control plane: the API, node sessions, the
// scheduler and the gateway plugin, on one MongoDB (or the embedded store).
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/berthhq/berth/core/server"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/internal/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := pflag.NewFlagSet("berthd", pflag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd runs Berth's control plane.

Usage:
  berthd --data-dir DIR [--listen HOST:PORT] [--gateway-listen HOST:PORT] [--mongo-uri URI]

With no --mongo-uri, berthd runs an embedded store (FerretDB over SQLite) under
the data directory and takes an exclusive lock on it. At first start it creates
the cluster signing key and an admin token (printed once, kept in DIR/admin-token).
The API and node sessions are served over TLS at https://HOST:PORT/api/v1: with
no --tls-cert, a self-signed certificate is generated at first start (key 0600
under DIR/tls) and its SHA-256 fingerprint written to DIR/server-fingerprint;
join commands carry it, and the CLI pins it (berth login --fingerprint). The edge gateway plugin serves
HTTP on --gateway-listen and routes by Host to healthy workloads.

With --bootstrap-admin NAME, berthd reads a password (20 characters to 1024
bytes) from stdin and creates NAME as the first human admin, once per cluster:
a later start never creates another or overwrites a password. Log in with
berth login --user NAME.

Environment:
  BERTH_BOOTSTRAP_ADMIN            name:password of the first human admin, for scripts (instead
                                   of --bootstrap-admin); removed from the environment at start
  BERTH_RUNNER_REGISTRATION_TOKEN  legacy shared runner registration secret (off when unset):
                                   it can rotate any named runner node; prefer one-time
                                   enrollment tokens (berth runner enroll-token create)

Flags:
`)
		fmt.Fprint(fs.Output(), fs.FlagUsages())
	}
	var cfg server.Config
	var level string
	fs.StringVar(&cfg.DataDir, "data-dir", "", "data directory (keys, admin token, embedded store, bundles); required")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "API listen address")
	fs.StringVar(&cfg.GatewayListen, "gateway-listen", "127.0.0.1:8080", `edge gateway listen address ("off" runs no gateway)`)
	fs.StringVar(&cfg.MongoURI, "mongo-uri", "", "MongoDB connection string (default: embedded store under --data-dir)")
	fs.StringVar(&cfg.PublicURL, "public-url", "", "URL nodes and the CLI use to reach the API (default https://<listen>)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate chain to serve (default: self-signed, generated under --data-dir)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", "", "directory of berth-plugin-* binaries (default: beside berthd)")
	fs.StringVar(&cfg.ReleaseDir, "release-dir", "", "directory of Berth binaries offered to nodes by berth node upgrade, named <program>-<version>-<os>-<arch> (default: none)")
	fs.Int64Var(&cfg.MaxBundleBytes, "max-bundle-bytes", 512<<20, "largest release bundle accepted, in bytes")
	fs.BoolVar(&cfg.RunnerTransport, "runner-transport", false, "serve the runner transport /api/runner/v1 (off: 404 on the whole prefix)")
	fs.StringVar(&cfg.DebugListen, "debug-listen", "", "loopback address serving Go runtime profiles at /debug/pprof/ (default: none)")
	fs.DurationVar(&cfg.Sweep.Quiet, "sweep-quiet", slots.DefaultQuiet, "reconcile once hints have been quiet this long")
	fs.DurationVar(&cfg.Sweep.Period, "sweep-period", slots.DefaultPeriod, "reconcile at the latest this long after the last pass")
	fs.DurationVar(&cfg.Sweep.Floor, "sweep-floor", slots.DefaultFloor, "never start a scheduled pass sooner than this after the last one; each rollout step takes at least one pass")
	fs.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	var bootstrapAdmin string
	fs.StringVar(&bootstrapAdmin, "bootstrap-admin", "", "create this first human admin once, reading the password from stdin")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		_ = version.Print(os.Stdout, "berthd")
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(os.Stderr, "berthd: --log-level: %v\n", err)
		return 2
	}
	if cfg.DataDir == "" {
		fmt.Fprintln(os.Stderr, "berthd: --data-dir is required (see --help)")
		return 2
	}
	// The legacy shared runner registration secret comes only from the environment (never a flag,
	// which process listings show) and is removed from it so no child process inherits it.
	cfg.RunnerRegistrationSecret = os.Getenv("BERTH_RUNNER_REGISTRATION_TOKEN")
	_ = os.Unsetenv("BERTH_RUNNER_REGISTRATION_TOKEN")
	if env := os.Getenv("BERTH_BOOTSTRAP_ADMIN"); env != "" && bootstrapAdmin == "" {
		name, pw, ok := strings.Cut(env, ":")
		if !ok {
			fmt.Fprintln(os.Stderr, "berthd: BERTH_BOOTSTRAP_ADMIN must be name:password")
			return 2
		}
		cfg.BootstrapAdmin, cfg.BootstrapPassword = name, pw
	}
	_ = os.Unsetenv("BERTH_BOOTSTRAP_ADMIN")
	if bootstrapAdmin != "" {
		pw, err := readPassword(os.Stdin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "berthd: --bootstrap-admin: read the password from stdin: %v\n", err)
			return 2
		}
		cfg.BootstrapAdmin, cfg.BootstrapPassword = bootstrapAdmin, pw
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := server.Run(ctx, cfg); err != nil {
		cfg.Logger.Error("berthd stopped", "err", err)
		return 1
	}
	return 0
}

// readPassword reads one line (at most 1024 bytes and its newline) from r.
func readPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReaderSize(io.LimitReader(r, 1026), 1026).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("no password on stdin")
	}
	return line, nil
}
