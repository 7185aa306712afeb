package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	client "github.com/berthhq/berth/sdk/client"
)

// resourceFile is one document of `berth resource apply|plan -f` (docs/resources.md section 1).
type resourceFile struct {
	Type    string         `json:"type" yaml:"type"`
	Name    string         `json:"name" yaml:"name"`
	Project string         `json:"project" yaml:"project"`
	OnDrift string         `json:"on_drift" yaml:"on_drift"`
	Spec    map[string]any `json:"spec" yaml:"spec"`
}

// readResourceFile reads one resource declaration (YAML or JSON) from r.
func readResourceFile(r io.Reader, name string) (resourceFile, []byte, error) {
	var f resourceFile
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return f, nil, fmt.Errorf("parse %s: %w", name, err)
	}
	if f.Type == "" || f.Name == "" {
		return f, nil, fmt.Errorf("parse %s: type and name are required", name)
	}
	if f.Spec == nil {
		f.Spec = map[string]any{}
	}
	spec, err := json.Marshal(f.Spec)
	if err != nil {
		return f, nil, fmt.Errorf("parse %s: spec: %w", name, err)
	}
	return f, spec, nil
}

// splitRef splits TYPE/NAME.
func splitRef(ref string) (string, string, error) {
	i := strings.LastIndex(ref, "/")
	if i <= 0 || i == len(ref)-1 {
		return "", "", fmt.Errorf("%q: want TYPE/NAME, e.g. hello.greeting/w1", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// newResourceCmd is `berth resource`.
func newResourceCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "resource", Aliases: []string{"resources"}, RunE: groupRunE,
		Short: "Declare, plan and watch resources of the types provider plugins declare",
		Long: `resource manages declared resources (docs/resources.md): objects of any type a
provider plugin of berthd declares ('berth resource types'), kept as desired
state, applied by operations and read back periodically to find drift.

A file declares one resource:

  type: hello.greeting
  name: w1
  project: default        # optional; --project or the default otherwise
  on_drift: report        # report (default) | reconcile
  spec: {message: hello}  # checked against the type's JSON Schema`}
	var file string
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Declare a resource: store its spec as a new generation and apply it through its provider",
		Long: `apply checks the spec against the type's schema (422 naming the field, nothing
stored), stores it as a new generation when it changed, and answers at once;
the provider's work runs as an operation ('berth resource get' shows the
status: progressing, ready, failed, drifted).`,
		Example: "  berth resource apply -f greeting.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, s, f, spec, err := a.resourceInput(cmd, "resource apply", file)
			if err != nil {
				return err
			}
			r, err := c.ApplyResource(cmd.Context(), project(f, s), f.Type, f.Name, client.ResourceApply{Spec: spec, OnDrift: f.OnDrift})
			if err != nil {
				return fmt.Errorf("apply %s/%s: %w", f.Type, f.Name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, r)
			}
			fmt.Fprintf(a.stdout, "%s/%s: generation %d, %s\n", r.Type, r.Name, r.Generation, r.Status)
			return nil
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "the resource file (YAML or JSON; - for stdin)")
	plan := &cobra.Command{
		Use:   "plan -f FILE",
		Short: "Show what applying a resource file would change, changing nothing",
		Long: `plan asks the type's provider what applying the file would do over the
resource's current state and prints the difference, one line per field:
"+ field: value" added, "- field: value" removed, "~ field: old -> new".`,
		Example: "  berth resource plan -f greeting.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, s, f, spec, err := a.resourceInput(cmd, "resource plan", file)
			if err != nil {
				return err
			}
			p, err := c.PlanResource(cmd.Context(), project(f, s), f.Type, f.Name, client.ResourceApply{Spec: spec, OnDrift: f.OnDrift})
			if err != nil {
				return fmt.Errorf("plan %s/%s: %w", f.Type, f.Name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, p)
			}
			if !p.Changes {
				fmt.Fprintf(a.stdout, "%s/%s: no changes\n", p.Type, p.Name)
				return nil
			}
			fmt.Fprintf(a.stdout, "%s/%s:\n", p.Type, p.Name)
			for _, l := range p.Diff {
				fmt.Fprintf(a.stdout, "  %s\n", l)
			}
			return nil
		},
	}
	plan.Flags().StringVarP(&file, "file", "f", "", "the resource file (YAML or JSON; - for stdin)")
	get := &cobra.Command{
		Use:     "get [TYPE/NAME]",
		Short:   "List the project's resources, or show one",
		Example: "  berth resource get\n  berth resource get hello.greeting/w1 -o json",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			var items []client.Resource
			if len(args) == 1 {
				typ, name, err := splitRef(args[0])
				if err != nil {
					return err
				}
				r, err := c.GetResource(cmd.Context(), s.Project, typ, name)
				if err != nil {
					return fmt.Errorf("get %s: %w", args[0], err)
				}
				items = []client.Resource{*r}
			} else if items, err = c.ListResources(cmd.Context(), s.Project); err != nil {
				return fmt.Errorf("list resources of %s: %w", s.Project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "TYPE", "NAME", "GENERATION", "APPLIED", "STATUS", "REASON")
			for _, r := range items {
				row(tw, r.Type, r.Name, fmt.Sprint(r.Generation), fmt.Sprint(r.AppliedGeneration), r.Status, orDash(oneLine(r.Reason)))
			}
			return tw.Flush()
		},
	}
	describe := &cobra.Command{
		Use:     "describe TYPE/NAME",
		Short:   "Show one resource: spec, applied state, status with the provider's message",
		Example: "  berth resource describe hello.greeting/w1",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			typ, name, err := splitRef(args[0])
			if err != nil {
				return err
			}
			r, err := c.GetResource(cmd.Context(), s.Project, typ, name)
			if err != nil {
				return fmt.Errorf("describe %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, r)
			}
			fmt.Fprintf(a.stdout, "Resource:    %s/%s (project %s)\nStatus:      %s\n", r.Type, r.Name, r.Project, r.Status)
			if r.Reason != "" {
				fmt.Fprintf(a.stdout, "Reason:      %s\n", r.Reason)
			}
			if r.Message != "" {
				fmt.Fprintf(a.stdout, "Message:     %s\n", r.Message)
			}
			fmt.Fprintf(a.stdout, "Generation:  %d (applied %d)\nOn drift:    %s\nDrifts:      %d\nOperation:   %s\nSpec:        %s\nApplied:     %s\n",
				r.Generation, r.AppliedGeneration, r.OnDrift, r.Drifts, orDash(r.OperationID), r.Spec, orDash(string(r.Applied)))
			for _, k := range slices.Sorted(maps.Keys(r.Outputs)) {
				fmt.Fprintf(a.stdout, "Output:      %s in secret %s (version %d)\n", k, r.Outputs[k].Secret, r.Outputs[k].Version)
			}
			return nil
		},
	}
	var purge bool
	del := &cobra.Command{
		Use:   "delete TYPE/NAME",
		Short: "Delete a resource through its provider (--purge: its data too)",
		Long: `delete asks the type's provider to delete the resource, as an operation; the
resource shows as deleting until the provider did it, then disappears.`,
		Example: "  berth resource delete hello.greeting/w1",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			typ, name, err := splitRef(args[0])
			if err != nil {
				return err
			}
			r, err := c.DeleteResource(cmd.Context(), s.Project, typ, name, purge)
			if err != nil {
				return fmt.Errorf("delete %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, r)
			}
			fmt.Fprintf(a.stdout, "%s/%s: %s\n", r.Type, r.Name, r.Status)
			return nil
		},
	}
	del.Flags().BoolVar(&purge, "purge", false, "ask the provider to drop the data the resource holds too")
	types := &cobra.Command{
		Use:   "types",
		Short: "List the resource types berthd's provider plugins declare",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ResourceTypes(cmd.Context())
			if err != nil {
				return fmt.Errorf("list resource types: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "TYPE", "PLUGIN", "ROLE", "SCHEMA")
			for _, t := range items {
				schema := "no"
				if len(t.Schema) > 0 {
					schema = "yes"
				}
				row(tw, t.Name, t.Plugin, orDash(t.Role), schema)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(apply, plan, get, describe, del, types)
	return cmd
}

// resourceInput reads -f FILE of command what and returns the API client and settings, the
// declaration and its spec as JSON.
func (a *app) resourceInput(cmd *cobra.Command, what, file string) (*client.Client, settings, resourceFile, []byte, error) {
	c, s, err := a.apiClient(cmd)
	if err != nil {
		return nil, s, resourceFile{}, nil, err
	}
	r, done, err := a.openInput(what, file)
	if err != nil {
		return nil, s, resourceFile{}, nil, err
	}
	defer done()
	f, spec, err := readResourceFile(r, file)
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%s: %s is empty", what, file)
	}
	return c, s, f, spec, err
}

// project is the file's project, or the command's.
func project(f resourceFile, s settings) string {
	if f.Project != "" {
		return f.Project
	}
	return s.Project
}
