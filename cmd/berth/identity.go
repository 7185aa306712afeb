package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// parseLifetime reads "90d", "1y" or a Go duration ("12h").
func parseLifetime(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	for suffix, unit := range map[string]time.Duration{"d": 24 * time.Hour, "y": 365 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.Atoi(n)
			if err != nil || v <= 0 {
				return 0, fmt.Errorf("lifetime %q: want a positive whole number before %q", s, suffix)
			}
			return time.Duration(v) * unit, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("lifetime %q: want e.g. 90d, 1y or 12h", s)
	}
	return d, nil
}

func newTokenCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token create|list|revoke|rotate",
		Short: "Create, list, revoke and rotate machine tokens",
		Long: `token manages named machine tokens (brt_) for CI jobs and scripts
(docs/api.md section 9.3). A token carries scopes, may be bounded to one
project and one service of it, expires within a year, and never holds the
human-only scopes node:enroll, node:remove or node:fence_ack. The token is
printed once, at create and rotate.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	var name, service, expires, owner string
	var scopes []string
	create := &cobra.Command{
		Use:   "create --name NAME --scope SCOPE [--project P [--service S]] [--expires 90d]",
		Short: "Create a machine token and print it once",
		Example: `  berth token create --name ci-deploy --scope service:deploy --project shop --service web --expires 90d
  berth token create --name reader --scope services:read --scope nodes:read -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ttl, err := parseLifetime(expires)
			if err != nil {
				return err
			}
			project := ""
			if cmd.Flags().Changed("project") {
				project = a.project
			}
			out, err := c.CreateToken(cmd.Context(), client.NewMachineToken{Name: name, Scopes: scopes, Project: project,
				Service: service, ExpiresIn: ttl, Owner: owner})
			if err != nil {
				return fmt.Errorf("create token %s: %w", name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Token %s created; it expires at %s.\n", out.Info.Name, fmtTime(out.Info.ExpiresAt))
			fmt.Fprintf(a.stdout, "  %s\n", out.Token)
			fmt.Fprintln(a.stdout, "Warning: the token is shown once and cannot be retrieved again.")
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "token name: lower-case, at most 64 characters, no ':' or '/' (required)")
	create.Flags().StringSliceVar(&scopes, "scope", nil, "scope to grant (repeatable): services:read, services:write, service:deploy, nodes:read, tokens:write, secret:read, secret:use, secret:write, admin")
	create.Flags().StringVar(&service, "service", "", "bound the token to this service of --project")
	create.Flags().StringVar(&expires, "expires", "90d", "lifetime: e.g. 90d, 1y (at most), 12h")
	create.Flags().StringVar(&owner, "owner", "", "user who owns the token (default: you; another owner needs admin and a recent login)")
	_ = create.MarkFlagRequired("name")

	list := &cobra.Command{
		Use:   "list",
		Short: "List machine tokens (never their values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			toks, err := c.ListTokens(cmd.Context())
			if err != nil {
				return fmt.Errorf("list tokens: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, toks)
			}
			w := newTable(a.stdout)
			row(w, "NAME", "OWNER", "SCOPES", "PROJECT", "SERVICE", "CREATED", "LAST USED", "EXPIRES")
			for _, t := range toks {
				last := "-"
				if t.LastUsed != nil {
					last = a.since(*t.LastUsed) + " ago"
				}
				row(w, t.Name, dash(t.Owner), dash(strings.Join(t.Scopes, ",")), dash(t.Project), dash(t.Service),
					fmtTime(&t.CreatedAt), last, fmtTime(t.ExpiresAt))
			}
			return w.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a machine token; its next request fails",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if err := c.RevokeToken(cmd.Context(), args[0]); err != nil {
				return fmt.Errorf("revoke token %s: %w", args[0], err)
			}
			fmt.Fprintf(a.stdout, "token %s revoked\n", args[0])
			return nil
		},
	}
	rotate := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give a machine token a new secret (same grants); the old one fails at once",
		Long: `rotate gives the named token a new secret with the same scopes, bounds and expiry and
prints it once; the old secret fails from then on. Rotating a token takes every right
creating it would (docs/api.md section 9.3). Rotating the token named bootstrap also
writes the new secret to DATA/admin-token of the berthd that serves the request, and
says so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.RotateToken(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("rotate token %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Token %s rotated; the previous secret no longer works.\n  %s\n", out.Info.Name, out.Token)
			switch {
			case out.AdminTokenFile != "":
				fmt.Fprintf(a.stdout, "The new secret was also written to %s on the berthd that served this request.\n", out.AdminTokenFile)
			case out.Info.Name == "bootstrap":
				fmt.Fprintln(a.stdout, "Warning: berthd did not rewrite its DATA/admin-token, which still holds the old, dead secret: this is the only copy of the new one.")
			default:
				fmt.Fprintln(a.stdout, "Warning: the token is shown once and cannot be retrieved again.")
			}
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke, rotate)
	return cmd
}

// parseGrants reads PROJECT=ROLE flags.
func parseGrants(flags []string) ([]client.Grant, error) {
	var out []client.Grant
	for _, g := range flags {
		p, r, ok := strings.Cut(g, "=")
		if !ok || p == "" || r == "" {
			return nil, fmt.Errorf("--grant %q: want PROJECT=ROLE", g)
		}
		out = append(out, client.Grant{Project: p, Role: r})
	}
	return out, nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func newUserCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "user create|list|passwd|set-roles|revoke-sessions|revoke-password",
		Short: "Manage users and their credentials",
		Long: `user manages people and machine users (docs/api.md section 9.1). Roles are
