package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/securefile"
)

// dnsStateDir is the DNS plugin's state directory under DATA/plugins.
const dnsStateDir = "dns"

// dns is berthd's DNS part: the plugin, the records and the managed-records pass.
type dns struct {
	records *dnsrecords.Records
	handle  *plugin.Provider
	sync    *dnsrecords.Sync
	zones   []string // the plugin's configured zones
}

// checkEdgeAddresses refuses an edge address that is not an IP address.
func checkEdgeAddresses(addrs []string) error {
	for _, a := range addrs {
		if net.ParseIP(a) == nil {
			return fmt.Errorf("berthd: edge address %q is not an IP address (--edge-addresses)", a)
		}
	}
	return nil
}

// startDNS launches the DNS provider plugin with the configuration in cfg.DNSConfig (a JSON
// object, owner-only, that may hold the TSIG secret; docs/dns.md section 9) and returns the DNS
// part, or nil when no configuration is given. A tsig_secret_ref in the file is resolved here,
// from core/secrets, into the tsig_secret the plugin receives.
func startDNS(ctx context.Context, cfg Config, ps *providers, st *store.Store, ops *operations.Queue, cat *services.Catalog, reg *nodes.Registry, sec *secrets.Store, log *slog.Logger) (*dns, error) {
	if cfg.DNSConfig == "" {
		return nil, nil
	}
	raw, err := securefile.ReadFile(cfg.DNSConfig)
	if err != nil {
		return nil, fmt.Errorf("dns configuration: %w", err)
	}
	var obj map[string]json.RawMessage
	var zones struct {
		Zones []string `json:"zones"`
	}
	if json.Unmarshal(raw, &obj) != nil || json.Unmarshal(raw, &zones) != nil {
		return nil, fmt.Errorf("dns configuration %s: not a JSON object with zones", cfg.DNSConfig)
	}
	if ref, ok := obj["tsig_secret_ref"]; ok {
		if raw, err = dnsrecords.ResolveTSIG(ctx, obj, ref, sec, projectID(cat)); err != nil {
			return nil, fmt.Errorf("dns configuration %s: %w", cfg.DNSConfig, err)
		}
	}
	entry, err := plugin.ResolveProvider(cfg.PluginDir, "dns")
	if err != nil {
		return nil, fmt.Errorf("dns plugin: %w", err)
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	pc := entry.Apply(plugin.Config{Args: []string{"--state-dir", filepath.Join(pdir, dnsStateDir)}, PidDir: pdir, Logger: log})
	pc.PluginConfig = raw
	h, err := ps.launch(ctx, "dns", pc)
	if err != nil {
		// The plugin's answer names the problems; it never quotes the secret.
		return nil, fmt.Errorf("start dns plugin: %w", err)
	}
	recs, err := dnsrecords.New(dnsrecords.Config{Store: st, Queue: ops, Writer: h, Zones: zones.Zones, Logger: log})
	if err != nil {
		_ = h.Close()
		return nil, err
	}
	log.Info("dns plugin running", "zones", zones.Zones, "edge_addresses", cfg.EdgeAddresses, "pid", h.Status().PID)
	if len(cfg.EdgeAddresses) == 0 {
		log.Warn("dns: no --edge-addresses: managed domains point only at connected nodes labelled " + dnsrecords.EdgeAddressLabel)
	}
	sync := &dnsrecords.Sync{Records: recs, Catalog: cat, Nodes: reg, Edge: cfg.EdgeAddresses, Logger: log.With("component", "dns")}
	return &dns{records: recs, handle: h, sync: sync, zones: zones.Zones}, nil
}

// close stops the plugin.
func (d *dns) close() { _ = d.handle.Close() }
