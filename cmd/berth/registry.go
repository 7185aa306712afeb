package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newRegistryCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry gc [--dry-run]",
		RunE:  groupRunE,
		Short: "Work on Berth's image registry",
	}
	var dryRun bool
	gc := &cobra.Command{
		Use:   "gc [--dry-run]",
		Short: "Run the registry's retention pass now",
		Long: `gc runs one retention pass of the registry (docs/registry.md section 10):
tags of old releases nothing uses, then manifests nothing keeps, then blobs
no kept manifest references, each only once unused past its grace period.
With --dry-run it deletes nothing and prints what the pass would delete.
Needs the admin scope.`,
		Example: `  berth registry gc --dry-run
  berth registry gc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			rep, err := c.RegistryGC(cmd.Context(), dryRun)
			if err != nil {
				return fmt.Errorf("registry gc: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, rep)
			}
			return printRegistryGC(a.stdout, rep)
		},
	}
	gc.Flags().BoolVar(&dryRun, "dry-run", false, "print what the pass would delete, delete nothing")
	cmd.AddCommand(gc)
	return cmd
}

// printRegistryGC writes a collection pass's deletions as an aligned table, then its summary.
func printRegistryGC(w io.Writer, rep *client.RegistryGCReport) error {
	verb := "deleted"
	if rep.DryRun {
		verb = "would delete"
	}
	var bytes int64
	tw := newTable(w)
	row(tw, "KIND", "REPOSITORY", "TAG", "DIGEST", "SIZE")
	for _, it := range rep.Deletions {
		bytes += it.Size
		size := "-"
		if it.Kind == "blob" {
			size = fmt.Sprint(it.Size)
		}
		row(tw, it.Kind, orDash(it.Repository), orDash(it.Tag), it.Digest, size)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s %d objects (%d blob bytes); kept %d manifests and %d blobs\n", verb, len(rep.Deletions), bytes, rep.KeptManifests, rep.KeptBlobs)
	if rep.BlobsSkipped != "" {
		fmt.Fprintf(w, "blobs not judged: %s\n", rep.BlobsSkipped)
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "skipped repository %s\n", s)
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "failed: %s\n", f)
	}
	if rep.Remaining {
		fmt.Fprintln(w, "work remains for the next pass")
	}
	return nil
}
