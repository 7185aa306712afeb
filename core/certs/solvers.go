package certs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mholt/acmez/v3"
	"github.com/mholt/acmez/v3/acme"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

// TXTPublisher publishes and clears the TXT records of DNS-01 challenges
// through the DNS provider (core/dnsrecords implements it).
//
// PresentTXT returns once fqdn ("_acme-challenge.shop.example.com", with or
// without the trailing dot) answers value on the zone's authoritative
// servers; it is idempotent for one (fqdn, value). CleanupTXT removes that
// one value (never another record of fqdn) and treats an absent record as
// done. Both honour ctx.
type TXTPublisher interface {
	PresentTXT(ctx context.Context, fqdn, value string) error
	CleanupTXT(ctx context.Context, fqdn, value string) error
}

// ErrDNSUnavailable is wrapped by the error of a DNS-01 order whose
// challenge record DNS did not take within [Config.DNSPublishWait] (the
// server down or unreachable; the publisher keeps retrying the write). The
// hostname then stays pending with that error as last_error rather than
// failed (docs/certificates.md section 8). A TXTPublisher may wrap it in
// an error of its own for the same case.
var ErrDNSUnavailable = errors.New("berth: DNS did not take the challenge record in time")

// dnsSolver answers DNS-01 challenges through a TXTPublisher, waiting at
// most wait for each record.
type dnsSolver struct {
	pub  TXTPublisher
	wait time.Duration
}

var _ acmez.Solver = dnsSolver{}

func (s dnsSolver) Present(ctx context.Context, ch acme.Challenge) error {
	pctx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	err := s.pub.PresentTXT(pctx, ch.DNS01TXTRecordName(), ch.DNS01KeyAuthorization())
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) && !errors.Is(err, ErrDNSUnavailable):
		return fmt.Errorf("certs: publish DNS-01 record for %s: %w (waited %s): %w", ch.Identifier.Value, ErrDNSUnavailable, s.wait, err)
	}
	return fmt.Errorf("certs: publish DNS-01 record for %s: %w", ch.Identifier.Value, err)
}

// CleanUp waits at most s.wait as well: the order's context has no deadline,
// and while DNS is down an unbounded wait would hold the order (and the
// status it reports) until DNS is back. The publisher keeps the withdrawal
// going after the wait.
func (s dnsSolver) CleanUp(ctx context.Context, ch acme.Challenge) error {
	cctx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	if err := s.pub.CleanupTXT(cctx, ch.DNS01TXTRecordName(), ch.DNS01KeyAuthorization()); err != nil {
		return fmt.Errorf("certs: clear DNS-01 record for %s: %w", ch.Identifier.Value, err)
	}
	return nil
}

// tableSolver answers HTTP-01 challenges through the route table: Present
// adds the answer to the table's Challenges and returns once the gateway
// has applied that table; CleanUp takes it out again.
type tableSolver struct{ m *Manager }

var _ acmez.Solver = tableSolver{}

func (s tableSolver) Present(ctx context.Context, ch acme.Challenge) error {
	c := abiroutes.Challenge{Host: ch.Identifier.Value, Token: ch.Token, KeyAuth: ch.KeyAuthorization}
	s.m.mu.Lock()
	s.m.challenges[c] = true
	s.m.mu.Unlock()
	if err := s.m.push(ctx); err != nil {
		return fmt.Errorf("certs: hand the HTTP-01 answer for %s to the gateway: %w", c.Host, err)
	}
	return nil
}

func (s tableSolver) CleanUp(ctx context.Context, ch acme.Challenge) error {
	c := abiroutes.Challenge{Host: ch.Identifier.Value, Token: ch.Token, KeyAuth: ch.KeyAuthorization}
	s.m.mu.Lock()
	delete(s.m.challenges, c)
	s.m.mu.Unlock()
	if err := s.m.push(ctx); err != nil {
		return fmt.Errorf("certs: withdraw the HTTP-01 answer for %s: %w", c.Host, err)
	}
	return nil
}

// underZone reports whether name (or, for "*.x", x) is zone or below it.
func underZone(name, zone string) bool {
	name = strings.TrimPrefix(strings.TrimSuffix(strings.ToLower(name), "."), "*.")
	zone = strings.TrimSuffix(strings.ToLower(zone), ".")
	return name == zone || strings.HasSuffix(name, "."+zone)
}

// usesDNS01 reports whether name is validated by DNS-01: a wildcard, or a
// name under one of the DNS-01 zones.
func (m *Manager) usesDNS01(name string) bool {
	if strings.HasPrefix(name, "*.") {
		return true
	}
	for _, z := range m.cfg.DNS01Zones {
		if underZone(name, z) {
			return true
		}
	}
	return false
}

// solversFor returns the one challenge solver that serves all of names.
func (m *Manager) solversFor(names []string) (map[string]acmez.Solver, error) {
	dns, http := 0, 0
	for _, n := range names {
		if m.usesDNS01(n) {
			dns++
		} else {
			http++
		}
	}
	switch {
	case dns > 0 && http > 0:
		return nil, fmt.Errorf("certs: order %v mixes DNS-01 and HTTP-01 names", names)
	case dns > 0:
		if m.cfg.DNS == nil {
			return nil, fmt.Errorf("certs: order %v needs DNS-01 and no DNS provider is configured", names)
		}
		return map[string]acmez.Solver{acme.ChallengeTypeDNS01: dnsSolver{pub: m.cfg.DNS, wait: m.cfg.DNSPublishWait}}, nil
	default:
		return map[string]acmez.Solver{acme.ChallengeTypeHTTP01: tableSolver{m}}, nil
	}
}
