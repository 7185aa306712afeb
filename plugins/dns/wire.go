package dns

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	mdns "github.com/miekg/dns"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// errPrereq is the cause of an update whose prerequisites did not hold: the
// records changed between the plugin's read and its write.
var errPrereq = errors.New("berth: dns update prerequisites did not hold")

// client exchanges messages with the authoritative server.
type client struct {
	s settings
}

func (c client) dnsClient(signed bool) *mdns.Client {
	dc := &mdns.Client{Net: "tcp", Timeout: c.s.timeout}
	if signed {
		dc.TsigSecret = map[string]string{c.s.keyName: c.s.secret}
	}
	return dc
}

// exchange sends m (signed when signed) and classifies the outcome
// (docs/dns.md section 5): a transport failure or SERVFAIL is unavailable;
// NOTAUTH with a TSIG error, or REFUSED, is dns_auth_refused; NOTAUTH
// without one, or NOTZONE, is dns_zone_not_served; YXRRSET, NXRRSET,
// YXDOMAIN and NXDOMAIN of an update wrap errPrereq.
func (c client) exchange(ctx context.Context, what string, m *mdns.Msg, signed bool) (*mdns.Msg, error) {
	if signed {
		m.SetTsig(c.s.keyName, c.s.algorithm, 300, time.Now().Unix())
	}
	in, _, err := c.dnsClient(signed).ExchangeContext(ctx, m, c.s.server)
	if in == nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s: %w", what, ctxErr)
		}
		// Refused, reset or timed out: the server is down or unreachable.
		return nil, abierrors.Wrap(abierrors.Unavailable, what+": DNS server "+c.s.server+" did not answer", err)
	}
	tsigErr := uint16(0)
	if t := in.IsTsig(); t != nil {
		tsigErr = t.Error
	}
	switch in.Rcode {
	case mdns.RcodeSuccess:
		if err != nil && signed {
			// The answer's signature did not verify: someone else answered,
			// or the key is wrong on one side.
			return nil, abierrors.Wrap(abierrors.DNSAuthRefused, what+": the server's answer is not signed with the configured key", err)
		}
		return in, nil
	case mdns.RcodeNameError:
		if m.Opcode == mdns.OpcodeUpdate {
			return nil, fmt.Errorf("%s: %w (%s)", what, errPrereq, mdns.RcodeToString[in.Rcode])
		}
		return in, nil
	case mdns.RcodeYXRrset, mdns.RcodeNXRrset, mdns.RcodeYXDomain:
		return nil, fmt.Errorf("%s: %w (%s)", what, errPrereq, mdns.RcodeToString[in.Rcode])
	case mdns.RcodeRefused:
		if m.Opcode == mdns.OpcodeUpdate {
			return nil, abierrors.New(abierrors.DNSAuthRefused, what+": the server refused the update (REFUSED): check the TSIG key and the server's update policy")
		}
		return nil, abierrors.New(abierrors.DNSZoneNotServed, what+": the server refused the query (REFUSED): it does not serve this zone")
	case mdns.RcodeNotAuth:
		if tsigErr != 0 || (err != nil && signed) {
			return nil, abierrors.New(abierrors.DNSAuthRefused, fmt.Sprintf("%s: the server refused the TSIG key %s (NOTAUTH, %s)", what, c.s.keyName, tsigName(tsigErr)))
		}
		return nil, abierrors.New(abierrors.DNSZoneNotServed, what+": the server is not authoritative for the zone (NOTAUTH)")
	case mdns.RcodeNotZone:
		return nil, abierrors.New(abierrors.DNSZoneNotServed, what+": the name is not in the zone the server holds (NOTZONE)")
	case mdns.RcodeServerFailure:
		return nil, abierrors.New(abierrors.Unavailable, what+": the server failed (SERVFAIL)")
	}
	return nil, abierrors.New(abierrors.Internal, fmt.Sprintf("%s: the server answered %s", what, mdns.RcodeToString[in.Rcode]))
}

func tsigName(code uint16) string {
	switch code {
	case mdns.RcodeBadSig:
		return "BADSIG"
	case mdns.RcodeBadKey:
		return "BADKEY"
	case mdns.RcodeBadTime:
		return "BADTIME"
	case 0:
		return "no TSIG error"
	}
	return fmt.Sprintf("TSIG error %d", code)
}

// lookup returns the live RRset of name and type (empty when absent) as the
// authoritative server answers an unsigned TCP query.
func (c client) lookup(ctx context.Context, name string, rrtype uint16) ([]mdns.RR, error) {
	m := new(mdns.Msg)
	m.SetQuestion(name, rrtype)
	m.RecursionDesired = false
	in, err := c.exchange(ctx, "read "+strings.TrimSuffix(name, ".")+" "+mdns.TypeToString[rrtype], m, false)
	if err != nil {
		return nil, err
	}
	if in.Rcode == mdns.RcodeSuccess && !in.Authoritative {
		return nil, abierrors.New(abierrors.DNSZoneNotServed, "read "+name+": the server's answer is not authoritative: it does not serve this zone")
	}
	var out []mdns.RR
	for _, rr := range in.Answer {
		if rr.Header().Rrtype == rrtype && strings.EqualFold(rr.Header().Name, name) {
			out = append(out, rr)
		}
	}
	return out, nil
}

// update sends the signed update m of zone.
func (c client) update(ctx context.Context, what string, m *mdns.Msg) error {
	_, err := c.exchange(ctx, what, m, true)
	return err
}
