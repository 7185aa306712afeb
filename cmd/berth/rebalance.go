package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// newRebalanceCmd is `berth rebalance`: the moves the placement decider makes for a better
// spread of a service's replicas, carried out under the rollout's bounds.
func newRebalanceCmd(a *app) *cobra.Command {
	var all, dryRun bool
	cmd := &cobra.Command{
		Use:   "rebalance [PROJECT/]SERVICE | --all",
		Short: "Move replicas for a better spread over the nodes, within the rollout's bounds",
		Long: `rebalance asks the placement decider where it would place the service's
replicas from scratch over the nodes as they are now, and moves only the
replicas whose move makes the spread better (docs/placement.md section 7).
A replica never moves to a node that fails a requirement (cordoned, draining,
out of capacity, another region, ...). Running replicas otherwise stay where
they are: a node that joins takes no running replica until you rebalance.

The moves are recorded on the service (a new revision, cause
rollout.rebalance, in the change log) and carried out by the rollout like a
drain: each moved replica's successor starts on its new node and is ready
before the old one stops, within the service's max_surge and
max_unavailable. Running it again once the moves are done moves nothing.

--all rebalances every service of the project (--project). --dry-run prints
the moves (replica, from, to, why) and writes nothing.`,
		Example: `  berth rebalance web --dry-run
  berth rebalance shop/web
  berth rebalance --all --project shop`,
		Args: func(cmd *cobra.Command, args []string) error {
			if all && len(args) > 0 {
				return errors.New("give a service or --all, not both")
			}
			if !all && len(args) != 1 {
				return errors.New("give a service ([PROJECT/]SERVICE) or --all")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			type target struct{ project, name string }
			var targets []target
			if all {
				svcs, err := c.ListServices(cmd.Context(), s.Project)
				if err != nil {
					return err
				}
				for _, sv := range svcs {
					targets = append(targets, target{s.Project, sv.Name})
				}
			} else {
				p, n := splitService(args[0], s.Project)
				targets = append(targets, target{p, n})
			}
			var results []*client.RebalanceResult
			for _, t := range targets {
				res, err := c.Rebalance(cmd.Context(), t.project, t.name, client.RebalanceRequest{DryRun: dryRun})
				if err != nil {
					return fmt.Errorf("rebalance %s/%s: %w", t.project, t.name, err)
				}
				results = append(results, res)
			}
			if a.output == outputJSON {
				if !all {
					return printJSON(a.stdout, results[0])
				}
				return printJSON(a.stdout, client.List[*client.RebalanceResult]{Items: results})
			}
			if all && len(results) == 0 {
				fmt.Fprintf(a.stdout, "project %s has no services\n", s.Project)
			}
			for _, r := range results {
				if err := printRebalance(a, r); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "rebalance every service of the project")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the moves without writing anything")
	return cmd
}

// printRebalance prints one service's rebalance: a summary line, then a table of the moves.
func printRebalance(a *app, r *client.RebalanceResult) error {
	switch {
	case r.Note != "":
		fmt.Fprintf(a.stdout, "%s: %s\n", r.Service, r.Note)
		return nil
	case len(r.Moves) == 0:
		fmt.Fprintf(a.stdout, "%s: nothing to move (spread score %d/%d)\n", r.Service, r.Before.Domains, r.Before.Nodes)
		return nil
	}
	var what string
	switch {
	case r.DryRun:
		what = "would move (dry run, nothing written)"
	case r.Recorded:
		what = fmt.Sprintf("moves (rebalance %d recorded at revision %d)", r.Generation, r.Revision)
	default:
		what = fmt.Sprintf("moves (already recorded by rebalance %d)", r.Generation)
	}
	fmt.Fprintf(a.stdout, "%s %s %d replica(s); spread score %d/%d -> %d/%d\n", r.Service, what, len(r.Moves),
		r.Before.Domains, r.Before.Nodes, r.After.Domains, r.After.Nodes)
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "  REPLICA\tFROM\tTO\tWHY")
	for _, m := range r.Moves {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", m.Replica, m.From, m.To, strings.TrimSpace(m.Why))
	}
	return tw.Flush()
}
