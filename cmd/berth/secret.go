package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// maxSecretBytes is the largest value berthd accepts (docs/api.md section 10.1).
const maxSecretBytes = 64 << 10

// secretTarget splits "project/name" (or "name" in --project).
func (a *app) secretTarget(arg string) (project, name string) {
	if p, n, ok := strings.Cut(arg, "/"); ok {
		return p, n
	}
	return a.project, arg
}

// readSecretValue reads the value from path, or from stdin when path is empty (one trailing line
// terminator dropped, so `echo VALUE |` and a here-string work). Values never come from argv,
// where the process list and the shell history would keep them.
func readSecretValue(stdin io.Reader, path string) ([]byte, error) {
	var r io.Reader = stdin
	if path != "" {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("read secret value: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("read secret value: %s is not a regular file", path)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read secret value: %w", err)
		}
		defer f.Close()
		r = f
	}
	v, err := io.ReadAll(io.LimitReader(r, maxSecretBytes+3))
	if err != nil {
		return nil, fmt.Errorf("read secret value: %w", err)
	}
	if path == "" {
		v = bytes.TrimSuffix(v, []byte("\n"))
		v = bytes.TrimSuffix(v, []byte("\r"))
	}
	if len(v) > maxSecretBytes {
		return nil, fmt.Errorf("read secret value: more than %d bytes", maxSecretBytes)
	}
	if len(v) == 0 {
		return nil, errors.New("read secret value: empty (nothing on stdin or in the file); pipe the value on stdin or use --from-file FILE")
	}
	return v, nil
}

func newSecretCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret set|ls|get|rm",
		Short: "Write, list, inspect and delete a project's secrets",
		Long: `secret manages a project's secrets (docs/api.md section 10). Each set writes a
new immutable version, sealed by berthd; services reference secrets by name
(secrets: {STRIPE_KEY: stripe-key}). No command and no API answer ever shows
a value: reads show versions, keyed digests, authors and which services use
each secret. Values are read from a file or stdin, never from arguments.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	var fromFile string
	set := &cobra.Command{
		Use:   "set [PROJECT/]NAME [--from-file FILE]",
		Short: "Write a new version of a secret from a file or stdin",
		Example: `  berth secret set shop/stripe-key --from-file ./stripe.key
  berth secret set shop/db-url < db-url.txt`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return errors.New("secret set takes only [PROJECT/]NAME: a value is never read from arguments (they show in shell history and the process list); pipe it on stdin or use --from-file FILE")
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			project, name := a.secretTarget(args[0])
			value, err := readSecretValue(cmd.InOrStdin(), fromFile)
			if err != nil {
				return err
			}
			defer clear(value)
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.PutSecret(cmd.Context(), project, name, value)
			if err != nil {
				return fmt.Errorf("set secret %s/%s: %w", project, name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Secret %s/%s is at version %d.\n", out.Project, out.Name, out.Current)
			for _, u := range out.UsedBy {
				fmt.Fprintf(a.stdout, "  used by %s (%s)\n", u.Service, strings.Join(u.Keys, ", "))
			}
			return nil
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file, byte for byte: any bytes, binary included (default: stdin)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the project's secrets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			list, err := c.ListSecrets(cmd.Context(), a.project)
			if err != nil {
				return fmt.Errorf("list secrets of %s: %w", a.project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, client.List[client.Secret]{Items: list})
			}
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "NAME\tCURRENT\tVERSIONS\tUPDATED\tUSED BY")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", s.Name, s.Current, len(s.Versions), fmtTime(&s.UpdatedAt), usedBy(s.UsedBy))
			}
			return tw.Flush()
		},
	}
	get := &cobra.Command{
		Use:   "get [PROJECT/]NAME",
		Short: "Show a secret's versions, digests, authors and users (never its value)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			project, name := a.secretTarget(args[0])
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			s, err := c.GetSecret(cmd.Context(), project, name)
			if err != nil {
				return fmt.Errorf("get secret %s/%s: %w", project, name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, s)
			}
			fmt.Fprintf(a.stdout, "Secret:   %s/%s\nCurrent:  %d\nUsed by:  %s\n\n", s.Project, s.Name, s.Current, usedBy(s.UsedBy))
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "VERSION\tCREATED\tAUTHOR\tDIGEST")
			for _, v := range s.Versions {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", v.Version, fmtTime(&v.CreatedAt), v.Author, v.Digest)
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm [PROJECT/]NAME",
		Short: "Delete a secret and every version (refused while a service uses it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			project, name := a.secretTarget(args[0])
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if err := c.DeleteSecret(cmd.Context(), project, name); err != nil {
				return fmt.Errorf("delete secret %s/%s: %w", project, name, err)
			}
			fmt.Fprintf(a.stdout, "Secret %s/%s deleted.\n", project, name)
			return nil
		},
	}
	cmd.AddCommand(set, ls, get, rm)
	return cmd
}

func usedBy(uses []client.SecretUse) string {
	if len(uses) == 0 {
		return "-"
	}
	var parts []string
	for _, u := range uses {
		p := u.Service
		if u.Via != "" {
			p += " (set " + u.Via + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func newSecretsCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secrets keyring check|rotate",
		Short: "Check and rotate berthd's secrets keyring",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	keyring := &cobra.Command{
		Use:   "keyring check|rotate",
		Short: "Check the keyring, or rotate its key-encryption key",
		Long: `keyring checks berthd's secrets keyring file (docs/secrets.md section 4):
