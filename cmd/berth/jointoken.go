package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newJoinTokenCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "join-token create",
		RunE:  groupRunE,
		Short: "Create node join tokens",
	}
	var ttl time.Duration
	var cluster string
	create := &cobra.Command{
		Use:   "create [--ttl 1h] [--cluster NAME]",
		Short: "Create a one-time token that enrolls one node",
		Long: `create makes a join token that enrolls exactly one node before it expires,
and prints the berth-agent command to run on that node. When this user cannot
write the agent's default data directory (/var/lib/berth-agent), the command
names --data-dir under ~/.local/share instead, so it works as printed here.
The server keeps only a digest of the token: it is shown once. With -o json it prints
{"token", "join_command", "expires_at"}.`,
		Example: `  berth join-token create
  berth join-token create --ttl 15m -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl < time.Second {
				return fmt.Errorf("--ttl %s: want at least 1s", ttl)
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			tok, err := c.CreateJoinToken(cmd.Context(), client.JoinTokenRequest{TTLSeconds: int(ttl / time.Second), Cluster: cluster})
			if err != nil {
				return fmt.Errorf("create join token: %w", err)
			}
			dir := localJoinDataDir()
			if dir != "" { // this user cannot write the agent's default data directory here
				tok.JoinCommand += " --data-dir " + dir
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, tok)
			}
			fmt.Fprintf(a.stdout, "Join token created; it expires at %s.\n", tok.ExpiresAt.UTC().Format(time.RFC3339))
			fmt.Fprintf(a.stdout, "Run this on the new node:\n\n  %s\n\n", tok.JoinCommand)
			if dir != "" {
				fmt.Fprintf(a.stdout, "This user cannot write %s, so the command names --data-dir %s; run the agent with the same\n"+
					"--data-dir (berth-agent run --data-dir %s), or leave it out on a node where the agent runs as root.\n\n", agentDefaultDataDir, dir, dir)
			}
			fmt.Fprintln(a.stdout, "Warning: the token is shown once and cannot be retrieved again; it enrolls one node.")
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid")
	create.Flags().StringVar(&cluster, "cluster", "", "the cluster the node joins (default: the default cluster); for a cluster\nreached through a relay, run the printed command with --server naming the relay and\n--fingerprint its certificate's")
	cmd.AddCommand(create)
	return cmd
}
