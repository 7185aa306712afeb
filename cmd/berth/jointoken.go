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
	create := &cobra.Command{
		Use:   "create [--ttl 1h]",
		Short: "Create a one-time token that enrolls one node",
		Long: `create makes a join token that enrolls exactly one node before it expires,
and prints the berth-agent command to run on that node. The server keeps only
a digest of the token: it is shown once. With -o json it prints
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
			tok, err := c.CreateJoinToken(cmd.Context(), client.JoinTokenRequest{TTLSeconds: int(ttl / time.Second)})
			if err != nil {
				return fmt.Errorf("create join token: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, tok)
			}
			fmt.Fprintf(a.stdout, "Join token created; it expires at %s.\n", tok.ExpiresAt.UTC().Format(time.RFC3339))
			fmt.Fprintf(a.stdout, "Run this on the new node:\n\n  %s\n\n", tok.JoinCommand)
			fmt.Fprintln(a.stdout, "Warning: the token is shown once and cannot be retrieved again; it enrolls one node.")
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid")
	cmd.AddCommand(create)
	return cmd
}
