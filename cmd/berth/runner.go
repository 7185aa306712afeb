package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// newRunnerCmd is `berth runner`: runner enrollment and the runner fleet
// (docs/runner-protocol.md section 3).
func newRunnerCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runner",
		RunE:  groupRunE,
		Short: "Enroll and list runners (workers of /api/runner/v1)",
	}
	tok := &cobra.Command{Use: "enroll-token", RunE: groupRunE, Short: "Runner enrollment tokens"}
	var ttl time.Duration
	var node, region string
	create := &cobra.Command{
		Use:   "create --node ID --region REGION [--ttl 1h]",
		Short: "Create a one-time token that enrolls one runner node in one region",
		Long: `create makes a runner enrollment token bound to one node id and one region.
It works once, expires, and is shown once: the server keeps only its digest.
Give it to the runner as BERTH_RUNNER_REGISTRATION_TOKEN for its first start.
With -o json it prints {"token", "node_id", "region", "expires_at"}.`,
		Example: `  berth runner enroll-token create --node runner-west-01 --region us-west
  berth runner enroll-token create --node runner-west-01 --region us-west --ttl 15m -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl < time.Second {
				return fmt.Errorf("--ttl %s: want at least 1s", ttl)
			}
			if node == "" {
				return fmt.Errorf("--node is required")
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			e, err := c.CreateRunnerEnrollment(cmd.Context(), client.RunnerEnrollmentRequest{NodeID: node, Region: region, TTLSeconds: int(ttl / time.Second)})
			if err != nil {
				return fmt.Errorf("create runner enrollment token: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, e)
			}
			fmt.Fprintf(a.stdout, "Runner enrollment token for node %s in region %q; it expires at %s:\n\n  %s\n\n",
				e.NodeID, e.Region, e.ExpiresAt.UTC().Format(time.RFC3339), e.Token)
			fmt.Fprintln(a.stdout, "Warning: the token is shown once and cannot be retrieved again; it enrolls this node once.")
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid (at most 168h)")
	create.Flags().StringVar(&node, "node", "", "the runner's node id (a DNS label); required")
	create.Flags().StringVar(&region, "region", "", "the region the runner must declare")
	tok.AddCommand(create)

	list := &cobra.Command{
		Use:   "list",
		Short: "List runner nodes with capacity, reservations and state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			rs, err := c.ListRunners(cmd.Context())
			if err != nil {
				return fmt.Errorf("list runners: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, rs)
			}
			fmt.Fprintf(a.stdout, "%-24s %-12s %-9s %-9s %s\n", "ID", "REGION", "CAPACITY", "RESERVED", "STATE")
			for _, r := range rs {
				state := "online"
				switch {
				case r.Revoked:
					state = "revoked"
				case !r.Online:
					state = "offline"
				case r.Draining:
					state = "draining"
				}
				fmt.Fprintf(a.stdout, "%-24s %-12s %-9d %-9d %s\n", r.ID, r.Region, r.Capacity, r.Reserved, state)
			}
			return nil
		},
	}
	cmd.AddCommand(tok, list)
	return cmd
}

// newPlacementCmd is `berth placement`: a project's desired placement on runner nodes
// (docs/runner-protocol.md section 4).
func newPlacementCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "placement", RunE: groupRunE, Short: "Set and show a project's placement on runner nodes; explain where a service's replicas run"}
	var (
		release, state, mode, region string
		units                        int
		endpoint, provider           bool
		labels                       map[string]string
	)
	set := &cobra.Command{
		Use:   "set --release BUNDLE [--state running|stopped] [--mode portable|stateful] [--region R] [--units N]",
		Short: "Record the project's next desired generation and assign it to a runner node",
		Long: `set records the next desired generation of the current project's placement:
a release (bundle name or digest), a run state, and, the first time or to
change them, the placement mode, region, capacity units and node requirements.
Omitted values are inherited from the previous generation. An assigned
placement gets a reconcile operation that its runner node claims.`,
		Example: `  berth placement set --release hello --units 2 --require-label isolation=docker`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			req := client.PlacementRequest{Release: release, State: state}
			fl := cmd.Flags()
			if fl.Changed("mode") {
				req.PlacementMode = &mode
			}
			if fl.Changed("region") {
				req.Region = &region
			}
			if fl.Changed("units") {
				req.CapacityUnits = &units
			}
			if fl.Changed("require-endpoint") || fl.Changed("require-label") {
				req.NodeRequirements = &client.NodeRequirements{Endpoint: endpoint, Labels: labels}
			}
			if fl.Changed("provider") {
				req.Provider = &provider
			}
			p, err := c.SetPlacement(cmd.Context(), s.Project, req)
			if err != nil {
				return fmt.Errorf("set placement: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, p)
			}
			fmt.Fprintf(a.stdout, "Generation %d of %s: %s on %q (%s, %d units, %s).\n", p.Generation, s.Project, p.Status, p.NodeID, p.PlacementMode, p.CapacityUnits, p.State)
			return nil
		},
	}
	set.Flags().StringVar(&release, "release", "", "bundle name or digest of the project; required")
	set.Flags().StringVar(&state, "state", "running", "running or stopped")
	set.Flags().StringVar(&mode, "mode", "portable", "placement mode: portable or stateful (cannot change later)")
	set.Flags().StringVar(&region, "region", "", "region the runner node must be in")
	set.Flags().IntVar(&units, "units", 1, "capacity units to reserve")
	set.Flags().BoolVar(&endpoint, "require-endpoint", false, "the runner node must have registered an endpoint")
	set.Flags().StringToStringVar(&labels, "require-label", nil, "labels the runner node must have, k=v")
	set.Flags().BoolVar(&provider, "provider", false, "provider placement: the runner runs the runtime and fetches it with the runtime call (first generation only)")
	get := &cobra.Command{
		Use: "get", Short: "Show the project's placement", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			p, err := c.GetPlacement(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("get placement: %w", err)
			}
			return printJSON(a.stdout, p)
		},
	}
	rollback := &cobra.Command{
		Use:   "rollback",
		Short: "Ask the provider runner to roll back the project's current generation",
		Long: `rollback enqueues a rollback operation for the current project's exact current
generation, for a project placed with --provider. The runner derives the
confirmation itself; nothing else is sent.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			op, err := c.RollbackPlacement(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("rollback placement: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, op)
			}
			fmt.Fprintf(a.stdout, "Operation %s (rollback) is %s.\n", op.ID, op.State)
			return nil
		},
	}
	del := &cobra.Command{
		Use:   "delete",
		Short: "Delete the project's placement, revoke its operations and remove its fence sequence",
		Long: `delete runs the project-delete workflow of the current project's orchestration
state under the project lease: it holds the placement, waits for a provider
runner's delete operation (for --provider placements), revokes the project's
operations, removes the placement and finally the project's fence sequence.
Every step is safe to repeat: run it again while it reports waiting_for_provider.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			d, err := c.DeletePlacement(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("delete placement: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, d)
			}
			switch d.Status {
			case "waiting_for_provider":
				fmt.Fprintf(a.stdout, "Waiting for the provider's delete operation %s; run this again once it has settled.\n", d.ProviderOperation)
			default:
				fmt.Fprintf(a.stdout, "Placement of %s deleted; %d operations revoked.\n", s.Project, d.Revoked)
			}
			return nil
		},
	}
	cmd.AddCommand(set, get, rollback, del, newPlacementExplainCmd(a))
	return cmd
}

// newOperationCmd is `berth operation`: the project's operation queue (docs/runner-protocol.md
// section 5).
func newOperationCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "operation", RunE: groupRunE, Short: "Enqueue and list a project's operations"}
	var kind, key, payload, target string
	create := &cobra.Command{
		Use:   "create --kind KIND --idempotency-key KEY [--payload JSON] [--target NODE]",
		Short: "Enqueue an operation; the same key and body converge to one operation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if key == "" {
				return fmt.Errorf("--idempotency-key is required")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			req := client.OperationRequest{Kind: kind, TargetNode: target}
			if payload != "" {
				req.Payload = []byte(payload)
			}
			op, replayed, err := c.EnqueueOperation(cmd.Context(), s.Project, key, req)
			if err != nil {
				return fmt.Errorf("enqueue operation: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, op)
			}
			note := ""
			if replayed {
				note = " (replayed: this key was used before)"
			}
			fmt.Fprintf(a.stdout, "Operation %s (%s) is %s%s.\n", op.ID, op.Kind, op.State, note)
			return nil
		},
	}
	create.Flags().StringVar(&kind, "kind", "", "what the operation does, e.g. reconcile; required")
	create.Flags().StringVar(&key, "idempotency-key", "", "repeat-safe key of this request; required")
	create.Flags().StringVar(&payload, "payload", "", "JSON payload (never secrets)")
	create.Flags().StringVar(&target, "target", "", "runner node that must run it (default: any)")
	list := &cobra.Command{
		Use: "list", Short: "List the project's operations, oldest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ops, err := c.ListOperations(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list operations: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ops)
			}
			return printOperations(a.stdout, ops)
		},
	}
	cmd.AddCommand(create, list)
	return cmd
}

// printOperations writes operations as an aligned table.
func printOperations(w io.Writer, ops []client.Operation) error {
	tw := newTable(w)
	row(tw, "ID", "KIND", "STATE", "ATTEMPTS", "FENCE", "NODE")
	for _, o := range ops {
		row(tw, o.ID, o.Kind, o.State, o.Attempts, o.Fence, orDash(o.NodeID))
	}
	return tw.Flush()
}
