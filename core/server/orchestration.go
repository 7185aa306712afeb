package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
)

// DefaultOrchestrationInterval is the period of the placement pass and the operation sweep when
// [Config.OrchestrationInterval] is zero.
const DefaultOrchestrationInterval = placement.DefaultPassInterval

// orchestration is the wiring of docs/runner-protocol.md: project leases, runner nodes, placements
// and the operation queue; [placement.Service.Run] is its loop.
type orchestration struct {
	api      *api.Orchestration
	interval time.Duration
	log      *slog.Logger
}

// newOrchestration creates the services and their indexes. Each berthd process is one lease owner.
func newOrchestration(ctx context.Context, st *store.Store, blobs *bundles.Store, transport bool, interval time.Duration, log *slog.Logger) (*orchestration, error) {
	reg := runners.NewRegistry(st, runners.Config{})
	ops := operations.NewQueue(st, operations.Config{})
	if err := ops.EnsureIndexes(ctx); err != nil {
		return nil, fmt.Errorf("orchestration: %w", err)
	}
	place := placement.NewService(st, reg, ops)
	// Stores written by the earlier single-collection layout are moved once (idempotent).
	for what, migrate := range map[string]func() (int, error){
		"runner nodes": func() (int, error) { return reg.MigrateLegacy(ctx, st) },
		"placements":   func() (int, error) { return place.MigrateLegacy(ctx, st) },
		"operations":   func() (int, error) { return ops.MigrateLegacy(ctx) },
	} {
		n, err := migrate()
		if err != nil {
			return nil, fmt.Errorf("orchestration: migrate %s: %w", what, err)
		}
		if n > 0 {
			log.Info("orchestration state moved to the bucketed layout", "what", what, "count", n)
		}
	}
	owner := identity.NewID("brd_")
	return &orchestration{
		api: &api.Orchestration{
			Leases:     leases.NewManager(st, leases.Config{Owner: owner, Logger: log}),
			Runners:    reg,
			Operations: ops,
			Placement:  place,
			Transport:  transport,
			Artifacts:  api.BundleArtifacts{Bundles: blobs},
		},
		interval: interval,
		log:      log.With("component", "orchestration", "worker", owner),
	}, nil
}

// run is the placement pass and operation sweep (placement.Service.Run) until ctx ends.
func (o *orchestration) run(ctx context.Context) {
	o.api.Placement.Run(ctx, o.interval, o.log)
}

// legacy turns on the legacy shared registration secret when secret is not empty, and says so in
// the log on every start.
func (o *orchestration) legacy(secret string) error {
	if secret == "" {
		return nil
	}
	ls, err := runners.NewLegacySecret(secret)
	if err != nil {
		return fmt.Errorf("orchestration: %s: %w", "BERTH_RUNNER_REGISTRATION_TOKEN", err)
	}
	o.api.LegacyRegistration = ls
	o.log.Warn("legacy shared runner registration secret is on: it can rotate any named node; prefer one-time enrollment tokens")
	return nil
}
