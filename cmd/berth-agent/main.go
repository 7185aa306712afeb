// Command berth-agent is the Berth node agent: `enroll` joins a node to a
// cluster once, `run` keeps its workloads and its session to berthd.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/berthhq/berth/agent"
	"github.com/berthhq/berth/agent/hostsetup"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/agent/upgrade"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/dirlock"
	"github.com/berthhq/berth/internal/version"
)

func main() {
	err := newRootCmd(os.Stdout, os.Stderr).Execute()
	var re restartError
	if errors.As(err, &re) {
		// Everything run held (the data directory lock, the driver plugin,
		// the local store) is released by now; the binary at re.path is a
		// complete one, old or new (docs/upgrades.md section 3).
		err = syscall.Exec(re.path, os.Args, os.Environ())
		err = fmt.Errorf("restart %s: %w", re.path, err)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent:", err)
		os.Exit(exitCode(err))
	}
}

// restartError asks main to re-execute the agent binary at path once run
// has released everything (after an upgrade or a rollback).
type restartError struct{ path string }

func (e restartError) Error() string { return "restart " + e.path }

// configError marks an error a restart cannot fix: the process exits with
// hostsetup.ExitConfig (78), which the systemd unit does not restart.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// exitCode is hostsetup.ExitConfig for configuration errors (bad flags, not
// enrolled, node removed, driver plugin missing), hostsetup.ExitPinMismatch
// when berthd's certificate does not match the pin, 1 otherwise.
func exitCode(err error) int {
	if errors.Is(err, agent.ErrPinMismatch) {
		return hostsetup.ExitPinMismatch
	}
	var ce configError
	if errors.As(err, &ce) || errors.Is(err, agent.ErrRemoved) || errors.Is(err, localstore.ErrNotEnrolled) {
		return hostsetup.ExitConfig
	}
	return 1
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "berth-agent",
		Short: "Berth node agent",
		Long: `berth-agent runs one node of a Berth cluster. Enroll the machine once with the
join command an operator created (berth join-token create), then run it:

  berth-agent enroll --server URL --join-token brj_... --fingerprint sha256:... [--data-dir DIR] [--label k=v]
  berth-agent run [--data-dir DIR]

The fingerprint pins berthd's TLS certificate: the agent refuses any other one.
DIR defaults to /var/lib/berth-agent.

The agent keeps one session to berthd, stores every verified desired state in
DIR, and runs workloads through the process runtime driver plugin
(berth-plugin-process, beside this binary). Workloads keep running when the
agent stops; a restarted agent adopts them without restarting them.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.Version = version.Version
	root.SetVersionTemplate(version.Line("berth-agent") + "\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return configError{err} })
	root.AddCommand(newEnrollCmd(stdout, stderr), newRunCmd(stderr), newInstallCmd(stdout))
	return root
}

// defaultDataDir is where the agent keeps its state unless --data-dir says otherwise.
const defaultDataDir = "/var/lib/berth-agent"

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func newEnrollCmd(stdout, stderr io.Writer) *cobra.Command {
	var cfg agent.EnrollConfig
	var labels []string
	var res resourceFlags
	var tokenStdin bool
	cmd := &cobra.Command{
		Use:   "enroll",
		Short: "Enroll this machine as a node with a one-time join token or join code",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := readJoinToken(cmd.InOrStdin(), tokenStdin, &cfg.JoinToken); err != nil {
				return err
			}
			cfg.Labels = map[string]string{}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return fmt.Errorf("--label %q: want key=value", l)
				}
				cfg.Labels[k] = v
			}
			var err error
			if cfg.Resources, err = res.parse(); err != nil {
				return err
			}
			cfg.Logger = newLogger(stderr)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			id, err := agent.Enroll(ctx, cfg)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "enrolled as %s\n", id)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Server, "server", "", "berthd URL, e.g. https://berth.example.com (required)")
	f.StringVar(&cfg.JoinToken, "join-token", "", "one-time join token or join code (this or --join-token-stdin)")
	f.BoolVar(&tokenStdin, "join-token-stdin", false, "read the join token or code from the first line of stdin, so it never shows in a process list (the setup script's way)")
	f.StringVar(&cfg.Fingerprint, "fingerprint", "", "SHA-256 fingerprint of berthd's TLS certificate to pin (from the join command; empty trusts the system CAs)")
	f.StringVar(&cfg.DataDir, "data-dir", defaultDataDir, "agent data directory")
	f.StringArrayVar(&labels, "label", nil, "node label key=value (repeatable)")
	f.StringVar(&cfg.Region, "region", "", "node region")
	f.StringVar(&cfg.Address, "address", "127.0.0.1", "host address workloads bind to, where the gateway and other nodes reach them; \"auto\": the address this host reaches --server from (the setup script's default)")
	f.StringVar(&cfg.Hostname, "hostname", "", "node hostname (default: this machine's)")
	res.register(f)
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// readJoinToken sets *token from the first line of in when fromStdin, and
// refuses both or neither of --join-token and --join-token-stdin.
func readJoinToken(in io.Reader, fromStdin bool, token *string) error {
	switch {
	case fromStdin && *token != "":
		return fmt.Errorf("give --join-token or --join-token-stdin, not both")
	case !fromStdin && *token == "":
		return fmt.Errorf("a join token is required: --join-token or --join-token-stdin")
	case !fromStdin:
		return nil
	}
	line, err := bufio.NewReader(io.LimitReader(in, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the join token from stdin: %w", err)
	}
	if *token = strings.TrimSpace(line); *token == "" {
		return fmt.Errorf("--join-token-stdin: stdin holds no join token")
	}
	return nil
}

func newRunCmd(stderr io.Writer) *cobra.Command {
	var dataDir, pluginDir, driver, workloadUser string
	var driverArgs []string
	var noLogShipping bool
	var metricsListen string
	var confirmWindow time.Duration
	var network networkFlags
	var res resourceFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node: keep workloads as desired and the session to berthd",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resources, err := res.parse()
			if err != nil {
				return err
			}
			log := newLogger(stderr)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, log, runOptions{dataDir: dataDir, pluginDir: pluginDir, driver: driver, workloadUser: workloadUser,
				driverArgs: driverArgs, noLogShipping: noLogShipping, metricsListen: metricsListen}, confirmWindow, network, resources)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", defaultDataDir, "agent data directory")
	f.StringVar(&pluginDir, "plugin-dir", "", "directory holding berth-plugin-<driver> (default: the directory of this executable)")
	network.register(f)
	f.DurationVar(&confirmWindow, "upgrade-confirm-window", upgrade.DefaultConfirmWindow, "after an upgrade, how long the new version has to be welcomed by berthd before the previous binary is put back")
	f.StringVar(&driver, "driver", "process", "runtime driver plugin to run workloads with (berth-plugin-<driver>, launched with --state-dir DIR/driver/<driver>), e.g. process, containerd or a third-party driver's name with --plugin-dir; \"fake\", the deterministic test driver, only with "+testDriversEnv+"=1 in the environment (tests)")
	f.StringVar(&workloadUser, "workload-user", reconcile.DefaultWorkloadUser, "when run as root: the system user process workloads run as unless their service sets user: (created when missing; empty runs them as root)")
	f.StringArrayVar(&driverArgs, "driver-arg", nil, "a flag passed on to the runtime driver plugin (repeatable), e.g. --driver-arg=--log-segment-bytes=1048576")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve the agent's Prometheus metrics (berth_log_bytes_shipped_total, berth_log_segments_dropped_total) at http://ADDR/metrics, e.g. 127.0.0.1:9102; empty serves none")
	f.BoolVar(&noLogShipping, "no-log-shipping", false, "keep workload log segments on this node only instead of shipping them to berthd (docs/logs.md)")
	res.register(f)
	return cmd
}

// runOptions are the flags of run that pick what the agent runs with.
type runOptions struct {
	dataDir, pluginDir, driver, workloadUser string
	driverArgs                               []string
	noLogShipping                            bool
	metricsListen                            string
}

// serveMetrics serves reg at http://addr/metrics until ctx ends.
func serveMetrics(ctx context.Context, log *slog.Logger, addr string, reg *prometheus.Registry) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return configError{fmt.Errorf("--metrics-listen %s: %w", addr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics listener stopped", "error", err)
		}
	}()
	return nil
}

// resourceFlags are --resource and --reserve of enroll and run.
type resourceFlags struct {
	resources []string
	reserve   string
}

func (r *resourceFlags) register(f *pflag.FlagSet) {
	f.StringArrayVar(&r.resources, "resource", nil, "an extended resource this node offers, NAME=COUNT, e.g. gpu=1 (repeatable); reported to berthd with the node's capacity")
	f.StringVar(&r.reserve, "reserve", "", "what the host keeps for itself, subtracted from the CPU, memory and disk the node offers: cpu_m=N,memory_mib=N,disk_mib=N (e.g. cpu_m=500,memory_mib=512)")
}

func (r *resourceFlags) parse() (agent.Resources, error) {
	var out agent.Resources
	for _, s := range r.resources {
		name, n, err := agent.ParseResource(s)
		if err != nil {
			return out, fmt.Errorf("--resource: %w", err)
		}
		if out.Extended == nil {
			out.Extended = map[string]int64{}
		}
		if _, dup := out.Extended[name]; dup {
			return out, fmt.Errorf("--resource %s given twice", name)
		}
		out.Extended[name] = n
	}
	var err error
	if out.Reserve, err = agent.ParseReserve(r.reserve); err != nil {
		return out, fmt.Errorf("--reserve: %w", err)
	}
	return out, nil
}

// testDriversEnv names the environment variable that admits the test-only
// runtime driver ("fake", which runs nothing): tests set it to 1, so that a
// production node cannot be started on a driver that only pretends to run
// its workloads.
const testDriversEnv = "BERTH_ALLOW_TEST_DRIVERS"

func run(ctx context.Context, log *slog.Logger, o runOptions, confirmWindow time.Duration, netFlags networkFlags, resources agent.Resources) error {
	dataDir, pluginDir, driver, workloadUser := o.dataDir, o.pluginDir, o.driver, o.workloadUser
	reg := prometheus.NewRegistry()
	if o.metricsListen != "" {
		if err := serveMetrics(ctx, log, o.metricsListen, reg); err != nil {
			return err
		}
	}
	if driver == "fake" && os.Getenv(testDriversEnv) != "1" {
		return configError{fmt.Errorf("--driver fake is the test driver and runs no workload; tests set %s=1 to use it", testDriversEnv)}
	}
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// The path of this binary, resolved before an upgrade could replace it
	// (afterwards /proc/self/exe names a deleted file).
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return fmt.Errorf("locate the agent binary: %w", err)
	}
	if pluginDir == "" {
		pluginDir = filepath.Dir(exe)
	}
	// Check enrollment before anything is created in the directory.
	if _, err := os.Stat(filepath.Join(dataDir, localstore.FileName)); errors.Is(err, os.ErrNotExist) {
		return configError{fmt.Errorf("%s is not an enrolled node's data directory (run berth-agent enroll first)", dataDir)}
	}
	unlock, err := dirlock.Lock(dataDir)
	if errors.Is(err, dirlock.ErrLocked) {
		return fmt.Errorf("another berth-agent is running with --data-dir %s", dataDir)
	} else if err != nil {
		return err
	}
	defer func() { _ = unlock() }()
	if driver == "" || strings.ContainsAny(driver, `/\.`) {
		return configError{fmt.Errorf("--driver %q: want a driver name such as process", driver)}
	}
	// The guard and the node network come back before anything can start a workload.
	nw, err := netFlags.open(ctx, log, dataDir, pluginDir, exe)
	if err != nil {
		return err
	}
	defer nw.Close()
	stateDir := filepath.Join(dataDir, "driver", driver)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("create driver state directory: %w", err)
	}
	entry, err := plugin.ResolveDriver(pluginDir, driver)
	if err != nil {
		return configError{fmt.Errorf("%s driver: %w", driver, err)}
	}
	// A driver plugin pinned by a plugin catalog is upgraded by updating the
	// catalog; one resolved by its file alone can be upgraded in place.
	driverPath := ""
	if _, err := plugin.LoadCatalog(pluginDir); errors.Is(err, plugin.ErrNoCatalog) {
		if driverPath, err = filepath.Abs(entry.Path); err != nil {
			return fmt.Errorf("driver plugin path: %w", err)
		}
	}
	drv, err := plugin.LaunchDriver(ctx, entry.Apply(plugin.Config{
		Args:   append([]string{"--state-dir", stateDir}, o.driverArgs...),
		PidDir: filepath.Join(dataDir, "plugins"),
		Logger: log,
	}))
	if err != nil {
		// A new driver plugin that does not even launch goes back to the
		// previous one, which the restarted agent launches.
		if driverPath != "" {
			if back, rerr := upgrade.RollBackUnconfirmed(dataDir, "berth-plugin-"+driver, driverPath, log); rerr != nil {
				log.Error("roll back the driver plugin", "error", rerr)
			} else if back {
				return restartError{path: exe}
			}
		}
		return fmt.Errorf("launch %s driver: %w", driver, err)
	}
	// Closing the plugin leaves workloads running (the process driver's
	// workloads outlive it).
	defer func() { _ = drv.Close() }()
	if os.Geteuid() != 0 {
		workloadUser = "" // workloads run as the agent's own user
	} else if workloadUser != "" {
		created, err := hostsetup.EnsureSystemUser(ctx, workloadUser)
		if err != nil {
			return fmt.Errorf("workload user: %w", err)
		}
		if created {
			log.Info("created the system user process workloads run as", "user", workloadUser)
		}
	}
	a, err := agent.New(agent.Config{DataDir: dataDir, Driver: drv, Logger: log, Network: nw.Network, WorkloadUser: workloadUser, Resources: resources, NoLogShipping: o.noLogShipping, Metrics: reg,
		SelfUpgrade: &agent.SelfUpgrade{Path: exe, DriverPath: driverPath, NetworkPath: nw.Path, ConfirmWindow: confirmWindow}})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	if err := a.Run(ctx); errors.Is(err, agent.ErrRestart) {
		log.Info("berth-agent restarting itself; workloads keep running", "binary", exe)
		return restartError{path: exe}
	} else if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("berth-agent stopped; workloads keep running")
	return nil
}
