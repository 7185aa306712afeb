package dnsrecords

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// SyncEvery is the period of the managed-records pass (docs/dns.md section 7).
const SyncEvery = 5 * time.Second

// EdgeAddressLabel is the node label naming the public addresses (comma-separated IPs) of an
// edge node: while the node is connected, managed domains point at them too (docs/dns.md
// section 7).
const EdgeAddressLabel = "edge-address"

// EdgeGrace is how long a disconnected edge node keeps its addresses in the records: a berthd
// restart (which marks every node disconnected until it reconnects) or a short network blip does
// not make the domains flap.
const EdgeGrace = 2 * time.Minute

// Sync keeps the records of the `dns: managed` services' domains pointing at the edge: the
// services' domains come from Catalog, the edge from Edge and the connected edge nodes of Nodes.
// The zero value is not usable: Records, Catalog and Nodes are required.
type Sync struct {
	Records *Records
	Catalog *services.Catalog
	Nodes   *nodes.Registry
	// Edge are the operator's edge addresses (--edge-addresses), always pointed at.
	Edge []string
	// Logger receives a warning per failed pass and per change of the skipped domains; nil
	// discards.
	Logger *slog.Logger
	// Now is the clock of the edge grace; nil means time.Now.
	Now func() time.Time
}

// Run runs the write worker of Records and a managed-records pass every SyncEvery until ctx
// ends. A failed pass is logged and the next one goes on.
func (s *Sync) Run(ctx context.Context) {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Records.Run(ctx) }()
	t := time.NewTicker(SyncEvery)
	defer t.Stop()
	var lastSkipped []string
	for {
		skipped, err := s.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("dns: managed records pass", "error", err)
		}
		if !slices.Equal(skipped, lastSkipped) && len(skipped) > 0 {
			log.Warn("dns: managed domains outside the DNS zones get no records", "domains", strings.Join(skipped, ", "))
		}
		lastSkipped = skipped
		select {
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
		}
	}
}

// Pass is one managed-records pass ([Records.SyncManaged]): every domain of every service with
// `dns: managed` that is not being deleted. It returns the domains outside the zones.
func (s *Sync) Pass(ctx context.Context) ([]string, error) {
	projects, err := s.Catalog.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	var domains []Domain
	for i := range projects {
		svcs, err := s.Catalog.ListServices(ctx, &projects[i])
		if err != nil {
			return nil, err
		}
		for _, svc := range svcs {
			if svc.DNS != services.DNSManaged || svc.Deleting {
				continue
			}
			for _, host := range svc.Domains {
				domains = append(domains, Domain{Holder: ServiceHolder(svc.ID), Host: host})
			}
		}
	}
	edge, err := s.EdgeAddresses(ctx)
	if err != nil {
		return nil, err
	}
	return s.Records.SyncManaged(ctx, domains, edge)
}

// EdgeAddresses is Edge and the addresses in the edge-address label of every connected node,
// and of every disconnected one seen within EdgeGrace; an address that is not an IP is dropped.
// A draining or removed node's addresses go at once. Sorted, without duplicates.
func (s *Sync) EdgeAddresses(ctx context.Context) ([]string, error) {
	out := slices.Clone(s.Edge)
	ns, err := s.Nodes.List(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	for _, n := range ns {
		v, ok := n.Labels[EdgeAddressLabel]
		recent := n.Status == nodes.StatusDisconnected && n.LastSeenAt != nil && now().Sub(*n.LastSeenAt) < EdgeGrace
		if !ok || (n.Status != nodes.StatusConnected && !recent) {
			continue
		}
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); net.ParseIP(a) != nil {
				out = append(out, a)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
