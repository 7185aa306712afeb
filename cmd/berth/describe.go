package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newDescribeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe service NAME | job NAME | node ID",
		RunE:  groupRunE,
		Short: "Show one object in detail",
	}
	cmd.AddCommand(newDescribeNodeCmd(a))
	cmd.AddCommand(&cobra.Command{
		Use:     "service NAME",
		Aliases: []string{"svc", "job"},
		Short:   "Show a service and its workloads, or a job and its last runs",
		Long: `service shows everything stored about one service (bundle, command,
environment, port, domains, replicas, health check, revision) and the
workloads that run it. With -o json it prints {"service": ..., "workloads": [...]}.
For a job (describe job NAME) it also shows its newest 10 runs with how each
ended (state, exit code or signal, duration), for a service those of its
one-off commands (berth run), and -o json adds "runs": every run kept, oldest
first.`,
		Example: `  berth describe service hello
  berth describe service hello --project shop -o json
  berth describe job nightly`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			svc, err := c.GetService(cmd.Context(), s.Project, args[0])
			if err != nil {
				return fmt.Errorf("get service %s/%s: %w", s.Project, args[0], err)
			}
			all, err := c.ListWorkloads(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list workloads of %s: %w", s.Project, err)
			}
			wls := []client.Workload{}
			for _, w := range all {
				if w.Service == svc.Name {
					wls = append(wls, w)
				}
			}
			// A job's runs, or a service's one-off commands' (a server without jobs has none).
			runs, err := c.JobRuns(cmd.Context(), s.Project, svc.Name)
			if err != nil && !client.IsCode(err, "not_found") {
				return fmt.Errorf("runs of %s: %w", svc.Name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, struct {
					Service   *client.Service   `json:"service"`
					Workloads []client.Workload `json:"workloads"`
					Runs      []client.JobRun   `json:"runs,omitempty"`
				}{svc, wls, runs})
			}
			a.describeService(svc)
			if len(runs) > 0 {
				if err := a.describeRuns(runs); err != nil {
					return err
				}
			}
			if len(svc.Bindings) > 0 {
				bs, err := c.ListServiceBindings(cmd.Context(), s.Project, svc.Name)
				if err != nil {
					return fmt.Errorf("list bindings of %s: %w", svc.Name, err)
				}
				fmt.Fprintln(a.stdout)
				fmt.Fprintln(a.stdout, "Bindings:")
				tw := newTable(a.stdout)
				row(tw, "  NAME", "KIND", "STATE", "ENDPOINT", "USERS", "LAST-ERROR")
				for _, b := range bs {
					row(tw, "  "+b.Name, b.Kind, b.State, orDash(b.Endpoint), orDash(b.Users), orDash(oneLine(b.LastError)))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintln(a.stdout)
			if len(wls) == 0 {
				fmt.Fprintln(a.stdout, "Workloads: none")
				return nil
			}
			fmt.Fprintln(a.stdout, "Workloads:")
			if err := a.workloadTable(wls, false); err != nil {
				return err
			}
			for _, w := range wls {
				switch {
				case w.LastFailure != nil:
					fmt.Fprintf(a.stdout, "\nslot %d (%s) last failure: %s\n", w.Slot, w.ID, a.failureLine(w.LastFailure, 200))
				case w.Message != "":
					fmt.Fprintf(a.stdout, "\nslot %d (%s) last error: %s\n", w.Slot, w.ID, w.Message)
				}
			}
			return nil
		},
	})
	return cmd
}

// describeRuns prints the newest 10 of runs (a job's, or a service's one-off commands', given
// oldest first), newest first.
func (a *app) describeRuns(runs []client.JobRun) error {
	fmt.Fprintln(a.stdout)
	fmt.Fprintf(a.stdout, "Runs (newest %d of %d kept):\n", min(10, len(runs)), len(runs))
	tw := newTable(a.stdout)
	row(tw, "  RUN", "STATE", "EXIT", "DURATION", "ATTEMPTS", "NODE", "MESSAGE")
	for i := len(runs) - 1; i >= 0 && i >= len(runs)-10; i-- {
		r := runs[i]
		row(tw, "  "+r.Name(), r.State, exitOf(r), durationOf(r), strconv.Itoa(r.Attempts), orDash(r.NodeID), orDash(oneLine(r.Message)))
	}
	return tw.Flush()
}

