package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/client"
)

func newModuleCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "module",
		Short: "Manage WebAssembly policy and route-compiler modules",
		Long: `module uploads WebAssembly modules and binds them (docs/wasm-abi.md): policies
to the hooks service.apply, service.delete, node.enroll and deploy, and a route
compiler to routes.compile, where it replaces the embedded default.`,
		RunE: groupRunE,
	}
	var kind, entrypoint, opaName, opaVersion string
	push := &cobra.Command{
		Use:   "push FILE.wasm | --kind opa BUNDLE.tar.gz",
		Short: "Upload a module; the server checks it against the ABI",
		Long: `push uploads a module. With --kind opa the file is an OPA bundle built with
opa build -t wasm: its policy.wasm is uploaded with the bundle's data.json,
the deciding entrypoint (--entrypoint, else the one named deny or allow) and
--name and --version in a berth.opa section (docs/wasm-abi.md section 11).`,
		Example: `  berth module push build/wasm/require-digest.wasm
  opa build -t wasm -e berth/deny policy.rego && berth module push --kind opa bundle.tar.gz`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("module push: %w", err)
			}
			switch kind {
			case "", "berth":
				if isGzip(raw) {
					return fmt.Errorf("module push %s: the file is gzip-compressed, not a WebAssembly module; "+
						"it looks like an OPA bundle (opa build -t wasm): push it with --kind opa", args[0])
				}
			case "opa":
				if raw, err = opaBundleModule(raw, entrypoint, opaName, opaVersion); err != nil {
					return fmt.Errorf("module push %s: %w", args[0], err)
				}
			default:
				return fmt.Errorf("module push: --kind %q is neither berth nor opa", kind)
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			m, err := c.PushModule(cmd.Context(), bytes.NewReader(raw))
			if err != nil {
				return fmt.Errorf("module push %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, m)
			}
			fmt.Fprintf(a.stdout, "pushed %s module %s %s as %s\n", m.Kind, m.Name, m.Version, m.Digest)
			return nil
		},
	}
	push.Flags().StringVar(&kind, "kind", "berth", "module kind: berth (a .wasm of Berth's ABI) or opa (an OPA wasm bundle)")
	push.Flags().StringVar(&entrypoint, "entrypoint", "", "--kind opa: the entrypoint that decides (default: the one named deny, else allow)")
	push.Flags().StringVar(&opaName, "name", "", "--kind opa: the module's name (default opa:<entrypoint>)")
	push.Flags().StringVar(&opaVersion, "module-version", "", "--kind opa: the module's version (default the bundle's revision)")
	var noTrunc bool
	list := &cobra.Command{
		Use:   "list [--no-trunc]",
		Short: "List uploaded modules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ms, err := c.Modules(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ms)
			}
			w := newTable(a.stdout)
			row(w, "DIGEST", "KIND", "NAME", "VERSION", "ABI", "SIZE", "AGE")
			for _, m := range ms {
				d := m.Digest
				if !noTrunc {
					d = shortDigest(d)
				}
				row(w, d, m.Kind, m.Name, m.Version, m.ABI, humanBytes(m.Size), a.since(m.CreatedAt))
			}
			return w.Flush()
		},
	}
	list.Flags().BoolVar(&noTrunc, "no-trunc", false, "show full digests (the short one is a prefix 'module bind' accepts too)")
	var hook, project, failure, config string
	bind := &cobra.Command{
		Use:   "bind DIGEST|PREFIX|NAME --hook HOOK [--scope-project P] [--failure-policy fail|ignore] [--config JSON|@FILE]",
		Short: "Bind a policy to a hook, or a route compiler to routes.compile",
		Long: `bind makes a policy module decide a hook, for every project, or with
--scope-project P for project P only. The scope is the binding's own: the
global --project and BERTH_PROJECT (the project you work in) do not set it,
and bind refuses --project to keep the two apart. A module that fails (trap, deadline, error answer) refuses the request under
--failure-policy fail (the default) and only warns under ignore. --config is
JSON handed to the module with every request.

The module is its full digest, a prefix of at least 12 hex digits (the short
digest 'berth module list' shows), or its name; a prefix or a name must match
exactly one pushed module, else the server lists the candidates.

With --hook routes.compile, a route-compiler module compiles the gateway's
route table from the next reconcile pass on, in place of the embedded default;
it replaces any earlier routes.compile binding. It takes no --scope-project or
--config. When it fails, the last good table stays in force and 'berth routes'
shows the failure. Unbinding it returns to the default.`,
		Example: `  berth module bind sha256:4f1c... --hook service.apply
  berth module bind require-digest --hook service.apply
  berth module bind sha256:9a2b... --hook service.apply --config '{"labels":["team"]}'
  berth module bind sha256:9a2b... --hook deploy --scope-project shop
  berth module bind sha256:77e0... --hook routes.compile`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("project") {
				return errors.New("module bind: --project is the project you work in, not the projects a binding covers; " +
					"use --scope-project P to bind for project P only (without it the binding covers every project)")
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			req := client.BindingRequest{Hook: hook, Module: args[0], Project: project, FailurePolicy: failure}
			if config != "" {
				raw := []byte(config)
				if name, ok := strings.CutPrefix(config, "@"); ok {
					if raw, err = os.ReadFile(name); err != nil {
						return fmt.Errorf("module bind: %w", err)
					}
				}
				if !json.Valid(raw) {
					return fmt.Errorf("module bind: --config is not JSON")
				}
				req.Config = raw
			}
			b, err := c.Bind(cmd.Context(), req)
			if err != nil {
				return fmt.Errorf("module bind: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, b)
			}
			if b.Hook == "routes.compile" {
				fmt.Fprintf(a.stdout, "bound route compiler %s as %s\n", b.Module, b.ID)
			} else {
				fmt.Fprintf(a.stdout, "bound %s to %s as %s (failure policy %s)\n", b.Module, b.Hook, b.ID, b.FailurePolicy)
			}
			for _, id := range b.Replaced {
				fmt.Fprintf(a.stdout, "replaced %s\n", id)
			}
			return nil
		},
	}
	bind.Flags().StringVar(&hook, "hook", "", "service.apply, service.delete, node.enroll, deploy or routes.compile (required)")
	bind.Flags().StringVar(&project, "scope-project", "", "the one project the binding covers (default: every project); not set by --project or BERTH_PROJECT")
	bind.Flags().StringVar(&failure, "failure-policy", "fail", "fail or ignore: what a failing module means")
	bind.Flags().StringVar(&config, "config", "", "JSON configuration, or @FILE")
	_ = bind.MarkFlagRequired("hook")
	unbind := &cobra.Command{
		Use:   "unbind BINDING_ID",
		Short: "Remove a binding (unbinding routes.compile returns to the default compiler)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if err := c.Unbind(cmd.Context(), args[0]); err != nil {
				return fmt.Errorf("module unbind: %w", err)
			}
			fmt.Fprintf(a.stdout, "unbound %s\n", args[0])
			return nil
		},
	}
	bindings := &cobra.Command{
		Use:   "bindings",
		Short: "List bindings",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			bs, err := c.Bindings(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, bs)
			}
			w := newTable(a.stdout)
			row(w, "ID", "HOOK", "MODULE", "DIGEST", "PROJECT", "FAILURE", "AGE")
			for _, b := range bs {
				row(w, b.ID, b.Hook, b.Module, shortDigest(b.ModuleDigest), orDash(b.Project), b.FailurePolicy, a.since(b.CreatedAt))
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(push, list, bind, unbind, bindings)
	return cmd
}

