package server

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

// ACMEConfig configures the gateway's ACME certificates
// (docs/certificates.md section 7). An empty Directory turns them off: tls
// mode acme is then refused at apply.
type ACMEConfig struct {
	// Directory is the ACME directory URL.
	Directory string
	// CARootFile is a PEM file of the roots trusted for the directory's TLS
	// (a private CA); empty means the system roots.
	CARootFile string
	// Email is the ACME account's contact.
	Email string
	// DNS01Zones are the zones Berth manages DNS for: their names and every
	// wildcard are proven by DNS-01 through DNS.
	DNS01Zones []string
	// HTTP01Reachable reports whether the CA reaches the gateway's port 80
	// for every other name (HTTP-01).
	HTTP01Reachable bool
	// RenewCheckInterval is how often certificates are checked for renewal;
	// zero means 10 minutes.
	RenewCheckInterval time.Duration
	// DNS publishes DNS-01 records (core/dnsrecords); nil means no DNS-01.
	DNS certs.TXTPublisher
}

// withDNS01 returns c with the DNS part d as its DNS-01 publisher
// (docs/certificates.md section 2): when ACME is on, a DNS plugin runs and
// no publisher was given, d's records publish the `_acme-challenge` TXT
// records, and with no --acme-dns01-zone the DNS plugin's zones are the
// DNS-01 zones. A DNS-01 zone the plugin does not serve is logged: its
// orders then fail with dns_zone_not_served. d nil, or ACME off, returns c
// unchanged.
func withDNS01(c ACMEConfig, d *dns, log *slog.Logger) ACMEConfig {
	if d == nil || c.Directory == "" || c.DNS != nil {
		return c
	}
	c.DNS = d.records
	if len(c.DNS01Zones) == 0 {
		c.DNS01Zones = slices.Clone(d.zones)
	}
	for _, z := range c.DNS01Zones {
		if !d.records.Served("_acme-challenge." + strings.TrimSuffix(z, ".") + ".") {
			log.Warn("certificates: a DNS-01 zone is not among the DNS plugin's zones; its orders will fail", "zone", z, "dns_zones", d.zones)
		}
	}
	return c
}

// acmeChecker returns the API's check of tls mode acme domains under c; nil
// (refuse them all) when ACME is off.
func acmeChecker(c ACMEConfig) api.DomainChecker {
	if c.Directory == "" {
		return nil
	}
	return certs.Config{DNS: c.DNS, DNS01Zones: c.DNS01Zones, HTTP01Reachable: c.HTTP01Reachable}
}

// startCerts puts a certs.Manager between the reconciler and gw when ACME
// is configured, and returns the sink the reconciler pushes to (gw itself
// when ACME is off, or there is no gateway).
func startCerts(cfg ACMEConfig, st *store.Store, sec *secrets.Store, cat *services.Catalog, gw reconciler.RouteSink,
	evlog *events.Log, metrics prometheus.Registerer, log *slog.Logger) (reconciler.RouteSink, func(), error) {
	if gw == nil {
		return gw, func() {}, nil
	}
	cc := certs.Config{
		Store: st, Keyring: sec.Keyring(), Next: gw, Owner: identity.NewID("brd_"),
		DirectoryURL: cfg.Directory, CARootFile: cfg.CARootFile, Email: cfg.Email,
		DNS: cfg.DNS, DNS01Zones: cfg.DNS01Zones, HTTP01Reachable: cfg.HTTP01Reachable,
		RenewCheckInterval: cfg.RenewCheckInterval, Manual: certs.SecretSource{Catalog: cat, Secrets: sec},
		Events: evlog, Metrics: metrics, Logger: log,
	}
	m, err := certs.New(cc)
	if err != nil {
		return nil, nil, fmt.Errorf("certificates: %w", err)
	}
	return m, m.Close, nil
}
