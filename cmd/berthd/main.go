// Command berthd is Berth's control plane: the API, node sessions, the
// scheduler and the gateway plugin, on one MongoDB (or the embedded store).
// Its subcommands install it as a service, check its configuration file, and
// back up and restore its data directory (docs/operating.md).
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
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/server"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/internal/config"
	"github.com/berthhq/berth/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "install":
			return runInstall(args[1:], stdout, stderr)
		case "config":
			return runConfig(args[1:], stdout, stderr)
		case "backup":
			return runBackup(args[1:], stdout, stderr)
		case "restore":
			return runRestore(args[1:], stdout, stderr)
		}
	}
	return runServe(args, stderr)
}

const usage = `berthd runs Berth's control plane.

Usage:
  berthd [--config FILE] --data-dir DIR [--listen HOST:PORT] [--gateway-listen HOST:PORT] [--gateway-tls-listen HOST:PORT] [--mongo-uri URI]
  berthd install [--data-dir DIR] [--config FILE] [--user NAME] [--unit-dir DIR]
  berthd config check [--config FILE] [flags]
  berthd config sample
  berthd backup --data-dir DIR --to FILE|s3://BUCKET/KEY [--mongo-uri URI] [--blobs copy|reference]
  berthd restore FILE|s3://BUCKET/KEY --data-dir DIR [--mongo-uri URI] [--blobs-from DIR]

With no --mongo-uri, berthd runs an embedded store (FerretDB over SQLite) under
the data directory and takes an exclusive lock on it. At first start it creates
the cluster signing key and an admin token (printed once, kept in DIR/admin-token).
The API and node sessions are served over TLS at https://HOST:PORT/api/v1: with
no --tls-cert, a self-signed certificate is generated at first start (key 0600
under DIR/tls) and its SHA-256 fingerprint written to DIR/server-fingerprint;
join commands carry it, and the CLI pins it (berth login --fingerprint). The edge gateway plugin serves
HTTP on --gateway-listen and routes by Host to healthy workloads.

Configuration: --config FILE is a YAML mapping of these flag names to values
(unknown keys and bad values are refused with the file, line and key). A flag
on the command line wins over its BERTH_* variable (--data-dir is
BERTH_DATA_DIR), which wins over the file. berthd exits 78 on a configuration
error, which its systemd unit does not restart.

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
`

