package dnsrecords

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Holder prefixes (docs/dns.md section 6.1): who holds a value of a record.
const (
	// HolderACME holds one ACME DNS-01 value asked for through [Records.PresentTXT].
	HolderACME = "acme/"
	// HolderNode holds one value a node asked for (docs/node-protocol.md section 6.8).
	HolderNode = "node/"
	// HolderService holds a managed service's edge addresses (section 7).
	HolderService = "svc/"
)

func valueKey(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:12])
}

// ChallengeName returns "_acme-challenge.<host>" for host (a wildcard's "*." dropped), fully
// qualified.
func ChallengeName(host string) string {
	return "_acme-challenge." + dnsFQDN(strings.TrimPrefix(host, "*."))
}

// PresentTXT publishes value in the TXT record fqdn (e.g. "_acme-challenge.example.com.") beside
// any other value held there, and returns once the DNS server holds it. Presenting a value again
// after its write failed for good writes it again. It is the DNS-01 step of
// an ACME order; ctx bounds the wait. Errors: dns_zone_not_served for a name outside the zones;
// the code of a write that failed for good (dns_auth_refused, dns_record_not_owned, ...); ctx's
// error while the server is down (the write goes on being retried).
func (r *Records) PresentTXT(ctx context.Context, fqdn, value string) error {
	return r.presentAs(ctx, HolderACME+valueKey(value), fqdn, value)
}

// CleanupTXT withdraws value from the TXT record fqdn, leaving every other value, and returns once
// the server no longer holds it (the record itself goes when nobody holds a value). Withdrawing a
// value never presented is success.
func (r *Records) CleanupTXT(ctx context.Context, fqdn, value string) error {
	return r.cleanupAs(ctx, HolderACME+valueKey(value), fqdn)
}

// PresentNodeTXT is PresentTXT on behalf of node nodeID: the value is held by that node, so
// that [Records.CleanupNodeTXT] of another node or of the ACME client never withdraws it.
func (r *Records) PresentNodeTXT(ctx context.Context, nodeID, fqdn, value string) error {
	return r.presentAs(ctx, HolderNode+nodeID+"/"+valueKey(value), fqdn, value)
}

// CleanupNodeTXT withdraws what node nodeID presented as value in fqdn, and only that.
func (r *Records) CleanupNodeTXT(ctx context.Context, nodeID, fqdn, value string) error {
	return r.cleanupAs(ctx, HolderNode+nodeID+"/"+valueKey(value), fqdn)
}

func (r *Records) presentAs(ctx context.Context, holder, fqdn, value string) error {
	if value == "" || len(value) > 255 {
		return fmt.Errorf("present TXT %s: a value of 1 to 255 bytes is required", fqdn)
	}
	gen, err := r.set(ctx, fqdn, "TXT", holder, []string{value}, r.cfg.ChallengeTTL, true)
	if err != nil {
		return fmt.Errorf("present TXT %s: %w", fqdn, err)
	}
	return r.Wait(ctx, fqdn, "TXT", gen)
}

func (r *Records) cleanupAs(ctx context.Context, holder, fqdn string) error {
	gen, err := r.set(ctx, fqdn, "TXT", holder, nil, r.cfg.ChallengeTTL, true)
	if err != nil {
		return fmt.Errorf("clean up TXT %s: %w", fqdn, err)
	}
	if gen == 0 {
		return nil
	}
	return r.Wait(ctx, fqdn, "TXT", gen)
}