// describeService prints the readable block of one service.
func (a *app) describeService(svc *client.Service) {
	tw := newTable(a.stdout)
	field := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	field("Name", svc.Name)
	field("Project", svc.Project)
	field("ID", svc.ID)
	field("Revision", svc.Revision)
	bundle := orDash(svc.BundleDigest)
	if svc.Bundle != "" && svc.Bundle != svc.BundleDigest {
		bundle = fmt.Sprintf("%s (%s)", svc.Bundle, bundle)
	}
	field("Bundle", bundle)
	container := svc.Runtime == "containerd"
	if container {
		field("Runtime", "containerd")
		field("Image", imageCell(svc.Container))
	}
	field("Command", orDash(strings.Join(svc.Command, " ")))
	// A job runs to completion: no port, domains, replicas, verdict or health check.
	job := svc.Kind == "job" && svc.Job != nil
	if job {
		a.describeJob(field, svc)
	}
	port := "-"
	switch {
	case svc.Port != 0 && container:
		port = strconv.Itoa(svc.Port)
	case svc.Port != 0:
		port = fmt.Sprintf("%d (process workloads get a free $PORT; see ADDRESS below)", svc.Port)
	}
	if !job {
		field("Port", port)
		field("Domains", orDash(strings.Join(svc.Domains, ", ")))
	}
	tlsMode := orDefault(svc.TLS.Mode, "none")
	if svc.TLS.Secret != "" {
		tlsMode += " (secret " + svc.TLS.Secret + ")"
	}
	if !job {
		field("TLS", tlsMode)
	}
	for i, c := range svc.Certificates {
		line := c.Hostname + ": " + certificateState(c)
		if c.LastError != "" {
			line += " (" + c.LastError + ")"
		}
		if i == 0 {
			field("Certificates", line)
		} else {
			fmt.Fprintf(tw, "\t%s\n", line)
		}
	}
	if !job {
		field("Replicas", fmt.Sprintf("%d desired, %d ready", svc.Replicas, svc.Ready))
		verdict := "-"
		if svc.Verdict != nil {
			verdict = svc.Verdict.String()
		}
		field("Verdict", verdict)
	}
	if len(svc.Volumes) > 0 {
		var vs []string
		for _, v := range svc.Volumes {
			if v.Path != "" {
				vs = append(vs, v.Name+" at "+v.Path)
			} else {
				vs = append(vs, v.Name)
			}
		}
		where := "on the node that runs each replica; a move to another node starts it empty"
		if svc.PlacementMode == "stateful" {
			where = "on the lease holder's node; moving the lease to another node does not move the data"
		}
		field("Volumes", strings.Join(vs, ", ")+" ("+where+")")
	}
	if hc := svc.HealthCheck; !job {
		field("Health check", fmt.Sprintf("GET %s every %s, timeout %s, unhealthy after %s failures",
			orDefault(hc.Path, "/"), secondsOr(hc.IntervalS, "10s"), secondsOr(hc.TimeoutS, "2s"), countOr(hc.Failures, "3")))
	}
	if len(svc.Env) == 0 {
		field("Env", "-")
	} else {
		keys := make([]string, 0, len(svc.Env))
		for k := range svc.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		field("Env", keys[0]+"="+svc.Env[keys[0]])
		for _, k := range keys[1:] {
			fmt.Fprintf(tw, "\t%s=%s\n", k, svc.Env[k])
		}
	}
	// Secrets: names and versions only; no answer carries a value.
	if len(svc.Secrets) == 0 {
		field("Secrets", "-")
	} else {
		keys := make([]string, 0, len(svc.Secrets))
		for k := range svc.Secrets {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			r := svc.Secrets[k]
			v := r.Secret + "@current"
			if got, ok := svc.ResolvedSecrets[k]; ok && r.Version == 0 {
				v = fmt.Sprintf("%s@current (%d)", r.Secret, got.Version)
			}
			if r.Version > 0 {
				v = fmt.Sprintf("%s@%d", r.Secret, r.Version)
			}
			if r.As == "file" {
				v += " (file)"
			}
			if i == 0 {
				field("Secrets", k+" <- "+v)
			} else {
				fmt.Fprintf(tw, "\t%s <- %s\n", k, v)
			}
		}
	}
	field("Secret sets", orDash(strings.Join(svc.SecretSets, ", ")))
	field("Created", fmt.Sprintf("%s (%s ago)", svc.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"), a.since(svc.CreatedAt)))
	field("Updated", fmt.Sprintf("%s (%s ago)", svc.UpdatedAt.UTC().Format("2006-01-02 15:04:05Z"), a.since(svc.UpdatedAt)))
	_ = tw.Flush()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func secondsOr(n int, def string) string {
	if n == 0 {
		return def
	}
	return fmt.Sprintf("%ds", n)
}

func countOr(n int, def string) string {
	if n == 0 {
		return def
	}
	return fmt.Sprint(n)
}

// describeJob prints what a job adds (docs/jobs.md section 7): its schedule and next fire time,
// concurrency policy, timeout, retries, starting deadline, the runs it keeps, and whether its
// schedule is held.
func (a *app) describeJob(field func(string, any), svc *client.Service) {
	j := svc.Job
	field("Kind", "job")
	sched := "(on demand: berth job run " + svc.Name + ")"
	if j.Schedule != "" {
		sched = j.Schedule + " (" + orDefault(j.TimeZone, "UTC") + ")"
	}
	field("Schedule", sched)
	next := "-"
	switch {
	case svc.Suspended:
		next = "- (suspended: berth job resume " + svc.Name + ")"
	case svc.NextFire != nil:
		next = svc.NextFire.Local().Format(time.DateTime+" MST") + " (in " + time.Until(*svc.NextFire).Round(time.Second).String() + ")"
	}
	field("Next fire", next)
	field("Concurrency", orDefault(j.Concurrency, "forbid"))
	timeout := "none"
	if j.TimeoutS > 0 {
		timeout = (time.Duration(j.TimeoutS) * time.Second).String() + " per attempt"
	}
	field("Timeout", timeout)
	field("Retries", j.Retries)
	field("Starting deadline", (time.Duration(j.StartingDeadlineS) * time.Second).String())
	field("Keep history", fmt.Sprintf("%d runs", j.KeepHistory))
}
