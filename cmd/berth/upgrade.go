package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newNodeUpgradeCmd(a *app) *cobra.Command {
	var all, force bool
	var maxParallel int
	var ver, program string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "upgrade ID...|--all [--program P] [--version V] [--max-parallel N] [--force]",
		Short: "Upgrade node agents in place to a release berthd serves",
		Long: `upgrade replaces the berth-agent binary of nodes with a release from berthd's
--release-dir (docs/upgrades.md): berthd offers the release over the node's
session, the agent downloads it, checks its SHA-256, keeps the running binary as
.prev, swaps the new one in and restarts itself. Workloads keep running and are
adopted by the new agent. A new version that is not welcomed by berthd within
the agent's confirm window is rolled back to .prev.

Each node's upgrade ends when the node is back on a new session, so at most
--max-parallel agents restart at once. Without --version the newest
berth-agent release berthd serves is used. Refused: a version older than the
node's (agent_downgrade) or outside the version skew berthd accepts
(agent_version_skew), unless --force.`,
		Example: `  berth node upgrade nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --version 0.4.0
  berth node upgrade --all --max-parallel 2`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name node ids or pass --all, not both")
			}
			if maxParallel < 1 {
				return fmt.Errorf("--max-parallel %d: want 1 or more", maxParallel)
			}
			if timeout < 0 || timeout > 10*time.Minute {
				return fmt.Errorf("--timeout %s: want 0 to 10m", timeout)
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ids := args
			if all {
				ns, err := c.ListNodes(cmd.Context())
				if err != nil {
					return fmt.Errorf("list nodes: %w", err)
				}
				for _, n := range ns {
					if n.Status != "removed" && n.Retirement == "" {
						ids = append(ids, n.ID)
					}
				}
			}
			req := client.UpgradeRequest{Program: program, Version: ver, Force: force, TimeoutS: int(timeout / time.Second)}
			out := c.UpgradeNodes(cmd.Context(), ids, req, maxParallel)
			failed := 0
			type result struct {
				NodeID     string `json:"node_id"`
				From       string `json:"from,omitempty"`
				To         string `json:"to,omitempty"`
				State      string `json:"state"`
				DurationMS int64  `json:"duration_ms,omitempty"`
				Error      string `json:"error,omitempty"`
			}
			rows := make([]result, 0, len(out))
			for _, o := range out {
				r := result{NodeID: o.NodeID}
				if o.Err != nil {
					failed++
					r.State, r.Error = "failed", o.Err.Error()
				} else {
					r.From, r.To, r.State, r.DurationMS = o.Result.From, o.Result.To, o.Result.State, o.Result.DurationMS
				}
				rows = append(rows, r)
			}
			if a.output == outputJSON {
				if err := printJSON(a.stdout, rows); err != nil {
					return err
				}
			} else {
				tw := newTable(a.stdout)
				row(tw, "NODE", "FROM", "TO", "STATE", "TIME", "ERROR")
				for _, r := range rows {
					row(tw, r.NodeID, orDash(r.From), orDash(r.To), r.State, fmt.Sprintf("%.1fs", float64(r.DurationMS)/1000), orDash(r.Error))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if failed > 0 {
				for _, o := range out {
					if o.Err != nil {
						fmt.Fprintf(a.stderr, "node %s: %v\n", o.NodeID, o.Err)
					}
				}
				return fmt.Errorf("%d of %d node upgrade(s) failed", failed, len(out))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&all, "all", false, "upgrade every node that is not removed or retired")
	f.IntVar(&maxParallel, "max-parallel", 1, "most nodes upgrading (restarting) at once")
	f.StringVar(&ver, "version", "", "version to install (default: the newest berthd serves)")
	f.StringVar(&program, "program", "berth-agent", "binary to upgrade: berth-agent, the node's runtime driver plugin berth-plugin-<driver>, or its network plugin berth-plugin-nftables (a plugin restarts with the agent; its workloads are recovered, and their network restored, not restarted)")
	f.BoolVar(&force, "force", false, "allow a downgrade or a version outside the supported skew")
	f.DurationVar(&timeout, "timeout", 0, "how long each node may take to come back (default: berthd's, 2m)")
	return cmd
}
