package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/machines"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/securefile"
)

// hetznerStateDir is the Hetzner plugin's state directory under DATA/plugins.
const hetznerStateDir = "hetzner"

// hetznerResourceType is the resource type of the Hetzner plugin's servers
// (plugins/hetzner.ResourceType; core never imports a plugin).
const hetznerResourceType = "hetzner.server"

// machineProviders launches the machine provider plugins: today the Hetzner
// plugin alone, from cfg.HetznerConfig (a JSON object, owner-only: the
// plugin's configuration, whose token_secret_ref is resolved here from
// core/secrets into the token the plugin receives; docs/machines.md
// section 5). It launches through ps, the one path of every provider plugin,
// so the types the plugin declares are registered like any other provider's.
// It returns no provider when none is configured.
func machineProviders(ctx context.Context, cfg Config, ps *providers, sec *secrets.Store, cat *services.Catalog, log *slog.Logger) (map[string]machines.ProviderEntry, []*plugin.Provider, error) {
	if cfg.HetznerConfig == "" {
		return nil, nil, nil
	}
	raw, err := securefile.ReadFile(cfg.HetznerConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("hetzner configuration: %w", err)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil, nil, fmt.Errorf("hetzner configuration %s: not a JSON object", cfg.HetznerConfig)
	}
	if _, ok := obj["token_secret_ref"]; ok {
		if raw, err = secrets.ResolveConfigRef(ctx, obj, "token_secret_ref", "token", sec, projectID(cat)); err != nil {
			return nil, nil, fmt.Errorf("hetzner configuration %s: %w", cfg.HetznerConfig, err)
		}
	}
	entry, err := plugin.ResolveProvider(cfg.PluginDir, "hetzner")
	if err != nil {
		return nil, nil, fmt.Errorf("hetzner plugin: %w", err)
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	pc := entry.Apply(plugin.Config{Args: []string{"--state-dir", filepath.Join(pdir, hetznerStateDir)}, PidDir: pdir, Logger: log})
	pc.PluginConfig = raw
	h, err := ps.launch(ctx, "hetzner", pc)
	if err != nil {
		return nil, nil, fmt.Errorf("start hetzner plugin: %w", err) // its answer never quotes the token
	}
	log.Info("hetzner plugin running", "pid", h.Status().PID)
	return map[string]machines.ProviderEntry{"hetzner": {Plugin: h, ResourceType: hetznerResourceType}}, []*plugin.Provider{h}, nil
}

// startMachines returns the machines part over the machine providers.
func startMachines(ctx context.Context, cfg Config, ps *providers, st *store.Store, ops *operations.Queue, reg *nodes.Registry, sec *secrets.Store, cat *services.Catalog, pin string, log *slog.Logger) (*machines.Machines, []*plugin.Provider, error) {
	provs, handles, err := machineProviders(ctx, cfg, ps, sec, cat, log)
	if err != nil {
		return nil, nil, err
	}
	m, err := machines.New(machines.Config{Store: st, Queue: ops, Joins: reg, Providers: provs, Logger: log, JoinTimeout: cfg.MachineJoinTimeout,
		UserData: func(code string) string { return CloudInit(api.JoinCommand(cfg.PublicURL, pin, code)) }})
	if err != nil {
		for _, h := range handles {
			_ = h.Close()
		}
		return nil, nil, err
	}
	return m, handles, nil
}

// CloudInit is the user data of a machine's server: a cloud-config whose one
// runcmd runs command (the join command of the server's join code) under sh.
func CloudInit(command string) string {
	return "#cloud-config\nruncmd:\n  - [sh, -c, '" + strings.ReplaceAll(command, "'", "''") + "']\n"
}
