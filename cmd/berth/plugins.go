package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newPluginsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "plugins",
		Short: "List the plugin processes berthd supervises",
		Long: `plugins lists berthd's plugin processes (the gateway provider today) with their
state (running, restarting, quarantined), health, launches, crashes within the
quarantine window, and whether a plugin is degraded (an Apply that differed
from its Plan). A plugin that crashed 5 times in 10 minutes is quarantined and
not relaunched until berthd restarts. See docs/plugins.md section 2.`,
		Example: `  berth plugins
  berth plugins -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ListPlugins(cmd.Context())
			if err != nil {
				return fmt.Errorf("list plugins: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "NAME", "KIND", "VERSION", "STATE", "HEALTH", "PID", "LAUNCHES", "CRASHES", "DEGRADED")
			for _, p := range items {
				degraded := "no"
				if p.Degraded {
					degraded = "yes: " + p.DegradedReason
				}
				pid := "-"
				if p.PID > 0 {
					pid = fmt.Sprint(p.PID)
				}
				row(tw, p.Name, p.Kind, orDash(p.Version), p.State, orDash(p.Health), pid, p.Launches, p.Crashes, degraded)
			}
			return tw.Flush()
		},
	}
}
