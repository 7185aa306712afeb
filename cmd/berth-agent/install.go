package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/agent/hostsetup"
	"github.com/berthhq/berth/agent/reconcile"
)

func newInstallCmd(stdout io.Writer) *cobra.Command {
	var cfg hostsetup.UnitConfig
	var res resourceFlags
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Write the systemd unit that runs this agent; starts nothing",
		Long: `install writes berth-agent.service (default into /etc/systemd/system) that runs
"berth-agent run" with this binary and --data-dir (and --resource and
--reserve when given), restarts it 5 s after a
failure, and does not restart it after exit status 78, which the agent uses for
configuration errors a restart cannot fix (not enrolled, node removed, driver
plugin missing, bad flags). It prints the path and the unit it wrote. Run as
root, it also creates the system user berth-workload that process workloads run
as unless their service sets user:. It enables, reloads and starts nothing: run
the two systemctl commands it prints.`,
		Example: `  berth-agent install --data-dir /var/lib/berth-agent`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("locate this binary: %w", err)
				}
				cfg.Binary = exe
			}
			for _, p := range []*string{&cfg.Binary, &cfg.DataDir, &cfg.PluginDir} {
				if *p == "" {
					continue
				}
				abs, err := filepath.Abs(*p)
				if err != nil {
					return configError{fmt.Errorf("path %s: %w", *p, err)}
				}
				*p = abs
			}
			if _, err := res.parse(); err != nil {
				return configError{err}
			}
			cfg.Resources, cfg.Reserve = res.resources, res.reserve
			path, text, err := hostsetup.Install(cfg)
			if err != nil {
				return configError{err}
			}
			if os.Geteuid() == 0 { // process workloads run as this user (docs/node-protocol.md 6.7)
				created, err := hostsetup.EnsureSystemUser(cmd.Context(), reconcile.DefaultWorkloadUser)
				if err != nil {
					return err
				}
				if created {
					if _, err := fmt.Fprintf(stdout, "created system user %s: process workloads run as it\n", reconcile.DefaultWorkloadUser); err != nil {
						return err
					}
				}
			}
			_, err = fmt.Fprintf(stdout, "wrote %s:\n\n%s\nNothing was started. To run the agent now and at boot:\n  systemctl daemon-reload\n  systemctl enable --now berth-agent\n", path, text)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", defaultDataDir, "agent data directory the unit runs with")
	f.StringVar(&cfg.PluginDir, "plugin-dir", "", "runtime-driver plugin directory (default: the binary's directory)")
	f.StringVar(&cfg.Binary, "binary", "", "berth-agent path the unit runs (default: this binary)")
	f.StringVar(&cfg.UnitDir, "unit-dir", hostsetup.DefaultUnitDir, "directory the unit is written to")
	res.register(f)
	return cmd
}