// matchCell shows a route's match conditions (docs/routes.md section 3):
// "/api (strip) X-Env=canary", or "-" for none.
func matchCell(r abiroutes.Route) string {
	var parts []string
	if r.PathPrefix != "" {
		p := r.PathPrefix
		if r.StripPrefix {
			p += " (strip)"
		}
		parts = append(parts, p)
	}
	for _, h := range r.Headers {
		parts = append(parts, h.Name+"="+h.Value)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func newRoutesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "routes",
		Short: "Show the route table in force and its SHA-256",
		Long: `routes shows the gateway's route table as the route compiler made it, the
table's SHA-256, the compiler (a WebAssembly module by default) and the last
compile failure, if the newest compilation failed. A hostname may have
several routes, told apart by their MATCH column: a path prefix ("(strip)"
when the upstream gets the path without it) and request headers, listed in
the order the gateway tries them (docs/routes.md section 3). Below the table it lists
the hostnames route claims exclude: declared by several services, none of
which holds the hostname's claim, so served for none of them
(docs/routes.md section 2).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			st, err := c.Routes(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, st)
			}
			fmt.Fprintf(a.stdout, "sha256:   %s\ncompiler: %s\nrevision: %d\n", st.SHA256, st.Compiler, st.Table.Revision)
			if st.LastError != "" {
				ago := "-"
				if st.LastErrorAt != nil {
					ago = a.since(*st.LastErrorAt) + " ago"
				}
				fmt.Fprintf(a.stdout, "failing:  %s (%s): %s\n          keeping the last good table, below\n", orDash(st.FailingCompiler), ago, st.LastError)
			}
			fmt.Fprintln(a.stdout)
			w := newTable(a.stdout)
			row(w, "HOSTNAME", "MATCH", "SERVICE", "TLS", "CERTIFICATE", "ALLOW", "UPSTREAMS", "HEALTHY")
			for _, r := range st.Table.Routes {
				healthy := 0
				var addrs []string
				for _, u := range r.Upstreams {
					addrs = append(addrs, u.Address)
					if u.Healthy {
						healthy++
					}
				}
				row(w, r.Hostname, matchCell(r), r.Project+"/"+r.Service, orDash(r.TLSMode), certificateCell(st.Certificates, r.Hostname, r.TLSMode),
					joinOrDash(r.AllowSources), joinOrDash(addrs), fmt.Sprintf("%d/%d", healthy, len(r.Upstreams)))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			printCertificateErrors(a.stdout, st.Table.Routes, st.Certificates)
			if len(st.Table.Excluded) == 0 {
				return nil
			}
			fmt.Fprintln(a.stdout, "\nexcluded (served for no service):")
			w = newTable(a.stdout)
			row(w, "HOSTNAME", "REASON")
			for _, e := range st.Table.Excluded {
				row(w, e.Hostname, e.Reason)
			}
			return w.Flush()
		},
	}
}
