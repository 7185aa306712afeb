package services

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ImagesInUse returns the image references ("[host/]<repo>@sha256:<hex>") that registry
// retention must keep besides releases (docs/registry.md section 10): the image of every
// service, the image of the release each service ran before its latest change (what
// `rollout undo` and an automatic rollback return to), and the image of every workload still
// recorded (replicas still on the previous release during a rollout, a workload being stopped).
// References may repeat. It reads the store's read view: a pass over the projects, services and
// workloads in memory. Errors: the store failed.
func (c *Catalog) ImagesInUse(ctx context.Context) ([]string, error) {
	var out []string
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, fmt.Errorf("images in use: %w", err)
	}
	for i := range projects {
		svcs, err := c.ListServices(ctx, &projects[i])
		if err != nil {
			return nil, fmt.Errorf("images in use: %w", err)
		}
		for _, s := range svcs {
			if s.Image != "" {
				out = append(out, s.Image)
			}
			if s.Previous != nil && s.Previous.Image != "" {
				out = append(out, s.Previous.Image)
			}
		}
	}
	wls, err := c.ListWorkloads(ctx, bson.M{})
	if err != nil {
		return nil, fmt.Errorf("images in use: %w", err)
	}
	for _, w := range wls {
		if w.Run != nil && w.Run.Image != "" {
			out = append(out, w.Run.Image)
		}
	}
	return out, nil
}
