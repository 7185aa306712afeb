package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/sdk/client"
)

func newClusterCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		RunE:  groupRunE,
		Short: "Clusters, their relays and relay credentials; cluster-wide operations",
		Long: `A cluster is a group of nodes. Every node belongs to one: the cluster its join token
names (berth join-token create --cluster NAME), or the default cluster. A cluster created with
--requires-relay is reached through one berth-relay: its nodes dial the relay, never berthd
(docs/relay.md).`,
	}
	var requiresRelay bool
	create := &cobra.Command{
		Use:     "create NAME [--requires-relay]",
		Short:   "Create a cluster",
		Example: "  berth cluster create eu-1 --requires-relay",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			cl, err := c.CreateCluster(cmd.Context(), args[0], requiresRelay)
			if err != nil {
				return fmt.Errorf("create cluster %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, cl)
			}
			fmt.Fprintf(a.stdout, "Cluster %s created.\n", cl.Name)
			if cl.RequiresRelay {
				fmt.Fprintf(a.stdout, "Issue its relay credential with: berth cluster relay-credential ensure %s\n", cl.Name)
			}
			return nil
		},
	}
	create.Flags().BoolVar(&requiresRelay, "requires-relay", false, "the cluster's nodes are reached through one relay")

	list := &cobra.Command{
		Use:   "list",
		Short: "List clusters and the state of their relay",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			all, err := c.ListClusters(cmd.Context())
			if err != nil {
				return fmt.Errorf("list clusters: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, all)
			}
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "NAME\tRELAY\tSTATE\tGENERATION")
			for _, cl := range all {
				relay, gen := "no", "-"
				if cl.RequiresRelay {
					relay = "required"
				}
				if cl.Credential != nil {
					gen = fmt.Sprint(cl.Credential.Generation)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cl.Name, relay, dash(cl.Election.State), gen)
			}
			return tw.Flush()
		},
	}

	status := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a cluster's relay (its version and address), the election's state and its nodes",
		Long: `status shows which relay carries the cluster: "connected" names the one live registered
relay, relay_not_connected says none is, relay_ambiguous names the two or more that registered
at once (the core carries no new node connection for the cluster until one is gone).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			st, err := c.ClusterStatus(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("cluster %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, st)
			}
			return printClusterStatus(a, st)
		},
	}

	var out string
	credential := func(use, short, long string, call func(cmd *cobra.Command, c *client.Client, name string) (*client.RelayCredential, error)) *cobra.Command {
		sub := &cobra.Command{
			Use: use + " NAME [--out FILE]", Short: short, Long: long, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, _, err := a.apiClient(cmd)
				if err != nil {
					return err
				}
				rc, err := call(cmd, c, args[0])
				if err != nil {
					return fmt.Errorf("relay credential of %s: %w", args[0], err)
				}
				if rc.Credential == "" {
					if a.output == outputJSON {
						return printJSON(a.stdout, rc)
					}
					fmt.Fprintf(a.stdout, "Cluster %s holds relay credential generation %d already; it is never shown again.\n"+
						"Rotate it (berth cluster relay-credential rotate %s) for a new one.\n", rc.Cluster, rc.Generation, rc.Cluster)
					return nil
				}
				if out != "" {
					if err := securefile.WriteFile(out, []byte(rc.Credential+"\n")); err != nil {
						return fmt.Errorf("--out: %w", err)
					}
					rc.Credential = ""
				}
				if a.output == outputJSON {
					return printJSON(a.stdout, rc)
				}
				fmt.Fprintf(a.stdout, "Relay credential of cluster %s, generation %d.\n", rc.Cluster, rc.Generation)
				if out != "" {
					fmt.Fprintf(a.stdout, "Written to %s (mode 0600); pass it to berth-relay --credential-file.\n", out)
				} else {
					fmt.Fprintf(a.stdout, "\n  %s\n\nWarning: it is shown once. Put it in a 0600 file for berth-relay --credential-file.\n", rc.Credential)
				}
				return nil
			},
		}
		sub.Flags().StringVar(&out, "out", "", "write the credential to FILE (mode 0600) instead of printing it")
		return sub
	}
	rcCmd := &cobra.Command{Use: "relay-credential", RunE: groupRunE, Short: "Issue or rotate a cluster's relay credential"}
	rcCmd.AddCommand(
		credential("ensure", "Issue the cluster's relay credential when it has none",
			`ensure issues the first relay credential of a cluster created with --requires-relay and shows
it once (the core keeps only its SHA-256 digest). When the cluster holds one already it says
which generation and shows nothing.`,
			func(cmd *cobra.Command, c *client.Client, name string) (*client.RelayCredential, error) {
				return c.EnsureRelayCredential(cmd.Context(), name)
			}),
		credential("rotate", "Replace the cluster's relay credential; the old one stops at once",
			`rotate issues a credential of the next generation. There is no overlap: the old credential
authenticates nothing from now on, the relay holding it is disconnected and parks (it stays up,
not ready, and never registers again) until it is restarted with the new one.`,
			func(cmd *cobra.Command, c *client.Client, name string) (*client.RelayCredential, error) {
				return c.RotateRelayCredential(cmd.Context(), name)
			}),
	)
	cmd.AddCommand(create, list, status, rcCmd, newRotateSigningKeyCmd(a))
	return cmd
}

// newRotateSigningKeyCmd is berth cluster rotate-signing-key: the key of this berthd's whole
// fleet, every cluster's nodes included.
func newRotateSigningKeyCmd(a *app) *cobra.Command {
	return &cobra.Command{
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
}

func printClusterStatus(a *app, st *client.ClusterStatus) error {
	cl := st.Cluster
	fmt.Fprintf(a.stdout, "Cluster:   %s\n", cl.Name)
	if !cl.RequiresRelay {
		fmt.Fprintln(a.stdout, "Relay:     none (its nodes dial berthd)")
	} else {
		gen := "none issued"
		if cl.Credential != nil {
			gen = fmt.Sprint(cl.Credential.Generation)
		}
		fmt.Fprintf(a.stdout, "Relay:     %s\n", st.Election.State)
		if st.Election.Detail != "" {
			fmt.Fprintf(a.stdout, "Detail:    %s\n", st.Election.Detail)
		}
		fmt.Fprintf(a.stdout, "Credential generation: %s\n", gen)
		if len(st.Election.Live) > 0 {
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "\nRELAY\tVERSION\tADDRESS\tNODE\tSEQUENCE\tGENERATION\tRENEWED")
			for _, r := range st.Election.Live {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.RelayID, dash(r.Build), r.Address, dash(r.NodeID), r.Sequence, r.Generation,
					time.Since(r.RenewedAt).Round(time.Second).String()+" ago")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(a.stdout, "\nNodes (%d):\n", len(st.Nodes))
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "ID\tHOSTNAME\tSTATUS\tAGENT")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.Hostname, n.Status, dash(strings.TrimSpace(n.AgentVersion)))
	}
	return tw.Flush()
}
