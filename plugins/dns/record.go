// Package dns is the DNS provider plugin (docs/dns.md): records of type
// dns.record written to any authoritative server with RFC 2136 updates signed
// with TSIG, each beside an ownership record so that Berth never touches a
// record it did not create.
package dns

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	mdns "github.com/miekg/dns"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/provider"
)

// ResourceType is the one resource type the plugin manages (docs/dns.md
// section 2). A resource's id is "<zone>/<name>/<type>": the zone as
// configured (no trailing dot), the owner name relative to it ("@" for the
// apex, "www", "_acme-challenge.shop"), and one of [RecordTypes].
const ResourceType = "dns.record"

// RecordTypes are the record types the plugin writes.
var RecordTypes = []string{"A", "AAAA", "TXT", "CNAME"}

// Default and bounds of a record's TTL, in seconds.
const (
	DefaultTTL = 300
	MaxTTL     = 604800
)

// Attributes is a dns.record's state: the RRset's values and TTL. Values are
// canonical in a state: A and AAAA as net.IP prints them, CNAME fully
// qualified in lower case with the trailing dot, TXT verbatim (one string of
// at most 255 bytes each); sorted, without duplicates. A CNAME has exactly
// one value.
type Attributes struct {
	Values []string `json:"values"`
	TTL    uint32   `json:"ttl"` // seconds, 1..604800; 0 in a desired state means 300
}

// RecordID is a parsed resource id.
type RecordID struct {
	Zone string // lower case, no trailing dot, e.g. "example.com"
	Name string // relative to Zone, lower case; "@" for the apex
	Type string // "A", "AAAA", "TXT" or "CNAME"
}

// String is the resource id "<zone>/<name>/<type>".
func (r RecordID) String() string { return r.Zone + "/" + r.Name + "/" + r.Type }

// FQDN is the record's owner name, fully qualified with the trailing dot.
func (r RecordID) FQDN() string {
	if r.Name == "@" {
		return r.Zone + "."
	}
	return r.Name + "." + r.Zone + "."
}

// OwnerFQDN is the name of the ownership TXT record kept beside the record
// (docs/dns.md section 3): "_berth-owner." before the record's owner name.
func (r RecordID) OwnerFQDN() string { return OwnerLabel + "." + r.FQDN() }

// OwnerLabel is the first label of every ownership record's name.
const OwnerLabel = "_berth-owner"

// rrtype is the record type's wire number.
func (r RecordID) rrtype() uint16 { return mdns.StringToType[r.Type] }

// ParseRecordID parses "<zone>/<name>/<type>" (case-insensitive; the type is
// upper-cased, the rest lower-cased). It fails with validation_failed.
func ParseRecordID(id string) (RecordID, error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("record id %q is not <zone>/<name>/<type>", id))
	}
	r := RecordID{Zone: strings.TrimSuffix(strings.ToLower(parts[0]), "."), Name: strings.TrimSuffix(strings.ToLower(parts[1]), "."), Type: strings.ToUpper(parts[2])}
	if !slices.Contains(RecordTypes, r.Type) {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("record id %q: type %q is not one of %s", id, parts[2], strings.Join(RecordTypes, ", ")))
	}
	if _, ok := mdns.IsDomainName(r.Zone); !ok || r.Zone == "" {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("record id %q: zone %q is not a domain name", id, parts[0]))
	}
	if r.Name == "" || (r.Name != "@" && !validRelative(r.Name)) {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("record id %q: name %q is not a relative domain name (\"@\" for the apex)", id, parts[1]))
	}
	if r.Name != "@" && (r.Name == OwnerLabel || strings.HasPrefix(r.Name, OwnerLabel+".")) {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("record id %q: names under %s are the plugin's ownership records", id, OwnerLabel))
	}
	return r, nil
}

func validRelative(name string) bool {
	if _, ok := mdns.IsDomainName(name); !ok {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" {
			return false
		}
	}
	return true
}

