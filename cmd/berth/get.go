package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newGetCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get services|nodes|workloads|slots|bundles|leases",
		RunE:  groupRunE,
		Short: "List services, nodes, workloads, a service's slots, bundles or leases",
		Long: `get lists one kind of object as a table, or with -o json as a JSON array
of the API's objects.`,
		Example: `  berth get services --project shop
  berth get nodes -o json
  berth get workloads --all-projects
  berth get slots hello`,
	}
	cmd.AddCommand(newGetServicesCmd(a), newGetNodesCmd(a), newGetWorkloadsCmd(a), newGetSlotsCmd(a), newGetBundlesCmd(a), newGetLeasesCmd(a), newGetBindingsCmd(a), newGetOperationsCmd(a))
	return cmd
}

func newGetBundlesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "bundles",
		Aliases: []string{"bundle"},
		Short:   "List the release bundles pushed to a project",
		Long:    `bundles lists a project's release bundles, newest first, with their name, digest and size.`,
		Example: `  berth get bundles
  berth get bundles -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ListBundles(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list bundles of %s: %w", s.Project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "NAME", "DIGEST", "SIZE", "AGE")
			for _, b := range items {
				row(tw, orDash(b.Name), b.Digest, fmt.Sprintf("%.1f MiB", float64(b.Size)/(1<<20)), a.since(b.CreatedAt))
			}
			return tw.Flush()
		},
	}
}

func newGetServicesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "services",
		Aliases: []string{"service", "svc"},
		Short:   "List the services of a project",
		Long: `services lists the services of the project with their revision, replicas
(desired and ready), verdict, domains, pinned bundle digest and age.

VERDICT is the service's production verdict (docs/reconciliation.md section 7):
converged, converging, waiting(reason) or refused(reason); "-" before one was
decided. A service being deleted shows "deleting" beside it: its slots are
settling, and it disappears once they have. Jobs (kind: job) are not listed
here: "berth job ls" lists them with their schedule and last run.`,
		Example: `  berth get services
  berth get svc --project shop -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			all, err := c.ListServices(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list services of %s: %w", s.Project, err)
			}
			items := slices.DeleteFunc(all, func(v client.Service) bool { return v.Kind == "job" })
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "NAME", "REVISION", "REPLICAS", "READY", "VERDICT", "DOMAINS", "BUNDLE/IMAGE", "AGE")
			for _, v := range items {
				release := shortDigest(v.BundleDigest)
				if v.Runtime == "containerd" && v.Image != "" {
					release = imageCell(v.Container)
				}
				row(tw, v.Name, v.Revision, v.Replicas, fmt.Sprintf("%d/%d", v.Ready, v.Replicas), verdictCell(v),
					joinOrDash(v.Domains), release, a.since(v.CreatedAt))
			}
			return tw.Flush()
		},
	}
}

// verdictCell is a service's VERDICT: the verdict's String, "-" when none was decided, and
// "deleting" beside it (or alone) while the service is being deleted.
func verdictCell(v client.Service) string {
	switch {
	case v.Verdict == nil && v.Deleting:
		return "deleting"
	case v.Verdict == nil:
		return "-"
	case v.Deleting:
		return v.Verdict.String() + ",deleting"
	default:
		return v.Verdict.String()
	}
}

func newGetSlotsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "slots SERVICE",
		Aliases: []string{"slot"},
		Short:   "List the replica slots of a service",
		Long: `slots lists the service's replica slots in replica order (docs/reconciliation.md
section 3): for each, its node and workload, the disposition committed
for its attempt (run, stop or remove), the stop and remove receipts its node
returned (out of 2), the phase and readiness the node last reported, whether it
runs the service's current desired attempt, whether its node has been delivered
the disposition yet, and how long ago it was observed. -o json prints the API's
slot objects, with the attempt id and the node's message of a failed run.`,
		Example: `  berth get slots hello
  berth get slots hello --project shop -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ServiceSlots(cmd.Context(), s.Project, args[0])
			if err != nil {
				return fmt.Errorf("list slots of %s/%s: %w", s.Project, args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "REPLICA", "NODE", "WORKLOAD", "DISPOSITION", "RECEIPTS", "PHASE", "READY", "CURRENT", "DELIVERY", "AGE", "LAST FAILURE")
			for _, v := range items {
				observed := "-"
				if v.Observation.ObservedAt != nil {
					observed = a.since(*v.Observation.ObservedAt)
				}
				row(tw, v.Replica, orDash(v.NodeID), orDash(v.WorkloadID), orDash(v.Disposition),
					fmt.Sprintf("%d/2", v.TerminalReceipts), orDash(v.Observation.Phase), yesNo(v.Observation.Ready),
					yesNo(v.Current), orDash(v.Delivery), observed, a.failureCell(v.LastFailure, v.Observation.Message))
			}
			return tw.Flush()
		},
	}
}

// yesNo formats a boolean for a table cell.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newGetNodesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "nodes",
		Aliases: []string{"node", "no"},
		Short:   "List the enrolled nodes",
		Long: `nodes lists every enrolled node: status (draining, drained, cordoned and
a drain past its deadline are said there), region, address, number of
workloads, the CPU and memory it offers to placement (what its agent reports,
with the operator's override from berth node set-capacity), the
desired-state revision it applied against the one it should run, and when it
was last seen. berth describe node ID shows the rest.`,
		Example: `  berth get nodes
  berth get nodes -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ListNodes(cmd.Context())
			if err != nil {
				return fmt.Errorf("list nodes: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			tw := newTable(a.stdout)
			row(tw, "ID", "HOSTNAME", "STATUS", "REGION", "ADDRESS", "WORKLOADS", "CPU", "MEMORY", "APPLIED/DESIRED", "LAST-SEEN")
			for _, n := range items {
				seen := "never"
				if n.LastSeenAt != nil {
					seen = a.since(*n.LastSeenAt) + " ago"
				}
				row(tw, n.ID, n.Hostname, nodeStatusText(n), orDash(n.Region), orDash(n.Address), n.Workloads,
					cpuText(n.Schedulable.CPUMilli), memText(n.Schedulable.MemoryMiB), fmt.Sprintf("%d/%d", n.AppliedRev, n.DesiredRev), seen)
			}
			return tw.Flush()
		},
	}
}

