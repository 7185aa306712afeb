package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// splitService reads "project/service" or "service" (the current project).
func splitService(arg, project string) (string, string) {
	if p, s, ok := strings.Cut(arg, "/"); ok {
		return p, s
	}
	return project, arg
}

func newBackupCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup create|ls|restore|drill",
		RunE:  groupRunE,
		Short: "Back up a service's bindings, list the backups and restore one",
		Long: `backup works on the backups of a service's bindings (its PostgreSQL and MongoDB
databases and S3 buckets, docs/backups.md): each backup is an operation, and
exists once its record says succeeded; restore drills prove backups restore.`,
		Example: `  berth backup create shop/web --binding db
  berth backup ls shop/web
  berth backup restore bkp_01J... --into shop/web`,
	}
	var binding, createKey string
	create := &cobra.Command{
		Use:     "create SERVICE",
		Short:   "Request a backup of one binding (or every binding) of a service",
		Example: `  berth backup create shop/web --binding db`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, service := splitService(args[0], s.Project)
			if createKey != "" {
				c = c.WithIdempotencyKey(createKey)
			}
			list, err := c.CreateBackup(cmd.Context(), project, service, binding)
			if err != nil {
				return fmt.Errorf("back up %s/%s: %w", project, service, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, list)
			}
			for _, b := range list {
				fmt.Fprintf(a.stdout, "%s\t%s/%s\t%s\toperation %s\n", b.ID, service, b.Binding, b.State, b.OperationID)
			}
			return nil
		},
	}
	create.Flags().StringVar(&binding, "binding", "", "the binding to back up (default: every binding of the service)")
	create.Flags().StringVar(&createKey, "idempotency-key", "", "repeat-safe key: a retry with the same key answers the same backups")
	ls := &cobra.Command{
		Use:     "ls [SERVICE]",
		Aliases: []string{"list"},
		Short:   "List backups with state, size, digest, time and last drill",
		Example: `  berth backup ls shop/web`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, service := s.Project, ""
			if len(args) == 1 {
				project, service = splitService(args[0], s.Project)
			}
			list, err := c.ListBackups(cmd.Context(), project, service)
			if err != nil {
				return fmt.Errorf("list backups of %s: %w", project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, list)
			}
			return printBackups(a.stdout, list)
		},
	}
	var into, restoreKey string
	var scratch, whileRunning bool
	restore := &cobra.Command{
		Use:   "restore BACKUP",
		Short: "Restore a backup into a service's binding, or into a scratch resource beside it",
		Long: `restore checks every precondition before anything changes: the backup
succeeded, the target service exists and declares the binding, it is stopped
(or --while-running, or --into-scratch), and the archive still hashes to its
record (backup_corrupt otherwise). It then enqueues the restore operation.`,
		Example: `  berth backup restore bkp_01J... --into shop/web
  berth backup restore bkp_01J... --into-scratch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, service := s.Project, ""
			if into != "" {
				project, service = splitService(into, s.Project)
			}
			if restoreKey != "" {
				c = c.WithIdempotencyKey(restoreKey)
			}
			op, err := c.RestoreBackup(cmd.Context(), project, args[0], client.RestoreRequest{Into: service, IntoScratch: scratch, WhileRunning: whileRunning})
			if client.IsCode(err, "restore_target_running") {
				return fmt.Errorf("restore %s: %w; stop the service first, or pass --while-running (or --into-scratch)", args[0], err)
			} else if err != nil {
				return fmt.Errorf("restore %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, op)
			}
			fmt.Fprintf(a.stdout, "restore of %s queued: operation %s\n", args[0], op.OperationID)
			return nil
		},
	}
	restore.Flags().StringVar(&into, "into", "", "the target service, PROJECT/SERVICE or SERVICE (default: the backup's own)")
	restore.Flags().BoolVar(&scratch, "into-scratch", false, "restore into a new scratch database or bucket beside the live one")
	restore.Flags().StringVar(&restoreKey, "idempotency-key", "", "repeat-safe key: a retry with the same key answers the same restore")
	restore.Flags().BoolVar(&whileRunning, "while-running", false, "allow a restore into a service that is running")
	var drillKey string
	drill := &cobra.Command{
		Use:   "drill BACKUP",
		Short: "Prove a backup now: restore it into a scratch resource, compare, drop the scratch",
		Long: `drill queues a restore drill of one backup: the executor restores it into a
new scratch database or bucket, measures what came back against the figures
recorded at backup time, and drops the scratch resource. The result
(passed or failed, with the first differing table) shows in berth backup ls.`,
		Example: `  berth backup drill bkp_01J... --project shop`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project := s.Project
			if drillKey != "" {
				c = c.WithIdempotencyKey(drillKey)
			}
			op, err := c.DrillBackup(cmd.Context(), project, args[0])
			if err != nil {
				return fmt.Errorf("drill %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, op)
			}
			fmt.Fprintf(a.stdout, "drill of %s queued: operation %s\n", args[0], op.OperationID)
			return nil
		},
	}
	drill.Flags().StringVar(&drillKey, "idempotency-key", "", "repeat-safe key: a retry with the same key answers the same drill")
	cmd.AddCommand(create, ls, restore, drill)
	return cmd
}

func backupState(b client.Backup) string {
	if b.State == "failed" && b.FailedStep != "" {
		return "failed(" + b.FailedStep + ")"
	}
	return b.State
}

func drillText(d *client.BackupDrill) string {
	if d == nil {
		return "-"
	}
	s := d.Result + " " + d.At.UTC().Format(time.RFC3339)
	if d.Table != "" {
		s += " (" + d.Table + ")"
	}
	return s
}

// printBackups writes backups as an aligned table.
func printBackups(w io.Writer, list []client.Backup) error {
	tw := newTable(w)
	row(tw, "ID", "SERVICE", "BINDING", "KIND", "STATE", "SIZE", "DIGEST", "WHEN", "DRILL")
	for _, b := range list {
		row(tw, b.ID, b.Service, b.Binding, b.Kind, backupState(b), b.Size, orDash(shortDigest(b.Digest)),
			b.CreatedAt.UTC().Format(time.RFC3339), drillText(b.Drill))
	}
	return tw.Flush()
}
