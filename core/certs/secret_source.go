package certs

import (
	"context"
	"fmt"

	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
)

// SecretSource is the [ManualSource] of berthd: a tls mode manual service's certificate and key
// are the current version of the project secret its tls block names (docs/certificates.md).
type SecretSource struct {
	Catalog *services.Catalog
	Secrets *secrets.Store
}

var _ ManualSource = SecretSource{}

// ManualCertificate reads service's tls secret in project and splits it into the certificate
// chain and the key ([SplitPEM]). Errors name the service and, once known, the secret.
func (s SecretSource) ManualCertificate(ctx context.Context, project, service string) ([]byte, []byte, error) {
	p, err := s.Catalog.GetProject(ctx, project)
	if err != nil {
		return nil, nil, fmt.Errorf("tls secret of %s/%s: %w", project, service, err)
	}
	svc, err := s.Catalog.GetService(ctx, p, service)
	if err != nil {
		return nil, nil, fmt.Errorf("tls secret of %s/%s: %w", project, service, err)
	}
	sec, v, err := s.Secrets.Resolve(ctx, p.ID, svc.TLS.Secret, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("tls secret %s of %s/%s: %w", svc.TLS.Secret, project, service, err)
	}
	value, err := s.Secrets.Open(sec, v)
	if err != nil {
		return nil, nil, fmt.Errorf("tls secret %s of %s/%s: %w", svc.TLS.Secret, project, service, err)
	}
	return SplitPEM(value)
}