func newGetWorkloadsCmd(a *app) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:     "workloads",
		Aliases: []string{"workload", "wl"},
		Short:   "List the workloads of a project, or of all projects",
		Long: `workloads lists the running instances of the project's services: one per
slot, with the node it is placed on, its desired and observed status, health,
address and restart count.`,
		Example: `  berth get workloads
  berth get workloads --all-projects -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project := s.Project
			if all {
				project = ""
			}
			items, err := c.ListWorkloads(cmd.Context(), project)
			if err != nil {
				return fmt.Errorf("list workloads: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			return a.workloadTable(items, all)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-projects", "A", false, "list the workloads of every project")
	return cmd
}

// workloadTable prints workloads; withProject prefixes the service with its project.
func (a *app) workloadTable(items []client.Workload, withProject bool) error {
	tw := newTable(a.stdout)
	row(tw, "ID", "SERVICE", "SLOT", "NODE", "DESIRED", "OBSERVED", "HEALTH", "ADDRESS", "RESTARTS", "LAST FAILURE")
	for _, w := range items {
		svc := w.Service
		if withProject {
			svc = w.Project + "/" + w.Service
		}
		row(tw, w.ID, svc, w.Slot, orDash(w.NodeID), orDash(w.DesiredStatus), orDash(w.ObservedStatus),
			orDash(w.Health), orDash(w.Address), w.RestartCount, a.failureCell(w.LastFailure, w.Message))
	}
	return tw.Flush()
}

// failureCell is a workload's last failure in one cell: "exit 2 (x3, 12s ago)", with the
// message of a start or image failure cut to its end; message (the node's last error) when no
// failure is known, "-" when neither is.
func (a *app) failureCell(f *client.Failure, message string) string {
	if f == nil {
		return orDash(tail(message, 60))
	}
	return a.failureLine(f, 60)
}

// failureLine is f in one line, its words cut to their last n characters, the failure's kind
// kept in front of a cut message: "probe /status/404 -> 404 (x2, 5s ago)", "oom: …its memory
// limit (3s ago)".
func (a *app) failureLine(f *client.Failure, n int) string {
	what := f.String()
	if msg, ok := strings.CutPrefix(what, f.Kind+": "); ok && f.Kind != "" && len([]rune(what)) > n {
		what = f.Kind + ": " + tail(msg, max(n-len(f.Kind)-2, 8))
	} else {
		what = tail(what, n)
	}
	if f.Count > 1 {
		return fmt.Sprintf("%s (x%d, %s ago)", what, f.Count, a.since(f.At))
	}
	return fmt.Sprintf("%s (%s ago)", what, a.since(f.At))
}

// tail shortens s to its last n characters: the end of a wrapped error is its cause.
func tail(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

func newGetLeasesCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "leases",
		Aliases: []string{"lease"},
		Short:   "List the leases of stateful services",
		Long: `leases lists the lease of every stateful service (docs/api.md "Leases"): the
node holding it, its fencing token, its mode, and when it may move to another
node (GATE: "never" for a local lease while held, "blocked" while a failed
fence awaits 'berth node fence-ack', "deleted" for the lease of a deleted
service, kept so that its last token stays on record). SERVICE is the
service as project/name (its id when no project the token sees has it);
resource_id in -o json is the service id, granted_at the last grant or renewal.`,
		Example: `  berth get leases
  berth get leases -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			items, err := c.ListLeases(cmd.Context())
			if err != nil {
				return fmt.Errorf("list leases: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			names := serviceNames(cmd.Context(), c)
			tw := newTable(a.stdout)
			row(tw, "LEASE", "SERVICE", "HOLDER", "TOKEN", "MODE", "GATE")
			for _, l := range items {
				gate := "never"
				switch {
				case l.Deleted:
					gate = "deleted"
				case len(l.FenceFailed) > 0:
					gate = "blocked (failed fence on " + strings.Join(l.FenceFailed, ",") + ")"
				case l.GateAt != nil && l.GateAt.IsZero():
					gate = "open"
				case l.GateAt != nil:
					gate = l.GateAt.Format(time.RFC3339)
				}
				mode := l.Mode
				if l.DurationMS > 0 {
					mode += fmt.Sprintf(" %dms", l.DurationMS)
				}
				service := l.ResourceID
				if n, ok := names[l.ResourceID]; ok {
					service = n
				}
				row(tw, l.LeaseID, service, orDash(l.Holder), l.FencingToken, mode, gate)
			}
			return tw.Flush()
		},
	}
}

// serviceNames maps the id of every service in the projects the token sees to project/name.
// Names only make a table readable, so a listing the token may not read leaves ids in place.
func serviceNames(ctx context.Context, c *client.Client) map[string]string {
	out := map[string]string{}
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return out
	}
	for _, p := range projects {
		svcs, err := c.ListServices(ctx, p.Name)
		if err != nil {
			continue
		}
		for _, s := range svcs {
			out[s.ID] = p.Name + "/" + s.Name
		}
	}
	return out
}