admin, operator and viewer, globally (--role) or for one project
(--grant shop=operator). Passwords are 20 characters to 1024 bytes; they are
read from the terminal without echo, or from stdin with --password-stdin.
Changing a credential ends every session of the user at once and needs a
login within the last 5 minutes.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	var kind string
	var roles, grants []string
	var pwStdin bool
	create := &cobra.Command{
		Use:   "create NAME [--kind human|machine] [--role ROLE] [--grant PROJECT=ROLE] [--password-stdin]",
		Short: "Create a user",
		Example: `  berth user create bob --role operator
  berth user create ci --kind machine --grant shop=operator
  printf '%s\n' "$PW" | berth user create carol --role viewer --password-stdin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			gs, err := parseGrants(grants)
			if err != nil {
				return err
			}
			u := client.NewUser{Name: args[0], Kind: kind, Roles: roles, Grants: gs}
			if kind != "machine" {
				pw, err := a.readPassword(pwStdin, fmt.Sprintf("Password for %s: ", args[0]))
				if err != nil {
					return err
				}
				u.Password = pw
			}
			out, err := c.CreateUser(cmd.Context(), u)
			if err != nil {
				return fmt.Errorf("create user %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "user %s (%s) created\n", out.Name, out.Kind)
			return nil
		},
	}
	create.Flags().StringVar(&kind, "kind", "human", "human or machine (machine users log in only through tokens)")
	create.Flags().StringSliceVar(&roles, "role", nil, "global role (repeatable): admin, operator, viewer")
	create.Flags().StringSliceVar(&grants, "grant", nil, "role within one project (repeatable): PROJECT=ROLE")
	create.Flags().BoolVar(&pwStdin, "password-stdin", false, "read the password from the first line of stdin")

	list := &cobra.Command{
		Use:   "list",
		Short: "List users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			users, err := c.ListUsers(cmd.Context())
			if err != nil {
				return fmt.Errorf("list users: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, users)
			}
			w := newTable(a.stdout)
			row(w, "NAME", "KIND", "ROLES", "GRANTS", "GENERATION", "PASSWORD", "UPDATED")
			for _, u := range users {
				var gs []string
				for _, g := range u.Grants {
					gs = append(gs, g.Project+"="+g.Role)
				}
				pw := "off"
				if u.PasswordEnabled {
					pw = "on"
				}
				row(w, u.Name, u.Kind, dash(strings.Join(u.Roles, ",")), dash(strings.Join(gs, ",")), u.Generation, pw, a.since(u.UpdatedAt)+" ago")
			}
			return w.Flush()
		},
	}
	var pwStdin2 bool
	passwd := &cobra.Command{
		Use:   "passwd NAME [--password-stdin]",
		Short: "Set a new password; every session of the user ends",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			pw, err := a.readPassword(pwStdin2, fmt.Sprintf("New password for %s: ", args[0]))
			if err != nil {
				return err
			}
			u, err := c.ChangeCredential(cmd.Context(), args[0], "rotate_password", 0, pw)
			if err != nil {
				return fmt.Errorf("set the password of %s: %w", args[0], err)
			}
			fmt.Fprintf(a.stdout, "password of %s changed; generation %d, older sessions ended\n", u.Name, u.Generation)
			return nil
		},
	}
	passwd.Flags().BoolVar(&pwStdin2, "password-stdin", false, "read the password from the first line of stdin")
	credOp := func(use, op, short, done string) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NAME",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, _, err := a.apiClient(cmd)
				if err != nil {
					return err
				}
				u, err := c.ChangeCredential(cmd.Context(), args[0], op, 0, "")
				if err != nil {
					return fmt.Errorf("%s %s: %w", use, args[0], err)
				}
				fmt.Fprintf(a.stdout, "%s of %s; generation %d\n", done, u.Name, u.Generation)
				return nil
			},
		}
	}
	var setRoles, setGrants []string
	roleCmd := &cobra.Command{
		Use:     "set-roles NAME [--role ROLE]... [--grant PROJECT=ROLE]...",
		Short:   "Replace a user's roles and per-project grants (effective on its next request)",
		Example: `  berth user set-roles bob --role viewer --grant shop=operator`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			gs, err := parseGrants(setGrants)
			if err != nil {
				return err
			}
			u, err := c.SetRoles(cmd.Context(), args[0], setRoles, gs)
			if err != nil {
				return fmt.Errorf("set roles of %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, u)
			}
			fmt.Fprintf(a.stdout, "roles of %s set\n", u.Name)
			return nil
		},
	}
	roleCmd.Flags().StringSliceVar(&setRoles, "role", nil, "global role (repeatable): admin, operator, viewer")
	roleCmd.Flags().StringSliceVar(&setGrants, "grant", nil, "role within one project (repeatable): PROJECT=ROLE")
	cmd.AddCommand(create, list, passwd, roleCmd,
		credOp("revoke-sessions", "revoke_sessions", "End every session of a user (the password stays)", "sessions ended"),
		credOp("revoke-password", "revoke_password", "Turn password login off for a user and end its sessions", "password login turned off"))
	return cmd
}

func newAuditCmd(a *app) *cobra.Command {
	var actor string
	var since time.Duration
	cmd := &cobra.Command{
		Use:   "audit [--actor X] [--since 1h]",
		Short: "List changes with who made them",
		Long: `audit reads the change log and prints each change with its actor:
user:<name> for a person's session, token:<name> for a machine token, a node
id for a node. --actor keeps the changes of one actor (user:bob, token:ci, or
just the name); --since keeps the recent ones. Token and password changes
appear as user and token entries, never with their values.`,
		Example: `  berth audit --since 1h
  berth audit --actor token:ci-deploy -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			var cut time.Time
			if since > 0 {
				cut = a.clock().Add(-since)
			}
			var out []node.LogEntry
			names := entityNames{}
			from := int64(1)
			for range 10_000 { // at most 5 million entries
				page, head, err := c.Changelog(cmd.Context(), from, node.MaxLogBatch)
				if err != nil {
					return fmt.Errorf("read the change log: %w", err)
				}
				for _, e := range page {
					names.learn(e)
					if e.Time.Before(cut) || (actor != "" && !actorMatches(e.ActorID, actor)) {
						continue
					}
					out = append(out, e)
				}
				if len(page) == 0 || from+int64(len(page)) > head {
					break
				}
				from += int64(len(page))
			}
			if a.output == outputJSON {
				if out == nil {
					out = []node.LogEntry{}
				}
				return printJSON(a.stdout, out)
			}
			w := newTable(a.stdout)
			row(w, "SEQ", "TIME", "ACTOR", "ENTITY", "OP")
			for _, e := range out {
				row(w, e.Seq, e.Time.UTC().Format(time.RFC3339), e.ActorID, e.EntityType+" "+names.name(e.EntityType, e.EntityID), e.Op)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&actor, "actor", "", "only this actor: user:NAME, token:NAME, a node id, or a bare name")
	cmd.Flags().DurationVar(&since, "since", 0, "only changes of this recent span, e.g. 1h")
	return cmd
}

func actorMatches(id, want string) bool {
	if id == want {
		return true
	}
	_, name, ok := strings.Cut(id, ":")
	return ok && !strings.Contains(want, ":") && name == want
}

// entityNames maps the ids of services and projects to their names as the change log's own
// entries carry them (a project's payload is the project, a service's the service), so audit
// shows names without asking for anything more than the log.
type entityNames map[string]string

// learn records the name an entry's payload gives its project or service; a deletion's empty
// payload leaves the last name known.
func (n entityNames) learn(e node.LogEntry) {
	if e.EntityType != "project" && e.EntityType != "service" || len(e.Payload) == 0 {
		return
	}
	var p struct {
		Name    string `json:"name"`
		Project string `json:"project"`
	}
	if json.Unmarshal(e.Payload, &p) != nil || p.Name == "" {
		return
	}
	if e.EntityType == "service" && p.Project != "" {
		p.Name = p.Project + "/" + p.Name
	}
	n[e.EntityType+" "+e.EntityID] = p.Name
}

// name is the entity's name, or its id when the log never named it.
func (n entityNames) name(entityType, id string) string {
	if name, ok := n[entityType+" "+id]; ok {
		return name
	}
	return id
}
