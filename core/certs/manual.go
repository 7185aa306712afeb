package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

// TLS modes a service's tls block may name (docs/certificates.md section 1);
// abi/routes carries the same values on routes.
const (
	ModeNone        = "none"
	ModeACME        = "acme"
	ModeManual      = "manual"
	ModePassthrough = "passthrough"
)

// ErrCertificateInvalid is wrapped by [CheckPair] when a manual certificate
// and key do not make a usable pair for the names asked.
var ErrCertificateInvalid = errors.New("berth: the tls secret is not a matching PEM certificate and key for the service's domains")

// ErrDomainUnverifiable is wrapped by [Config.CheckDomain] when no ACME
// challenge can prove control of a domain.
var ErrDomainUnverifiable = errors.New("berth: no ACME challenge can prove this domain")

// ManualSource returns the PEM certificate chain and private key that the
// tls_mode manual routes of project/service serve: the service's tls secret
// (docs/certificates.md section 1). An error leaves those routes without a
// certificate and their status failed.
type ManualSource interface {
	ManualCertificate(ctx context.Context, project, service string) (certPEM, keyPEM []byte, err error)
}

// SplitPEM splits one secret value holding PEM blocks into the certificate
// blocks (in order: leaf first) and the one private key block. Errors wrap
// [ErrCertificateInvalid].
func SplitPEM(value []byte) (certPEM, keyPEM []byte, err error) {
	var certs, keys bytes.Buffer
	nkeys := 0
	rest := value
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch {
		case b.Type == "CERTIFICATE":
			_ = pem.Encode(&certs, b) // a bytes.Buffer never fails
		case strings.HasSuffix(b.Type, "PRIVATE KEY"):
			nkeys++
			_ = pem.Encode(&keys, b)
		}
	}
	switch {
	case certs.Len() == 0:
		return nil, nil, fmt.Errorf("%w: no CERTIFICATE block", ErrCertificateInvalid)
	case nkeys != 1:
		return nil, nil, fmt.Errorf("%w: %d PRIVATE KEY blocks, want one", ErrCertificateInvalid, nkeys)
	}
	return certs.Bytes(), keys.Bytes(), nil
}

// CheckPair reports whether keyPEM is the private key of certPEM's leaf
// and the leaf covers every one of hostnames (exactly or by a wildcard) at
// now, and returns the leaf's expiry. Errors wrap [ErrCertificateInvalid].
func CheckPair(certPEM, keyPEM []byte, hostnames []string, now time.Time) (time.Time, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %w", ErrCertificateInvalid, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %w", ErrCertificateInvalid, err)
	}
	if now.After(leaf.NotAfter) {
		return time.Time{}, fmt.Errorf("%w: the certificate expired at %s", ErrCertificateInvalid, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	for _, h := range hostnames {
		ok := leaf.VerifyHostname(h) == nil
		if strings.HasPrefix(h, "*.") {
			ok = coversWildcard(leaf, h) // a wildcard domain needs the wildcard name itself
		}
		if !ok {
			return time.Time{}, fmt.Errorf("%w: the certificate does not cover %s (it names %v)", ErrCertificateInvalid, h, leaf.DNSNames)
		}
	}
	return leaf.NotAfter.UTC(), nil
}

func coversWildcard(leaf *x509.Certificate, h string) bool {
	for _, n := range leaf.DNSNames {
		if strings.EqualFold(n, h) {
			return true
		}
	}
	return false
}

// CheckDomain says whether an ACME certificate can be ordered for host with
// c: a wildcard needs a DNS-01 zone over it and a DNS provider; another
// name needs either that or a port 80 the CA reaches (HTTP01Reachable).
// Errors wrap [ErrDomainUnverifiable] and say which was missing.
func (c Config) CheckDomain(host string) error {
	zone := ""
	for _, z := range c.DNS01Zones {
		if underZone(host, z) {
			zone = z
			break
		}
	}
	switch {
	case zone != "" && c.DNS == nil:
		return fmt.Errorf("%w: %s is under the DNS-01 zone %s but no DNS provider is configured", ErrDomainUnverifiable, host, zone)
	case zone != "":
		return nil
	case strings.HasPrefix(host, "*."):
		return fmt.Errorf("%w: %s is a wildcard, which only DNS-01 proves, and it is under none of the zones Berth manages DNS for (%s)",
			ErrDomainUnverifiable, host, zonesOrNone(c.DNS01Zones))
	case !c.HTTP01Reachable:
		return fmt.Errorf("%w: %s is under none of the zones Berth manages DNS for (%s) and the gateway's port 80 is not configured as reachable for HTTP-01",
			ErrDomainUnverifiable, host, zonesOrNone(c.DNS01Zones))
	}
	return nil
}

func zonesOrNone(z []string) string {
	if len(z) == 0 {
		return "none"
	}
	return strings.Join(z, ", ")
}

// manualCertificates reads the manual pair of every tls_mode manual route
// of t through src, one read per service, and returns the table's
// certificates for them keyed by hostname; a failed read or check records
// the hostnames failed and keeps the last good pair, until it expires.
func (m *Manager) manualCertificates(ctx context.Context, t abiroutes.Table) map[string]abiroutes.Certificate {
	out := map[string]abiroutes.Certificate{}
	if m.cfg.Manual == nil {
		return out
	}
	bySvc := map[[2]string][]string{}
	for _, r := range t.Routes {
		if r.TLSMode == ModeManual {
			k := [2]string{r.Project, r.Service}
			bySvc[k] = append(bySvc[k], r.Hostname)
		}
	}
	for k, hosts := range bySvc {
		certPEM, keyPEM, err := m.cfg.Manual.ManualCertificate(ctx, k[0], k[1])
		var notAfter time.Time
		if err == nil {
			notAfter, err = CheckPair(certPEM, keyPEM, hosts, m.cfg.Now())
		}
		for _, h := range hosts {
			if err != nil {
				m.manualFailed(ctx, h, err)
				m.mu.Lock()
				prev, ok := m.manual[h]
				m.mu.Unlock()
				if ok && m.cfg.Now().Before(prev.NotAfter) {
					out[h] = prev // the last good pair keeps serving until it expires
				}
				continue
			}
			out[h] = abiroutes.Certificate{Names: []string{h}, CertPEM: string(certPEM), KeyPEM: string(keyPEM), NotAfter: notAfter}
			m.metrics.notAfter.WithLabelValues(h).Set(float64(notAfter.Unix()))
			if uerr := m.status.update(ctx, h, func(s *Status) bool {
				if s.State == StateIssued && s.NotAfter.Equal(notAfter) && s.Challenge == "manual" {
					return false
				}
				s.State, s.NotAfter, s.LastError, s.Challenge = StateIssued, notAfter, "", "manual"
				return true
			}); uerr != nil {
				m.log.Warn("record certificate status", "hostname", h, "error", uerr)
			}
		}
	}
	return out
}

// manualFailed records h's manual certificate failed, once per distinct error.
func (m *Manager) manualFailed(ctx context.Context, h string, err error) {
	cur, serr := m.Status(ctx, h)
	if serr == nil && cur.State == StateFailed && cur.LastError == err.Error() {
		return
	}
	m.fail(ctx, h, false, err)
	if uerr := m.status.update(ctx, h, func(s *Status) bool { s.Challenge = "manual"; return true }); uerr != nil {
		m.log.Warn("record certificate status", "hostname", h, "error", uerr)
	}
}
