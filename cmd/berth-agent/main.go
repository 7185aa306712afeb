// Command berth-agent is the Berth node agent: `enroll` joins a node to a
// cluster once, `run` keeps its workloads and its session to berthd.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/agent"
	"github.com/berthhq/berth/host/plugin"
)

func main() {
	if err := newRootCmd(os.Stdout, os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent:", err)
		os.Exit(1)
	}
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "berth-agent",
		Short:         "Berth node agent",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newEnrollCmd(stdout, stderr), newRunCmd(stderr))
	return root
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func newEnrollCmd(stdout, stderr io.Writer) *cobra.Command {
	var cfg agent.EnrollConfig
	var labels []string
	cmd := &cobra.Command{
		Use:   "enroll",
		Short: "Enroll this machine as a node with a one-time join token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Labels = map[string]string{}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return fmt.Errorf("--label %q: want key=value", l)
				}
				cfg.Labels[k] = v
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
	f.StringVar(&cfg.JoinToken, "join-token", "", "one-time join token (required)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "agent data directory (required)")
	f.StringArrayVar(&labels, "label", nil, "node label key=value (repeatable)")
	f.StringVar(&cfg.Region, "region", "", "node region")
	f.StringVar(&cfg.Address, "address", "127.0.0.1", "host address workloads bind to")
	f.StringVar(&cfg.Hostname, "hostname", "", "node hostname (default: this machine's)")
	for _, n := range []string{"server", "join-token", "data-dir"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func newRunCmd(stderr io.Writer) *cobra.Command {
	var dataDir, pluginDir string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node: keep workloads as desired and the session to berthd",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(stderr)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, log, dataDir, pluginDir)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "agent data directory (required)")
	f.StringVar(&pluginDir, "plugin-dir", "", "directory holding berth-plugin-process (default: the directory of this executable)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func run(ctx context.Context, log *slog.Logger, dataDir, pluginDir string) error {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if pluginDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("locate plugin directory: %w", err)
		}
		pluginDir = filepath.Dir(exe)
	}
	stateDir := filepath.Join(dataDir, "driver", "process")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("create driver state directory: %w", err)
	}
	drv, err := plugin.LaunchDriver(ctx, plugin.Config{
		Name:   "process",
		Path:   filepath.Join(pluginDir, "berth-plugin-process"),
		Args:   []string{"--state-dir", stateDir},
		Logger: log.With("plugin", "process"),
	})
	if err != nil {
		return fmt.Errorf("launch process driver: %w", err)
	}
	// Closing the plugin leaves workloads running (the process driver's
	// workloads outlive it).
	defer func() { _ = drv.Close() }()
	a, err := agent.New(agent.Config{DataDir: dataDir, Driver: drv, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("berth-agent stopped; workloads keep running")
	return nil
}
