package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/securefile"
)

// bindingWorkInterval is how often berthd's binding worker looks for due binding operations.
const bindingWorkInterval = time.Second

// corestoreStateDir is the corestore plugin's state directory under DataDir/plugins.
const corestoreStateDir = "corestore"

// startBindings launches the corestore plugin with the configuration file cfg.CorestoreConfig
// (JSON, 0600: it holds the servers' admin credentials, docs/bindings.md section 5) and returns
// the binding manager, whose worker the caller runs, and the plugin handle the caller closes.
// With no configuration file it returns nil: services with bindings are then refused.
func startBindings(ctx context.Context, cfg Config, ps *providers, st *store.Store, sec *secrets.Store, cat *services.Catalog, deployer func() *deploy.Deployer, exec bindings.ExecutorAccess,
	log *slog.Logger) (*bindings.Manager, *plugin.Provider, error) {
	if cfg.CorestoreConfig == "" {
		return nil, nil, nil
	}
	conf, err := securefile.ReadFile(cfg.CorestoreConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("corestore configuration: %w", err)
	}
	if conf, err = bindings.ResolveConfigSecrets(ctx, conf, sec, projectID(cat)); err != nil {
		return nil, nil, fmt.Errorf("corestore configuration %s: %w", cfg.CorestoreConfig, err)
	}
	if conf, err = exec.Configure(ctx, conf); err != nil {
		return nil, nil, fmt.Errorf("corestore executor: %w", err)
	}
	entry, err := plugin.ResolveProvider(cfg.PluginDir, "corestore")
	if err != nil {
		return nil, nil, fmt.Errorf("corestore plugin: %w", err)
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	pc := entry.Apply(plugin.Config{
		Args:   []string{"--state-dir", filepath.Join(pdir, corestoreStateDir)},
		PidDir: pdir,
		Logger: log,
	})
	pc.PluginConfig = conf // the file, not the catalog entry: it holds the admin credentials
	h, err := ps.launch(ctx, "corestore", pc)
	if err != nil {
		return nil, nil, fmt.Errorf("start corestore plugin: %w", err)
	}
	m := bindings.New(bindings.Config{
		Store: st, Queue: operations.NewQueue(st, operations.Config{}), Secrets: sec, Provider: h, Logger: log,
		OnReady: func(ctx context.Context, b *bindings.Binding) error {
			// The write carries its reconcile request: nothing to wake.
			_, err := deployer().PublishReady(ctx, b)
			return err
		},
	})
	return m, h, nil
}

// projectID names a project's id by its name, from cat.
func projectID(cat *services.Catalog) func(ctx context.Context, name string) (string, error) {
	return func(ctx context.Context, name string) (string, error) {
		p, err := cat.GetProject(ctx, name)
		if err != nil {
			return "", err
		}
		return p.ID, nil
	}
}
