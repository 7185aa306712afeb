package services

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/store"
)

// RouteClaim is the durable claim on one hostname (docs/routes.md section 2):
// the service, by project id and name, whose routes the hostname is served
// for when several services declare it. One document per hostname (_id), so
// taking a free hostname is one insert and taking over a lapsed claim one
// compare-and-set on its revision.
type RouteClaim struct {
	Hostname  string    `bson:"_id" json:"hostname"`
	ProjectID string    `bson:"project_id" json:"project_id"`
	Project   string    `bson:"project" json:"project"`
	Service   string    `bson:"service" json:"service"`
	Revision  int64     `bson:"revision" json:"revision"`
	ClaimedAt time.Time `bson:"claimed_at" json:"claimed_at"`
}

// claimGrace is how long a claim whose service does not (yet) declare the
// hostname still counts as held: the claim is written before the service, so
// an apply in flight keeps the hostname it is taking.
const claimGrace = time.Minute

// ListRouteClaims returns every route claim by hostname, from the read view.
// Claims whose service is gone or no longer declares the hostname are listed
// too: a reader treats them as no claim.
func (c *Catalog) ListRouteClaims(ctx context.Context) ([]RouteClaim, error) {
	out := []RouteClaim{}
	if err := c.st.View().Find(ctx, c.st.Collection("route_claims"), nil, &out); err != nil {
		return nil, fmt.Errorf("list route claims: %w", err)
	}
	return out, nil
}

// claimDomains takes the claim on every domain of s for s (project p), before
// s is written, and fails with ErrDomainTaken naming the holder when another
// service holds one. A claim is held while its service exists, is not being
// deleted and declares the hostname, or for claimGrace after it was taken;
// otherwise it has lapsed and is taken over. Idempotent: a claim s already
// holds is left as it is. Each hostname is one insert or one compare-and-set.
func (c *Catalog) claimDomains(ctx context.Context, p *Project, s *Service) error {
	coll := c.st.Collection("route_claims")
	for _, d := range s.Domains {
		err := store.RetryOnConflict(ctx, func() error { return c.claimDomain(ctx, coll, p, s, d) })
		if errors.Is(err, store.ErrRetriesExhausted) {
			return fmt.Errorf("%w: the claim on domain %s kept changing while it was taken; apply again: %w", ErrRevisionConflict, d, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// claimDomain is one attempt of claimDomains at hostname d: an error wrapping store.ErrConflict
// means the claim moved meanwhile and the attempt is to be made again.
func (c *Catalog) claimDomain(ctx context.Context, coll *mongo.Collection, p *Project, s *Service, d string) error {
	var cur RouteClaim
	err := c.st.View().Get(ctx, coll, d, &cur)
	switch {
	case errors.Is(err, store.ErrNotFound):
		doc := RouteClaim{Hostname: d, ProjectID: p.ID, Project: p.Name, Service: s.Name, Revision: 1, ClaimedAt: c.now().UTC()}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			if store.IsDuplicateKey(err) {
				return fmt.Errorf("claim domain %s: taken meanwhile: %w", d, store.ErrConflict) // judge the winner
			}
			return fmt.Errorf("claim domain %s: %w", d, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("claim domain %s: %w", d, err)
	}
	if cur.ProjectID == p.ID && cur.Service == s.Name {
		return nil
	}
	held, err := c.claimHeld(ctx, &cur)
	if err != nil {
		return err
	}
	if held {
		return fmt.Errorf("%w: domain %s is claimed by %s/%s", ErrDomainTaken, d, cur.Project, cur.Service)
	}
	_, err = c.st.UpdateIfRevision(ctx, coll, d, cur.Revision, bson.M{"$set": bson.M{
		"project_id": p.ID, "project": p.Name, "service": s.Name, "claimed_at": c.now().UTC()}})
	switch {
	case err == nil, errors.Is(err, store.ErrConflict):
		return err // a conflict: moved meanwhile, read it again
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("claim domain %s: released meanwhile: %w", d, store.ErrConflict)
	default:
		return fmt.Errorf("claim domain %s: %w", d, err)
	}
}

// claimHeld reports whether cl is still held (see claimDomains).
func (c *Catalog) claimHeld(ctx context.Context, cl *RouteClaim) (bool, error) {
	if c.now().Sub(cl.ClaimedAt) < claimGrace {
		return true, nil
	}
	owner, err := c.GetService(ctx, &Project{ID: cl.ProjectID, Name: cl.Project}, cl.Service)
	if errors.Is(err, ErrServiceNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the holder of the claim on %s: %w", cl.Hostname, err)
	}
	return !owner.Deleting && slices.Contains(owner.Domains, cl.Hostname), nil
}

// releaseClaims removes the claims the service name of project id holds,
// once the service is gone; a claim another service took over meanwhile is
// kept. Idempotent.
func (c *Catalog) releaseClaims(ctx context.Context, projectID, name string) error {
	if _, err := c.st.Collection("route_claims").DeleteMany(ctx, bson.M{"project_id": projectID, "service": name}); err != nil {
		return fmt.Errorf("release the route claims of %s: %w", name, err)
	}
	return nil
}
