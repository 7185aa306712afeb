package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
)

// DNSChallenger writes the TXT records of node challenges (docs/node-protocol.md section 6.8);
// core/dnsrecords.Records is one.
type DNSChallenger interface {
	// Served reports whether fqdn is in a zone the DNS provider writes.
	Served(fqdn string) bool
	// PresentNodeTXT and CleanupNodeTXT set and clear value in fqdn on behalf of nodeID,
	// returning once the DNS server holds (no longer holds) it.
	PresentNodeTXT(ctx context.Context, nodeID, fqdn, value string) error
	CleanupNodeTXT(ctx context.Context, nodeID, fqdn, value string) error
}

// dnsChallengeTimeout bounds one challenge's write; the node retries a failed set with backoff.
const dnsChallengeTimeout = 2 * time.Minute

// maxDNSChallenges bounds the challenges of one session in flight at once.
const maxDNSChallenges = 4

// onDNSChallenge checks a dns_challenge (the host must be an acme route of the node's current
// desired state, in a zone the DNS provider writes) and writes the record in the background, so
// that the session keeps reading; the answer is a dns_challenge_result either way.
func (s *Server) onDNSChallenge(ctx context.Context, c *conn, env *node.Envelope) {
	var ch node.DNSChallenge
	if err := json.Unmarshal(env.Body, &ch); err != nil {
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "dns_challenge body is malformed", false)
		return
	}
	refuse := func(code abierrors.Code, msg string) {
		_ = s.write(ctx, c, node.TypeDNSChallengeResult, env.ID, node.DNSChallengeResult{Code: string(code), Message: msg})
	}
	host := strings.TrimSuffix(strings.ToLower(ch.Hostname), ".")
	switch {
	case ch.Action != node.DNSChallengeSet && ch.Action != node.DNSChallengeClear:
		refuse(abierrors.BadMessage, fmt.Sprintf("action %q is not set or clear", ch.Action))
		return
	case host == "" || ch.Value == "" || len(ch.Value) > 255:
		refuse(abierrors.BadMessage, "a hostname and a value of 1 to 255 bytes are required")
		return
	case s.cfg.DNS == nil:
		refuse(abierrors.DNSZoneNotServed, "this core runs no DNS provider")
		return
	}
	if ok, err := s.acmeRoute(ctx, c.nodeID, host); err != nil {
		refuse(abierrors.Unavailable, "the node's desired state could not be read")
		return
	} else if !ok {
		refuse(abierrors.DNSChallengeHostUnknown, fmt.Sprintf("%s is not an acme route of this node's desired state", host))
		return
	}
	fqdn := "_acme-challenge." + strings.TrimPrefix(host, "*.") + "."
	if !s.cfg.DNS.Served(fqdn) {
		refuse(abierrors.DNSZoneNotServed, fmt.Sprintf("%s is in no zone the DNS provider writes", host))
		return
	}
	select {
	case c.dnsSlots <- struct{}{}:
	default:
		refuse(abierrors.Unavailable, fmt.Sprintf("at most %d challenges at once", maxDNSChallenges))
		return
	}
	go func() {
		defer func() { <-c.dnsSlots }()
		wctx, cancel := context.WithTimeout(c.ctx, dnsChallengeTimeout)
		defer cancel()
		var err error
		if ch.Action == node.DNSChallengeSet {
			err = s.cfg.DNS.PresentNodeTXT(wctx, c.nodeID, fqdn, ch.Value)
		} else {
			err = s.cfg.DNS.CleanupNodeTXT(wctx, c.nodeID, fqdn, ch.Value)
		}
		res := node.DNSChallengeResult{OK: err == nil, RecordID: challengeRecordID(fqdn, c.nodeID, ch.Value)}
		if err != nil {
			res.RecordID, res.Code, res.Message = "", string(abierrors.CodeOf(err)), err.Error()
			s.log.Info("dns challenge failed", "node_id", c.nodeID, "hostname", host, "action", ch.Action, "code", res.Code)
		}
		if err := s.write(c.ctx, c, node.TypeDNSChallengeResult, env.ID, res); err != nil {
			s.log.Info("answer dns_challenge", "node_id", c.nodeID, "err", err)
		}
	}()
}

// challengeRecordID names what the core wrote for a node: stable for one node, record and value.
func challengeRecordID(fqdn, nodeID, value string) string {
	sum := sha256.Sum256([]byte(fqdn + "\x00" + nodeID + "\x00" + value))
	return hex.EncodeToString(sum[:16])
}

// acmeRoute reports whether host is a route with tls_mode acme in nodeID's current desired state
// (read from the store: the state the core last decided, whether or not this session sent it).
func (s *Server) acmeRoute(ctx context.Context, nodeID, host string) (bool, error) {
	n, err := s.cfg.Nodes.Get(ctx, nodeID)
	if err != nil {
		return false, err
	}
	if n.DesiredSpec == "" {
		return false, nil
	}
	var spec node.Spec
	if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
		return false, fmt.Errorf("decode stored desired state of %s: %w", nodeID, err)
	}
	for _, r := range spec.Routes {
		if strings.EqualFold(strings.TrimSuffix(r.Hostname, "."), host) && r.TLSMode == "acme" {
			return true, nil
		}
	}
	return false, nil
}
