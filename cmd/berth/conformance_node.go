package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/conformance"
	nodeconf "github.com/berthhq/berth/conformance/node"
)

func newConformanceNodeCmd(a *app) *cobra.Command {
	var agent, pluginDir, junit string
	cmd := &cobra.Command{
		Use:   "node (--agent PATH | --server URL --token TOKEN [--fingerprint F])",
		Short: "Check an agent or a berthd against the node session protocol",
		Long: `node runs the node-protocol conformance suite (docs/node-protocol.md) in one
of two directions, message by message: ordering, the size limit, unknown
fields and types, versions, signature failures, stale revisions, event ids
and deduplication, change-log follow and divergence, the stream limit, one
session per node, and disconnect timing.

--agent PATH runs the agent binary at PATH (berth-plugin-process beside it,
or in --plugin-dir) against a scripted core on loopback: each case enrolls a
fresh data directory and runs the agent.

--server URL (with --token and, for a self-signed certificate,
--fingerprint; or the values berth login saved) drives a live berthd with
scripted nodes: each case creates a join token, enrolls its own node and
removes it at the end. The token needs node:enroll, node:remove and
nodes:read. While a case runs its node is connected and may be chosen for
new workloads, so run it against a cluster made for the purpose. The
disconnect-timing case waits one session timeout (15 s).

It prints one line per case and exits 1 when a case failed.`,
		Example: `  berth conformance node --agent bin/berth-agent
  berth conformance node --server https://127.0.0.1:7070 --token brt_... --fingerprint sha256:...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var report *conformance.Report
			var err error
			switch {
			case agent != "" && cmd.Flags().Changed("server"):
				return errors.New("give --agent or --server, not both")
			case agent != "":
				report, err = nodeconf.CheckAgent(cmd.Context(), nodeconf.AgentConfig{Binary: agent, PluginDir: pluginDir})
			default:
				s, rerr := a.resolve(cmd)
				if rerr != nil {
					return rerr
				}
				if s.Server == "" || s.Token == "" {
					return errors.New("give --agent PATH, or --server URL and --token TOKEN (or run berth login)")
				}
				report, err = nodeconf.CheckServer(cmd.Context(), nodeconf.ServerConfig{URL: s.Server, Token: s.Token, Fingerprint: s.Fingerprint})
			}
			if err != nil {
				return err
			}
			if junit != "" {
				f, err := os.Create(junit)
				if err != nil {
					return fmt.Errorf("--junit: %w", err)
				}
				werr := report.WriteJUnit(f)
				if cerr := f.Close(); werr == nil {
					werr = cerr
				}
				if werr != nil {
					return fmt.Errorf("--junit: %w", werr)
				}
			}
			if err := report.WriteText(a.stdout); err != nil {
				return err
			}
			if !report.OK() {
				return fmt.Errorf("%d conformance case(s) failed: %s", len(report.Failed()), strings.Join(report.Failed(), ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&agent, "agent", "", "berth-agent binary to check against a scripted core")
	f.StringVar(&pluginDir, "plugin-dir", "", "directory holding berth-plugin-process (default: beside the agent)")
	f.StringVar(&junit, "junit", "", "also write the report as JUnit XML to this file")
	return cmd
}
