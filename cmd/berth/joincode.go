package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newJoinCodeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "join-code create",
		RunE:  groupRunE,
		Short: "Create join codes that set up and enroll a fresh host",
	}
	var expires time.Duration
	var labels []string
	create := &cobra.Command{
		Use:   "create [--labels k=v,...] [--expires 30m]",
		Short: "Create a one-time join code and print the command that sets a host up with it",
		Long: `create makes a short join code that enrolls exactly one node before it expires
(30 minutes by default, 24 hours at most), and prints the one-line command to
run as root on the new host: it fetches the setup script from berthd over a
connection pinned to berthd's key, and the script downloads berth-agent for
the host's architecture from berthd, checks its checksum, enrolls the host
with the code and starts the agent (docs/joining.md). The node gets --labels.
An unknown, expired or used code makes the command fail with one message.
The server keeps only a digest of the code: it is shown once. With -o json it
prints {"code", "node_id", "join_command", "setup_url", "expires_at"}.`,
		Example: `  berth join-code create
  berth join-code create --labels role=web,zone=a --expires 2h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if expires < 0 || expires > 24*time.Hour {
				return fmt.Errorf("--expires %s: want at most 24h", expires)
			}
			req := client.JoinCodeRequest{TTLSeconds: int(expires / time.Second)}
			var err error
			if req.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			code, err := c.CreateJoinCode(cmd.Context(), req)
			if err != nil {
				return fmt.Errorf("create join code: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, code)
			}
			fmt.Fprintf(a.stdout, "Join code created for node %s; it expires at %s.\nRun this as root on the new host:\n\n  %s\n\n",
				code.NodeID, code.ExpiresAt.UTC().Format(time.RFC3339), code.JoinCommand)
			fmt.Fprintln(a.stdout, "Warning: the code is shown once and enrolls one node.")
			return nil
		},
	}
	create.Flags().DurationVar(&expires, "expires", 30*time.Minute, "how long the code stays valid (at most 24h)")
	create.Flags().StringArrayVar(&labels, "labels", nil, "labels of the node, key=value[,key=value] (repeatable)")
	cmd.AddCommand(create)
	return cmd
}
