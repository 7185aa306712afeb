package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/host/plugin"
)

// providers is the one path by which berthd runs provider plugins: the built-in roles (gateway,
// DNS, corestore) and every other provider of the catalog are launched by launch and registered
// by the resource types their Describe declares, so a type names exactly one plugin and two
// plugins declaring one type stop berthd at start (docs/plugins.md section 4.6).
type providers struct {
	types *plugin.Types
	// vendors are the providers launched from the catalog for no built-in role; closed by
	// closeVendors.
	vendors []*plugin.Provider
}

func newProviders() *providers { return &providers{types: plugin.NewTypes()} }

// builtinRole reports whether a catalog entry named name is launched by a part of berthd with
// its own arguments and configuration (the gateway, DNS and corestore roles, and the machine and
// build providers other parts drive), rather than as a vendor's provider.
func builtinRole(name string) bool {
	switch name {
	case "gateway", "dns", "corestore", "hetzner", "corebuild", "caddy":
		return true
	}
	return false
}

// launch starts the provider of pc and registers the types it declares under role ("" for a
// vendor's). A type another plugin declared already is an error naming both, after which the
// new plugin is stopped.
func (ps *providers) launch(ctx context.Context, role string, pc plugin.Config) (*plugin.Provider, error) {
	h, err := plugin.LaunchProvider(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := ps.types.AddProvider(role, h); err != nil {
		_ = h.Close()
		return nil, err
	}
	return h, nil
}

// startVendors launches every provider of the catalog in cfg.PluginDir that no built-in role
// owns, each with its catalog entry's arguments and configuration and its pid recorded under
// DATA/plugins. Without a catalog there are none: vendors' plugins are loaded from the catalog
// only, pinned by their SHA-256.
func (ps *providers) startVendors(ctx context.Context, cfg Config, log *slog.Logger) error {
	cat, err := plugin.LoadCatalog(cfg.PluginDir)
	if errors.Is(err, plugin.ErrNoCatalog) {
		return nil
	}
	if err != nil {
		return err
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	for _, e := range cat.Plugins {
		if e.Kind != pluginapi.KindProvider || builtinRole(e.Name) {
			continue
		}
		h, err := ps.launch(ctx, "", e.Apply(plugin.Config{PidDir: pdir, Logger: log}))
		if err != nil {
			return fmt.Errorf("provider plugin %s: %w", e.Name, err)
		}
		ps.vendors = append(ps.vendors, h)
		types := []string{}
		for _, t := range h.Declared() {
			types = append(types, t.Name)
		}
		log.Info("provider plugin running", "plugin", e.Name, "types", types, "pid", h.PID())
	}
	return nil
}

// closeVendors stops the vendors' plugins.
func (ps *providers) closeVendors() {
	for _, h := range ps.vendors {
		_ = h.Close()
	}
}
