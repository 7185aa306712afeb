package api

import (
	"context"
	"errors"
	"fmt"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
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

// checkServiceTLS refuses a service's tls block that cannot be served
// (docs/certificates.md section 6): an unknown mode or manual without a
// secret (tls_mode_invalid), a manual secret that is not a matching PEM
// certificate and key covering every domain (tls_certificate_invalid), an
// acme domain no challenge can prove with this berthd's configuration
// (tls_domain_unverifiable). It reads the manual secret's current version
// only; the value is never logged or returned.
func (s *Server) checkServiceTLS(ctx context.Context, p *services.Project, spec *serviceSpec) error {
	switch spec.TLS.Mode {
	case "", certs.ModeNone, certs.ModePassthrough:
		if spec.TLS.Secret != "" {
			return problem(abierrors.TLSModeInvalid, "tls.secret is only for tls mode manual")
		}
		return nil
	case certs.ModeACME:
		if spec.TLS.Secret != "" {
			return problem(abierrors.TLSModeInvalid, "tls.secret is only for tls mode manual")
		}
		if s.cfg.ACME == nil {
			return problem(abierrors.TLSDomainUnverifiable, "this berthd has no ACME CA configured (berthd --acme-directory); tls mode acme cannot be served")
		}
		for _, d := range spec.Domains {
			if err := s.cfg.ACME.CheckDomain(d); err != nil {
				return problem(abierrors.TLSDomainUnverifiable, err.Error())
			}
		}
		return nil
	case certs.ModeManual:
		if spec.TLS.Secret == "" {
			return problem(abierrors.TLSModeInvalid, "tls mode manual needs tls.secret: the project secret holding the PEM certificate chain and private key")
		}
		if s.cfg.Secrets == nil {
			return problem(abierrors.Unavailable, "this berthd serves no secrets")
		}
		sec, v, err := s.secretStore().Resolve(ctx, p.ID, spec.TLS.Secret, 0)
		if err != nil {
			return refError(fmt.Errorf("tls.secret: %w", err))
		}
		value, err := s.secretStore().Open(sec, v)
		if errors.Is(err, secrets.ErrOpenFailed) {
			return problem(abierrors.SecretOpenFailed, fmt.Sprintf("tls.secret %s does not open under the keyring", spec.TLS.Secret))
		} else if err != nil {
			return err
		}
		certPEM, keyPEM, err := certs.SplitPEM(value)
		if err == nil {
			_, err = certs.CheckPair(certPEM, keyPEM, spec.Domains, s.now())
		}
		if err != nil {
			return problem(abierrors.TLSCertificateInvalid, fmt.Sprintf("tls.secret %s: %s", spec.TLS.Secret, err.Error()))
		}
		return nil
	}
	return problem(abierrors.TLSModeInvalid, fmt.Sprintf("unknown tls mode %q (want none, acme, manual or passthrough)", spec.TLS.Mode))
}
