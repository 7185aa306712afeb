package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newReleaseCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release reserve|list SERVICE",
		RunE:  groupRunE,
		Short: "Reserve and list image release tags of a service",
		Long: `release works on the tags of a service's repository in Berth's registry
(<project>/<service>, docs/registry.md section 7). A reserved tag can be pushed
only by the principal that reserved it, and only once.`,
		Example: `  berth release reserve web v1.2.3
  berth release list web`,
	}
	reserve := &cobra.Command{
		Use:   "reserve SERVICE TAG",
		Short: "Reserve a release tag for the caller",
		Long: `reserve reserves TAG in the service's repository for the token running it
(a CI token, which then pushes the image to that tag). It is refused with
release_tag_reserved when the tag was already reserved or pushed, and
release_tag_invalid for latest or a name that is not a tag.`,
		Example: `  berth release reserve web v1.2.3`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			rel, err := c.ReserveRelease(cmd.Context(), s.Project, args[0], args[1])
			if err != nil {
				return fmt.Errorf("reserve %s/%s:%s: %w", s.Project, args[0], args[1], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, rel)
			}
			fmt.Fprintf(a.stdout, "%s:%s reserved\n", rel.Repository, rel.Tag)
			return nil
		},
	}
	list := &cobra.Command{
		Use:     "list SERVICE",
		Short:   "List the release tags of a service's repository",
		Example: `  berth release list web`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			rels, err := c.ListImageReleases(cmd.Context(), s.Project, args[0])
			if err != nil {
				return fmt.Errorf("list releases of %s/%s: %w", s.Project, args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, rels)
			}
			fmt.Fprintln(a.stdout, "TAG\tDIGEST\tRESERVED")
			for _, r := range rels {
				fmt.Fprintf(a.stdout, "%s\t%s\t%s\n", r.Tag, orDash(r.Digest), orDash(r.ReservedBy))
			}
			return nil
		},
	}
	cmd.AddCommand(reserve, list)
	return cmd
}