// canonicalAttrs decodes and checks a dns.record's attributes for id and
// returns them in canonical form. It fails with validation_failed.
func canonicalAttrs(id RecordID, raw json.RawMessage) (Attributes, error) {
	var a Attributes
	dec := json.NewDecoder(bytes.NewReader(orEmpty(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return Attributes{}, abierrors.Wrap(abierrors.ValidationFailed, "dns.record attributes do not decode", err)
	}
	if a.TTL == 0 {
		a.TTL = DefaultTTL
	}
	if a.TTL > MaxTTL {
		return Attributes{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: ttl %d is over %d s", id, a.TTL, MaxTTL))
	}
	if len(a.Values) == 0 {
		return Attributes{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: no values (delete the record instead)", id))
	}
	vals := make([]string, 0, len(a.Values))
	for _, v := range a.Values {
		c, err := canonicalValue(id.Type, v)
		if err != nil {
			return Attributes{}, abierrors.Wrap(abierrors.ValidationFailed, id.String(), err)
		}
		vals = append(vals, c)
	}
	slices.Sort(vals)
	a.Values = slices.Compact(vals)
	if id.Type == "CNAME" && len(a.Values) != 1 {
		return Attributes{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: a CNAME has exactly one value, not %d", id, len(a.Values)))
	}
	return a, nil
}

func canonicalValue(typ, v string) (string, error) {
	switch typ {
	case "A":
		ip := net.ParseIP(v)
		if ip == nil || ip.To4() == nil {
			return "", fmt.Errorf("value %q is not an IPv4 address", v)
		}
		return ip.To4().String(), nil
	case "AAAA":
		ip := net.ParseIP(v)
		if ip == nil || ip.To4() != nil {
			return "", fmt.Errorf("value %q is not an IPv6 address", v)
		}
		return ip.String(), nil
	case "CNAME":
		n := mdns.Fqdn(strings.ToLower(v))
		if _, ok := mdns.IsDomainName(n); !ok || n == "." {
			return "", fmt.Errorf("value %q is not a domain name", v)
		}
		return n, nil
	case "TXT":
		if len(v) > 255 {
			return "", fmt.Errorf("a TXT value of %d bytes is over 255", len(v))
		}
		return v, nil
	}
	return "", fmt.Errorf("type %q is not supported", typ)
}

// encode is a's canonical JSON.
func (a Attributes) encode() json.RawMessage {
	raw, _ := json.Marshal(a) // strings and a number: cannot fail
	return raw
}

// rrs returns a's values as resource records of id.
func (a Attributes) rrs(id RecordID) []mdns.RR {
	out := make([]mdns.RR, 0, len(a.Values))
	h := mdns.RR_Header{Name: id.FQDN(), Rrtype: id.rrtype(), Class: mdns.ClassINET, Ttl: a.TTL}
	for _, v := range a.Values {
		switch id.Type {
		case "A":
			out = append(out, &mdns.A{Hdr: h, A: net.ParseIP(v).To4()})
		case "AAAA":
			out = append(out, &mdns.AAAA{Hdr: h, AAAA: net.ParseIP(v)})
		case "CNAME":
			out = append(out, &mdns.CNAME{Hdr: h, Target: v})
		case "TXT":
			out = append(out, &mdns.TXT{Hdr: h, Txt: []string{v}})
		}
	}
	return out
}

// attrsOf returns the canonical attributes of a live RRset (nil when empty).
func attrsOf(id RecordID, rrs []mdns.RR) *Attributes {
	if len(rrs) == 0 {
		return nil
	}
	a := &Attributes{TTL: rrs[0].Header().Ttl}
	for _, rr := range rrs {
		var v string
		switch x := rr.(type) {
		case *mdns.A:
			v = x.A.String()
		case *mdns.AAAA:
			v = x.AAAA.String()
		case *mdns.CNAME:
			v = strings.ToLower(x.Target)
		case *mdns.TXT:
			v = strings.Join(x.Txt, "")
		default:
			continue
		}
		a.Values = append(a.Values, v)
	}
	slices.Sort(a.Values)
	a.Values = slices.Compact(a.Values)
	return a
}

// resource is the provider resource of id with attributes a.
func resource(id RecordID, a Attributes) provider.Resource {
	return provider.Resource{Type: ResourceType, ID: id.String(), Attributes: a.encode()}
}

func orEmpty(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

// ownership is what one ownership string says (docs/dns.md section 3).
type ownership struct {
	Owner   string
	Type    string
	Fence   uint64 // the highest fencing token that wrote or deleted the record
	Deleted bool   // the record was deleted under Fence: a tombstone
}

// String is the TXT string "berth-owner=<owner>;type=<TYPE>;fence=<n>", with ";deleted" on a
// tombstone.
func (o ownership) String() string {
	s := "berth-owner=" + o.Owner + ";type=" + o.Type + ";fence=" + strconv.FormatUint(o.Fence, 10)
	if o.Deleted {
		s += ";deleted"
	}
	return s
}

// parseOwnership parses an ownership TXT string; ok is false for a string that is not one.
func parseOwnership(s string) (o ownership, ok bool) {
	rest, found := strings.CutPrefix(s, "berth-owner=")
	if !found {
		return ownership{}, false
	}
	parts := strings.Split(rest, ";")
	if len(parts) < 3 || parts[0] == "" {
		return ownership{}, false
	}
	o.Owner = parts[0]
	typ, ok1 := strings.CutPrefix(parts[1], "type=")
	fence, ok2 := strings.CutPrefix(parts[2], "fence=")
	n, err := strconv.ParseUint(fence, 10, 64)
	if !ok1 || !ok2 || typ == "" || err != nil {
		return ownership{}, false
	}
	o.Type, o.Fence = typ, n
	o.Deleted = len(parts) > 3 && parts[3] == "deleted"
	return o, true
}