// serveFlags defines every flag of berthd's server on a new flag set.
func serveFlags(cfg *server.Config, level *slog.Level, configFile *string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("berthd", pflag.ContinueOnError)
	fs.SortFlags = false
	cfg.Listen, cfg.GatewayListen = "127.0.0.1:7070", "127.0.0.1:8080"
	fs.StringVar(configFile, "config", "", "YAML file of flag values (flags and BERTH_* variables override it)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "data directory (keys, admin token, embedded store, bundles); required")
	fs.Var(config.AddrValue{S: &cfg.Listen}, "listen", "API listen address")
	fs.Var(config.AddrValue{S: &cfg.GatewayListen, Off: "off"}, "gateway-listen", `edge gateway listen address ("off" runs no gateway)`)
	cfg.GatewayTLSListen = "off"
	fs.Var(config.AddrValue{S: &cfg.GatewayTLSListen, Off: "off"}, "gateway-tls-listen", `edge gateway HTTPS listen address, certificates and passthrough chosen by SNI ("off" runs no TLS listener)`)
	fs.StringVar(&cfg.MongoURI, "mongo-uri", "", "MongoDB connection string (default: embedded store under --data-dir)")
	fs.StringVar(&cfg.PublicURL, "public-url", "", "URL nodes and the CLI use to reach the API (default https://<listen>)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate chain to serve (default: self-signed, generated under --data-dir)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.Keyring, "keyring", "", "secrets keyring file, 0600 (default: keys/secrets.keyring under --data-dir, generated at first start)")
	fs.StringVar(&cfg.ACME.Directory, "acme-directory", "", "ACME directory URL of the CA for tls mode acme routes (default: none; tls mode acme is refused)")
	fs.StringVar(&cfg.ACME.CARootFile, "acme-ca-root", "", "PEM file of the roots trusted for the ACME directory's TLS (a private CA; default: the system roots)")
	fs.StringVar(&cfg.ACME.Email, "acme-email", "", "contact address of the ACME account")
	fs.StringSliceVar(&cfg.ACME.DNS01Zones, "acme-dns01-zone", nil, "zone Berth manages DNS for: its names and every wildcard are proven by DNS-01 (repeat or comma-separate)")
	fs.BoolVar(&cfg.ACME.HTTP01Reachable, "acme-http01", false, "the CA reaches the gateway on port 80 for every other name (HTTP-01)")
	fs.IntVar(&cfg.RewrapPerSecond, "secrets-rewrap-rate", 100, "secrets a keyring rotation re-wraps per second (negative: no bound)")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", "", "directory of berth-plugin-* binaries (default: beside berthd)")
	fs.StringVar(&cfg.ReleaseDir, "release-dir", "", "directory of Berth binaries offered to nodes by berth node upgrade, named <program>-<version>-<os>-<arch> (default: none)")
	fs.Int64Var(&cfg.MaxBundleBytes, "max-bundle-bytes", 512<<20, "largest release bundle accepted, in bytes")
	fs.StringVar(&cfg.S3.Endpoint, "s3-endpoint", "", "S3 API host[:port] for the blob store (bundles, registry); default: the filesystem under --data-dir")
	fs.StringVar(&cfg.S3.Bucket, "s3-bucket", "", "S3 bucket of the blob store (must exist)")
	fs.StringVar(&cfg.S3.Region, "s3-region", "", "S3 region (default: the store's)")
	fs.StringVar(&cfg.S3.Prefix, "s3-prefix", "", "key prefix of every blob in the bucket (default: none)")
	fs.StringVar(&cfg.S3.CredentialsFile, "s3-credentials-file", "", "0600 file with aws_access_key_id and aws_secret_access_key (default: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	fs.BoolVar(&cfg.S3.Insecure, "s3-insecure", false, "speak plain HTTP to the S3 endpoint (loopback test servers only)")
	fs.BoolVar(&cfg.RunnerTransport, "runner-transport", false, "serve the runner transport /api/runner/v1 (off: 404 on the whole prefix)")
	fs.StringVar(&cfg.DebugListen, "debug-listen", "", "loopback address serving Go runtime profiles at /debug/pprof/ (default: none)")
	fs.StringVar(&cfg.CorestoreConfig, "corestore-config", "", "JSON file (0600) configuring the corestore plugin: the PostgreSQL, MongoDB and S3 servers bindings are made on; values \"secret:PROJECT/NAME\" are taken from berthd's secrets (default: no bindings; docs/bindings.md)")
	fs.StringVar(&cfg.HetznerConfig, "hetzner-config", "", "0600 JSON file of the Hetzner provider plugin's configuration: token, token_file or token_secret_ref {project, secret}, endpoint (docs/machines.md; default: no machine provider)")
	fs.DurationVar(&cfg.MachineJoinTimeout, "machine-join-timeout", 0, "how long a machine create waits for its node to enroll before it deletes the server (default 15m)")
	fs.StringVar(&cfg.DNSConfig, "dns-config", "", "0600 JSON file of the DNS plugin's configuration, TSIG secret included (docs/dns.md; default: no DNS plugin)")
	fs.DurationVar(&cfg.ResourceDriftInterval, "resource-drift-interval", 0, "how often each declared resource is read through its provider to find drift, when its type declares no interval (default 5m; docs/resources.md)")
	fs.StringSliceVar(&cfg.EdgeAddresses, "edge-addresses", nil, "comma-separated IP addresses the domains of dns: managed services point at (docs/dns.md)")
	fs.DurationVar(&cfg.LogRetention.MaxAge, "log-retention", logs.DefaultRetention.MaxAge, "how long shipped workload log segments are kept, per project (negative: no age limit; docs/logs.md section 8)")
	fs.Int64Var(&cfg.LogRetention.MaxBytes, "log-retention-bytes", logs.DefaultRetention.MaxBytes, "compressed bytes of shipped workload log each project keeps, oldest segments deleted first (negative: no size limit)")
	fs.DurationVar(&cfg.LogSweepInterval, "log-sweep-interval", 10*time.Minute, "how often the log retention sweep runs")
	fs.DurationVar(&cfg.Sweep.Quiet, "sweep-quiet", slots.DefaultQuiet, "reconcile once hints have been quiet this long")
	fs.DurationVar(&cfg.Sweep.Period, "sweep-period", slots.DefaultPeriod, "reconcile at the latest this long after the last pass")
	fs.DurationVar(&cfg.Sweep.Floor, "sweep-floor", slots.DefaultFloor, "never start a scheduled pass sooner than this after the last one; each rollout step takes at least one pass")
	*level = slog.LevelInfo
	fs.Var(config.LevelValue{L: level}, "log-level", "log level: debug, info, warn, error")
	fs.StringVar(&cfg.BootstrapAdmin, "bootstrap-admin", "", "create this first human admin once, reading the password from stdin")
	fs.Bool("version", false, "print the version and exit")
	return fs
}

// errShowVersion is what loadServe returns for --version: print it and exit 0.
var errShowVersion = errors.New("berthd: --version")

// loadServe parses args and applies the configuration file and BERTH_*
// variables; it returns the server configuration and where each value came from.
func loadServe(args []string, stderr io.Writer) (cfg server.Config, level slog.Level, src map[string]config.Source, fs *pflag.FlagSet, err error) {
	var file string
	fs = serveFlags(&cfg, &level, &file)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fmt.Fprint(fs.Output(), fs.FlagUsages())
	}
	if err = fs.Parse(args); err != nil {
		return
	}
	if v, _ := fs.GetBool("version"); v {
		err = errShowVersion
		return
	}
	if fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
		return
	}
	if file == "" {
		file = os.Getenv(config.EnvName("config"))
	}
	src, err = config.Apply(fs, config.Options{File: file, Getenv: os.Getenv, Skip: []string{"config", "version", "bootstrap-admin"}})
	if err != nil {
		return
	}
	if cfg.DataDir == "" {
		err = errors.New("--data-dir is required (flag, BERTH_DATA_DIR or data-dir in --config; see --help)")
		return
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		err = errors.New("--tls-cert and --tls-key go together")
	}
	return
}

func runServe(args []string, stderr io.Writer) int {
	// The registry library logs every request through logrus's global
	// logger; berthd logs what matters (storage failures) itself.
	logrus.SetOutput(io.Discard)
	cfg, level, _, _, err := loadServe(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errShowVersion) {
		_ = version.Print(os.Stdout, "berthd")
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "berthd: %v\n", err)
		return server.ExitConfig
	}
	// The legacy shared runner registration secret comes only from the environment (never a flag,
	// which process listings show) and is removed from it so no child process inherits it.
	cfg.RunnerRegistrationSecret = os.Getenv("BERTH_RUNNER_REGISTRATION_TOKEN")
	_ = os.Unsetenv("BERTH_RUNNER_REGISTRATION_TOKEN")
	if env := os.Getenv("BERTH_BOOTSTRAP_ADMIN"); env != "" && cfg.BootstrapAdmin == "" {
		name, pw, ok := strings.Cut(env, ":")
		if !ok {
			fmt.Fprintln(stderr, "berthd: BERTH_BOOTSTRAP_ADMIN must be name:password")
			return server.ExitConfig
		}
		cfg.BootstrapAdmin, cfg.BootstrapPassword = name, pw
	} else if cfg.BootstrapAdmin != "" {
		pw, err := readPassword(os.Stdin)
		if err != nil {
			fmt.Fprintf(stderr, "berthd: --bootstrap-admin: read the password from stdin: %v\n", err)
			return server.ExitConfig
		}
		cfg.BootstrapPassword = pw
	}
	_ = os.Unsetenv("BERTH_BOOTSTRAP_ADMIN")
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
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
