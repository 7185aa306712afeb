package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newReleaseCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release reserve|promote|list SERVICE",
		RunE:  groupRunE,
		Short: "Reserve, promote and list image release tags of a service",
		Long: `release works on the tags of a service's repository in Berth's registry
(<project>/<service>, docs/registry.md section 7). A reserved tag can be pushed
only by the principal that reserved it, and only once.`,
		Example: `  berth release reserve web v1.2.3
  berth release promote web v1.2.3 --wait
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
		Use:   "list SERVICE",
		Short: "List the release tags of a service's repository",
		Long: `list prints each tag of the service's repository, newest first: the digest it
names, who reserved it, and FOLLOW, where deploy on push stands for the digest:
pending (pushed, the services that follow the tag not rolled yet), followed,
refused(policy) (an admission policy refused the change; -o json has the
reason), failed(<error>) (after its retries), or - when no service follows
the tag. The push itself succeeded in every case.`,
		Example: `  berth release list web
  berth release list web -o json`,
		Args: cobra.ExactArgs(1),
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
			return printReleases(a.stdout, rels)
		},
	}
	cmd.AddCommand(reserve, newReleasePromoteCmd(a), list)
	return cmd
}

func newReleasePromoteCmd(a *app) *cobra.Command {
	var (
		wait     bool
		interval time.Duration
		timeout  time.Duration
		expected int64
		idemKey  string
	)
	cmd := &cobra.Command{
		Use:   "promote [PROJECT/]SERVICE TAG",
		Short: "Roll a service to the digest a release tag names",
		Long: `promote pins the service's image to the digest TAG names in its repository
(<project>/<service>) and lets the ordinary rollout replace the replicas
(docs/registry.md section 8). It prints the service's new revision; a service
that already runs that digest is left as it is.

With --wait it then follows the rollout as 'berth rollout status' does, every
--interval for at most --timeout, and exits 1 if the rollout is refused, times
out, or ends with the service running another release (an automatic rollback
after the new release failed). A failed promotion leaves the previous release
serving.

Refusals: image_release_not_found (the tag was never reserved or pushed),
release_not_pushed (reserved, not pushed yet), service_not_container,
revision_conflict (with --expected-revision, when the service moved on).
A CI job that may retry passes --idempotency-key, so that a repeat answers
what the first promotion answered.`,
		Example: `  berth release promote web v1.2.3
  berth release promote shop/web v1.2.3 --wait --timeout 5m`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wait && (interval <= 0 || timeout <= 0) {
				return fmt.Errorf("--interval and --timeout must be positive")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := s.Project, args[0]
			if p, n, ok := strings.Cut(args[0], "/"); ok {
				project, name = p, n
			}
			if idemKey != "" {
				c = c.WithIdempotencyKey(idemKey)
			}
			var req client.PromoteRequest
			if cmd.Flags().Changed("expected-revision") {
				req.ExpectedRevision = &expected
			}
			svc, err := c.PromoteRelease(cmd.Context(), project, name, args[1], req)
			if err != nil {
				return fmt.Errorf("promote %s/%s:%s: %w", project, name, args[1], err)
			}
			if !wait {
				if a.output == outputJSON {
					return printJSON(a.stdout, svc)
				}
				fmt.Fprintf(a.stdout, "%s/%s at revision %d runs %s\n", project, name, svc.Revision, svc.Image)
				return nil
			}
			fmt.Fprintf(a.stderr, "%s/%s at revision %d runs %s\n", project, name, svc.Revision, svc.Image)
			if err := a.watchRollout(cmd.Context(), c, project, name, interval, timeout); err != nil {
				return err
			}
			now, err := c.GetService(cmd.Context(), project, name)
			if err != nil {
				return fmt.Errorf("read %s/%s after its rollout: %w", project, name, err)
			}
			if now.Image != svc.Image {
				return fmt.Errorf("promotion of %s did not hold: %s/%s runs %s (revision %d)", args[1], project, name, now.Image, now.Revision)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&wait, "wait", false, "follow the rollout until it converges, is refused or times out")
	f.DurationVar(&interval, "interval", time.Second, "with --wait, time between two reads of the rollout")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "with --wait, give up after this long")
	f.Int64Var(&expected, "expected-revision", 0, "promote only while the service is at this revision")
	f.StringVar(&idemKey, "idempotency-key", "", "repeat-safe key: a retry with the same key answers what the first promotion did")
	return cmd
}

// printReleases writes a service's image releases as an aligned table; FOLLOW is where deploy
// on push stands for the tag ("-": no service follows it).
func printReleases(w io.Writer, rels []client.ImageRelease) error {
	tw := newTable(w)
	row(tw, "TAG", "DIGEST", "RESERVED", "FOLLOW")
	for _, r := range rels {
		row(tw, r.Tag, orDash(r.Digest), orDash(r.ReservedBy), orDash(r.Follow.Summary()))
	}
	return tw.Flush()
}
