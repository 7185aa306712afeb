package api

import (
	"context"

	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/sdk/client"
)

// certificateStatuses reads the certificate status of each of hostnames
// that has one (one read by _id each).
func (s *Server) certificateStatuses(ctx context.Context, hostnames []string) (map[string]client.CertificateStatus, error) {
	if len(hostnames) == 0 {
		return nil, nil
	}
	if s.cfg.Certificates == nil {
		return nil, nil // no certificate manager: no statuses
	}
	st, err := s.cfg.Certificates.Statuses(ctx, hostnames)
	if err != nil {
		return nil, err
	}
	out := make(map[string]client.CertificateStatus, len(st))
	for h, c := range st {
		out[h] = client.CertificateStatus{Hostname: h, State: string(c.State), Challenge: c.Challenge, NotAfter: c.NotAfter,
			LastError: c.LastError, UpdatedAt: c.UpdatedAt}
	}
	return out, nil
}

// CertificateStatuses reads stored certificate statuses ([certs.StatusReader]).
type CertificateStatuses interface {
	// Statuses returns the stored status of each of hostnames that has one, by hostname.
	Statuses(ctx context.Context, hostnames []string) (map[string]certs.Status, error)
}

// DomainChecker reports why no ACME challenge can prove a domain, or nil
// (certs.Config.CheckDomain).
type DomainChecker interface {
	CheckDomain(host string) error
}