check reads it again and reports its key-encryption keys (KEKs) and how many
secret versions each wraps; rotate adds a KEK, makes it active and re-wraps
every data key in the background, resuming after a restart. The old KEK is
kept until nothing is wrapped by it; with --retire-old it is then removed.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate the keyring and show its KEKs and the latest rotation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			st, err := c.KeyringStatus(cmd.Context())
			if err != nil {
				return fmt.Errorf("check keyring: %w", err)
			}
			if err := printKeyring(a, st); err != nil {
				return err
			}
			if !st.OK {
				return errors.New("the keyring is not valid: " + st.Problem)
			}
			return nil
		},
	}
	var retireOld bool
	rotate := &cobra.Command{
		Use:   "rotate [--retire-old]",
		Short: "Add a KEK, make it active and re-wrap every data key in the background",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			st, err := c.RotateKeyring(cmd.Context(), retireOld)
			if err != nil {
				return fmt.Errorf("rotate keyring: %w", err)
			}
			if err := printKeyring(a, st); err != nil {
				return err
			}
			if a.output != outputJSON {
				fmt.Fprintln(a.stdout, "The re-wrap runs in the background; follow it with: berth secrets keyring check")
			}
			return nil
		},
	}
	rotate.Flags().BoolVar(&retireOld, "retire-old", false, "retire the older KEKs once nothing is wrapped by them")
	keyring.AddCommand(check, rotate)
	cmd.AddCommand(keyring)
	return cmd
}

func printKeyring(a *app, st *client.KeyringStatus) error {
	if a.output == outputJSON {
		return printJSON(a.stdout, st)
	}
	state := "ok"
	if !st.OK {
		state = "INVALID: " + st.Problem
	}
	fmt.Fprintf(a.stdout, "Keyring:  %s\nState:    %s\nActive:   %s\n", st.Path, state, st.ActiveKEK)
	if r := st.Rotation; r != nil {
		fmt.Fprintf(a.stdout, "Rotation: %s towards %s, %d secrets and %d versions re-wrapped", r.State, r.TargetKEK, r.Secrets, r.Rewrapped)
		if len(r.Retired) > 0 {
			fmt.Fprintf(a.stdout, ", retired %s", strings.Join(r.Retired, ", "))
		}
		fmt.Fprintln(a.stdout)
	}
	fmt.Fprintln(a.stdout)
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "KEK\tACTIVE\tCREATED\tWRAPS")
	for _, k := range st.KEKs {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%d\n", k.ID, k.Active, fmtTime(&k.CreatedAt), k.Wraps)
	}
	return tw.Flush()
}

func newNodeRotateKeyCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate-key NODE_ID",
		Short: "Give a node a new key for the secrets sealed to it",
		Long: `rotate-key asks the node, over its session, for a new X25519 key for the
workload secrets sealed to it (docs/node-protocol.md section 6.6), records it
and reseals the node's values to it; the node keeps its previous key until the
next rotation. The node must be connected. Needs admin and a recent login.`,
		Example: "  berth node rotate-key nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.RotateNodeSecretKey(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("rotate the secret key of node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Node %s has a new secret key; its workloads' secrets are sealed to it at the next pass.\n", out.NodeID)
			return nil
		},
	}
}
