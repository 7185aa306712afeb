package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newClusterCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster rotate-signing-key",
		RunE:  groupRunE,
		Short: "Cluster-wide operations",
	}
	rotate := &cobra.Command{
		Use:   "rotate-signing-key",
		Short: "Replace the key that signs every node's desired state",
		Long: `rotate-signing-key makes berthd generate a new cluster signing key
(docs/node-protocol.md section 5.21). berthd keeps the old key, sends every
connected node signing_key_rotate signed by the key it pins, and signs
everything after with the new key. A node that is not connected is handed the
new key when it next connects. Needs the admin scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.RotateSigningKey(cmd.Context())
			if err != nil {
				return fmt.Errorf("rotate the signing key: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			acked := 0
			for _, n := range out.Nodes {
				if n.Acknowledged {
					acked++
				} else {
					fmt.Fprintf(a.stdout, "node %s did not acknowledge (%s); it gets the key at its next session\n", n.NodeID, n.Error)
				}
			}
			fmt.Fprintf(a.stdout, "Signing key rotated to %s; %d of %d connected nodes acknowledged.\n", out.KeyID, acked, len(out.Nodes))
			return nil
		},
	}
	cmd.AddCommand(rotate)
	return cmd
}
