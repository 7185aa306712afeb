package services

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// PublishBinding adds the secret references of ready binding b to its service, with one
// compare-and-set carrying its change-log entry (retried on a concurrent write as
// [store.RetryOnConflict] says), so the next rollout delivers the credentials; hint, when not
// nil, is called with the service's id when the write changed it. A service that is gone, being
// deleted or no longer declares b is left alone. It is the binding manager's OnReady
// (docs/bindings.md); it lives here because core/services imports core/bindings.
func (c *Catalog) PublishBinding(ctx context.Context, b *bindings.Binding, hint func(reason, serviceID string)) error {
	p, err := c.GetProject(ctx, b.Project)
	if err != nil {
		return err
	}
	ctx = changelog.WithActor(ctx, changelog.Actor{Type: "system", ID: "corestore"})
	err = store.RetryOnConflict(ctx, func() error {
		cur, err := c.GetService(ctx, p, b.Service)
		if errors.Is(err, ErrServiceNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		declared := false
		for _, s := range cur.Bindings {
			declared = declared || s.Name == b.Name
		}
		if !declared || cur.Deleting {
			return nil
		}
		next := *cur
		next.Secrets, next.ResolvedSecrets = maps.Clone(cur.Secrets), maps.Clone(cur.ResolvedSecrets)
		if next.Secrets == nil {
			next.Secrets = map[string]secrets.Ref{}
		}
		if next.ResolvedSecrets == nil {
			next.ResolvedSecrets = map[string]secrets.Ref{}
		}
		maps.Copy(next.Secrets, b.Secrets)
		maps.Copy(next.ResolvedSecrets, b.Secrets)
		rev := cur.Revision
		out, outcome, err := c.ApplyService(ctx, p, &next, &rev)
		if err != nil {
			return err
		}
		if outcome != PutUnchanged && hint != nil {
			hint("binding.ready", out.ID)
		}
		return nil
	}, ErrRevisionConflict)
	if err != nil {
		return fmt.Errorf("publish binding %s: %w", b.ID, err)
	}
	return nil
}
