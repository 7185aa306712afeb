package services

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ErrNotContainer is returned by [Catalog.SetImage] for a service whose runtime is not
// "containerd": it runs no image.
var ErrNotContainer = errors.New("berth: service runs no container image")

// SetImage rolls the named service to image (a reference pinned by digest,
// "<host>/<repo>@sha256:<hex>"), everything else as it is: one compare-and-set on the
// service document at revision expected (nil: the revision read here), through
// [Catalog.ApplyService], so the ordinary rollout replaces the workloads one slot at a time
// and keeps the previous release serving when the new one fails. A service already at image
// is PutUnchanged. Errors: ErrServiceNotFound, ErrNotContainer, ErrServiceDeleting,
// ErrRevisionConflict (the caller re-reads and retries, or reports it).
func (c *Catalog) SetImage(ctx context.Context, p *Project, name, image string, expected *int64) (*Service, PutOutcome, error) {
	cur, err := c.GetService(ctx, p, name)
	if err != nil {
		return nil, 0, err
	}
	if cur.Runtime != "containerd" {
		return nil, 0, fmt.Errorf("%w: %s/%s has runtime %q", ErrNotContainer, p.Name, name, cur.Runtime)
	}
	if expected == nil {
		expected = &cur.Revision
	}
	next := *cur
	next.Image = image
	return c.ApplyService(ctx, p, &next, expected)
}

// FollowLimit is how many compare-and-sets [Catalog.FollowTag] tries per service before it
// gives up on a service that keeps changing under it.
const FollowLimit = 5

// FollowTag rolls every service with DeployOnPush that follows repoTag ("<project>/<repo>:<tag>")
// to image ("<host>/<project>/<repo>@sha256:<hex>", what the tag names now), each with one
// compare-and-set at the revision read, re-read and retried up to FollowLimit times when the
// service changed meanwhile. Services of other projects than the repository's never follow it.
// It returns the services it wrote; a service already at image, deleting, or no longer following
// the tag is skipped. Idempotent: a repeat writes nothing. Errors: the first store error, and
// ErrRevisionConflict (wrapped, naming the service) after FollowLimit lost compare-and-sets; the
// services written before it stay written.
func (c *Catalog) FollowTag(ctx context.Context, repoTag, image string) ([]*Service, error) {
	project, _, ok := strings.Cut(repoTag, "/")
	if !ok {
		return nil, nil
	}
	p, err := c.GetProject(ctx, project)
	if errors.Is(err, ErrProjectNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	followers, err := findAll[Service](ctx, c.st, c.services, bson.M{"project_id": p.ID, "image_tag": repoTag, "deploy_on_push": true}, nil)
	if err != nil {
		return nil, err
	}
	var out []*Service
	for _, f := range followers {
		s, err := c.follow(ctx, p, f.Name, repoTag, image)
		if err != nil {
			return out, err
		}
		if s != nil {
			out = append(out, s)
		}
	}
	return out, nil
}

// follow is FollowTag for one service: nil, nil when there is nothing to write.
func (c *Catalog) follow(ctx context.Context, p *Project, name, repoTag, image string) (*Service, error) {
	for range FollowLimit {
		cur, err := c.GetService(ctx, p, name)
		if errors.Is(err, ErrServiceNotFound) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		if !cur.DeployOnPush || cur.ImageTag != repoTag || cur.Deleting || cur.Image == image {
			return nil, nil
		}
		out, outcome, err := c.SetImage(ctx, p, name, image, &cur.Revision)
		switch {
		case errors.Is(err, ErrRevisionConflict):
			continue
		case err != nil:
			return nil, err
		case outcome == PutUnchanged:
			return nil, nil
		}
		return out, nil
	}
	return nil, fmt.Errorf("follow %s with %s/%s: %w: it changed %d times in a row", repoTag, p.Name, name, ErrRevisionConflict, FollowLimit)
}
