package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// Plugin is the DNS provider (docs/dns.md): it manages resources of type
// [ResourceType] on the one authoritative server of its configuration.
//
// Every write is one RFC 2136 update signed with TSIG that changes the
// record's RRset and its ownership record together (an update is atomic on
// the server), with prerequisites that make it a compare-and-set against
// what the plugin read: a record whose ownership record names another owner,
// or a record that exists without one, is never written or deleted
// (dns_record_not_owned). Apply and Delete are fenced and idempotent through
// sdk/guard, durably when the plugin has a state directory. Safe for
// concurrent use.
type Plugin struct {
	guards   *guard.Guards
	stateDir string
	log      *slog.Logger

	mu  sync.Mutex
	cfg *settings // nil until Configure; mu must be held
}

var _ provider.Provider = (*Plugin)(nil)
var _ provider.Configurer = (*Plugin)(nil)

// idempotencyKeep is how long the records of applied mutations are kept.
const idempotencyKeep = 24 * time.Hour

// maxPrereqRetries bounds the read-then-write rounds of one Apply or Delete
// when the records change in between.
const maxPrereqRetries = 3

// Open returns the plugin with its fencing and idempotency records under
// stateDir (created 0700); an empty stateDir keeps them in memory. log
// receives one line per write (never the secret); nil discards.
func Open(stateDir string, log *slog.Logger) (*Plugin, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g, err := guard.OpenPruned(stateDir, idempotencyKeep)
	if err != nil {
		return nil, fmt.Errorf("dns state directory: %w", err)
	}
	return &Plugin{guards: g, stateDir: stateDir, log: log}, nil
}

// Describe implements provider.Provider: name "dns", one resource type with
// the record types as variants.
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:        "dns",
		Version:     version.Version,
		APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			// The records live on the DNS server; with a state directory the
			// fencing and idempotency records survive a restart too.
			DurableState:  p.stateDir != "",
			ResourceTypes: []provider.ResourceType{{Name: ResourceType, Variants: slices.Clone(RecordTypes)}},
		},
	}, nil
}

// ValidateConfig implements provider.Provider (the fields of [Config]). No
// problem quotes the TSIG secret.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	_, problems := parseConfig(req.Config)
	return &provider.ValidateConfigResponse{Problems: problems}, nil
}

// Configure implements provider.Configurer: a configuration with problems is
// refused with validation_failed.
func (p *Plugin) Configure(_ context.Context, req *provider.ConfigRequest) error {
	s, problems := parseConfig(req.Config)
	if len(problems) > 0 {
		return abierrors.New(abierrors.ValidationFailed, "dns configuration: "+strings.Join(problems, "; "))
	}
	p.mu.Lock()
	p.cfg = &s
	p.mu.Unlock()
	p.log.Info("dns provider configured", "server", s.server, "zones", s.zones, "key", s.keyName, "owner", s.owner)
	return nil
}

// settings returns the configuration, or unavailable before Configure.
func (p *Plugin) settings() (settings, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg == nil {
		return settings{}, abierrors.New(abierrors.Unavailable, "the dns provider is not configured yet")
	}
	return *p.cfg, nil
}

// parse checks a resource's type and id against the configuration.
func parse(s settings, typ, id string) (RecordID, error) {
	if typ != ResourceType {
		return RecordID{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("the dns provider manages %s, not %s", ResourceType, typ))
	}
	rid, err := ParseRecordID(id)
	if err != nil {
		return RecordID{}, err
	}
	if !s.servesZone(rid.Zone) {
		return RecordID{}, abierrors.New(abierrors.DNSZoneNotServed, fmt.Sprintf("%s: zone %s is not one of the configured zones %v", id, rid.Zone, s.zones))
	}
	return rid, nil
}

// live is what the server holds for one record: its RRset and who owns it.
type live struct {
	attrs      *Attributes // nil when the RRset is absent
	ownerRR    *mdns.TXT   // our ownership record of this type (maybe a tombstone), nil when absent
	owner      ownership   // what ownerRR says
	otherOwner string      // another owner's name for this type, "" when none
	ownerSet   []mdns.RR   // the whole ownership RRset as read (every type's strings)
}

// owned reports whether the plugin may change the record: it holds the
// ownership record, or nobody does and the RRset is absent.
func (l live) owned() bool {
	return l.otherOwner == "" && (l.ownerRR != nil || l.attrs == nil)
}

func (p *Plugin) readLive(ctx context.Context, s settings, id RecordID) (live, error) {
	c := client{s: s}
	rrs, err := c.lookup(ctx, id.FQDN(), id.rrtype())
	if err != nil {
		return live{}, err
	}
	owners, err := c.lookup(ctx, id.OwnerFQDN(), mdns.TypeTXT)
	if err != nil {
		return live{}, err
	}
	l := live{attrs: attrsOf(id, rrs), ownerSet: owners}
	for _, rr := range owners {
		txt := rr.(*mdns.TXT)
		o, ok := parseOwnership(strings.Join(txt.Txt, ""))
		if !ok || o.Type != id.Type {
			continue
		}
		if o.Owner == s.owner {
			l.ownerRR, l.owner = txt, o
		} else {
			l.otherOwner = o.Owner
		}
	}
	return l, nil
}

func notOwned(id RecordID, l live) error {
	if l.otherOwner != "" {
		return abierrors.New(abierrors.DNSRecordNotOwned, fmt.Sprintf("%s: the record belongs to %q (its ownership record %s says so); nothing changed", id, l.otherOwner, strings.TrimSuffix(id.OwnerFQDN(), ".")))
	}
	return abierrors.New(abierrors.DNSRecordNotOwned, fmt.Sprintf("%s: the record exists and Berth did not create it (no ownership record %s); nothing changed", id, strings.TrimSuffix(id.OwnerFQDN(), ".")))
}

// Plan implements provider.Provider: the planned state is the desired one in
// canonical form. It reads the live RRset: Changes is true when it or
// Current differs from the plan, and a record another owner holds is refused
// dns_record_not_owned. The difference is logged (values added and removed).
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	s, err := p.settings()
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	id, err := parse(s, req.Desired.Type, req.Desired.ID)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	want, err := canonicalAttrs(id, req.Desired.Attributes)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	l, err := p.readLive(ctx, s, id)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", id, err)
	}
	if !l.owned() {
		return nil, fmt.Errorf("plan: %w", notOwned(id, l))
	}
	planned := resource(id, want)
	d := Diff(l.attrs, want)
	if !d.Empty() {
		p.log.Info("dns plan", "record", id.String(), "add", d.Add, "remove", d.Remove, "ttl_from", d.TTLFrom, "ttl_to", d.TTLTo)
	}
	return &provider.PlanResponse{Planned: planned, Changes: !d.Empty() || req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Change is what writing a record changes on the server: values added and
// removed, and the TTL before and after (equal when unchanged).
type Change struct {
	Add, Remove    []string
	TTLFrom, TTLTo uint32
}

// Empty reports whether the change changes nothing.
func (c Change) Empty() bool {
	return len(c.Add) == 0 && len(c.Remove) == 0 && c.TTLFrom == c.TTLTo
}

// Diff is the change from the live attributes (nil: absent) to want.
func Diff(cur *Attributes, want Attributes) Change {
	c := Change{TTLTo: want.TTL, TTLFrom: want.TTL}
	var have []string
	if cur != nil {
		have, c.TTLFrom = cur.Values, cur.TTL
	} else {
		c.TTLFrom = 0
	}
	for _, v := range want.Values {
		if !slices.Contains(have, v) {
			c.Add = append(c.Add, v)
		}
	}
	for _, v := range have {
		if !slices.Contains(want.Values, v) {
			c.Remove = append(c.Remove, v)
		}
	}
	return c
}

// Apply implements provider.Provider: one signed update replaces the RRset
// with the planned values and adds the ownership record when it is missing,
// under prerequisites that the RRset is still absent (a new record) or that
// our ownership record is still there (an owned one); when they fail, the
// record is read again (at most 3 rounds). Fenced and idempotent.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	s, err := p.settings()
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	id, err := parse(s, req.Planned.Type, req.Planned.ID)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	want, err := canonicalAttrs(id, req.Planned.Attributes)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	return guard.Mutate(ctx, p.guards, ResourceType+"/"+id.String(), req.Mutation, req, func() (*provider.ApplyResponse, error) {
		if err := p.write(ctx, s, id, &want, req.FencingToken); err != nil {
			return nil, fmt.Errorf("apply %s: %w", id, err)
		}
		if s := p.stateDirPrune(); s != nil {
			return nil, fmt.Errorf("apply %s: %w", id, s)
		}
		return &provider.ApplyResponse{State: resource(id, want)}, nil
	})
}

// Read implements provider.Provider: the live RRset's values and TTL, or
// ErrNotFound when the server holds none.
func (p *Plugin) Read(ctx context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	s, err := p.settings()
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	id, err := parse(s, req.Type, req.ID)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	rrs, err := client{s: s}.lookup(ctx, id.FQDN(), id.rrtype())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", id, err)
	}
	a := attrsOf(id, rrs)
	if a == nil {
		return nil, fmt.Errorf("read %s: %w", id, provider.ErrNotFound)
	}
	return &provider.ReadResponse{State: resource(id, *a)}, nil
}

// Delete implements provider.Provider: one signed update removes the RRset
// and our ownership record, under the prerequisite that the ownership record
// is still there. An absent record is success; a record Berth does not own
// is refused dns_record_not_owned. Fenced and idempotent.
func (p *Plugin) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	s, err := p.settings()
	if err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	id, err := parse(s, req.Type, req.ID)
	if err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	return guard.Mutate(ctx, p.guards, ResourceType+"/"+id.String(), req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if err := p.write(ctx, s, id, nil, req.FencingToken); err != nil {
			return nil, fmt.Errorf("delete %s: %w", id, err)
		}
		if s := p.stateDirPrune(); s != nil {
			return nil, fmt.Errorf("delete %s: %w", id, s)
		}
		return &provider.DeleteResponse{}, nil
	})
}

func (p *Plugin) stateDirPrune() error {
	if p.stateDir == "" {
		return nil
	}
	_, err := p.guards.Idempotency.Prune(time.Now().Add(-idempotencyKeep))
	return err
}

// write makes the server hold want for id (nil: nothing) under fencing
// token token, in one update per round, re-reading when the prerequisites
// fail (docs/dns.md section 3):
//
//   - a record whose ownership record carries a higher fence than token is
//     refused stale_fencing_token, whichever plugin process wrote it;
//   - a new record requires that its RRset still does not exist, and writes
//     it with its ownership record;
//   - a change or delete of an owned record requires that our ownership
//     record is still exactly as read, and replaces it with one carrying
//     token; a delete leaves it as a tombstone (";deleted"), so that a late
//     write under an older token cannot bring the record back.
func (p *Plugin) write(ctx context.Context, s settings, id RecordID, want *Attributes, token uint64) error {
	var lastErr error
	for range maxPrereqRetries {
		l, err := p.readLive(ctx, s, id)
		if err != nil {
			return err
		}
		if !l.owned() {
			return notOwned(id, l)
		}
		if l.ownerRR != nil && l.owner.Fence > token {
			return abierrors.New(abierrors.StaleFencingToken, fmt.Sprintf("%s: fencing token %d is lower than %d, recorded on the server by an earlier write", id, token, l.owner.Fence))
		}
		ttl := uint32(DefaultTTL)
		if want != nil {
			ttl = want.TTL
		}
		next := &mdns.TXT{Hdr: mdns.RR_Header{Name: id.OwnerFQDN(), Rrtype: mdns.TypeTXT, Class: mdns.ClassINET, Ttl: ttl},
			Txt: []string{ownership{Owner: s.owner, Type: id.Type, Fence: token, Deleted: want == nil}.String()}}
		anyRR := &mdns.ANY{Hdr: mdns.RR_Header{Name: id.FQDN(), Rrtype: id.rrtype(), Class: mdns.ClassINET}}
		m := new(mdns.Msg)
		m.SetUpdate(id.Zone + ".")
		switch {
		case want == nil && l.ownerRR == nil:
			return nil // absent and never ours: nothing to do
		case want == nil && l.attrs == nil && l.owner.Deleted && l.owner.Fence == token:
			return nil // deleted already under this token
		case l.ownerRR == nil:
			// A new record: nobody may have created it since the read.
			m.RRsetNotUsed([]mdns.RR{anyRR})
			m.Insert([]mdns.RR{next})
			m.Insert(want.rrs(id))
		default:
			if want != nil && l.attrs != nil && !l.owner.Deleted && l.owner.Fence == token && Diff(l.attrs, *want).Empty() {
				return nil // already as wanted under this token
			}
			// A value-dependent prerequisite must name the whole RRset
			// (RFC 2136 section 3.2.3), so every type's ownership string is
			// in it. Each section takes its own copy: Used and Remove
			// rewrite the header they are given.
			prereq := make([]mdns.RR, 0, len(l.ownerSet))
			for _, rr := range l.ownerSet {
				prereq = append(prereq, mdns.Copy(rr))
			}
			m.Used(prereq)
			m.Remove([]mdns.RR{mdns.Copy(l.ownerRR)})
			m.RemoveRRset([]mdns.RR{anyRR})
			m.Insert([]mdns.RR{next})
			if want != nil {
				m.Insert(want.rrs(id))
			}
		}
		err = client{s: s}.update(ctx, "write "+id.String(), m)
		if errors.Is(err, errPrereq) {
			lastErr = err
			continue
		}
		if err != nil {
			return err
		}
		if want == nil {
			p.log.Info("dns record deleted", "record", id.String(), "fence", token)
			return nil
		}
		// A server may skip parts of an update it cannot apply (a CNAME
		// beside other data): check that it holds what was written.
		after, err := client{s: s}.lookup(ctx, id.FQDN(), id.rrtype())
		if err != nil {
			return err
		}
		if a := attrsOf(id, after); a == nil || !Diff(a, *want).Empty() {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("the server took the update but does not hold the values written (a CNAME beside other records at %s?)", strings.TrimSuffix(id.FQDN(), ".")))
		}
		p.log.Info("dns record written", "record", id.String(), "values", want.Values, "ttl", want.TTL, "fence", token)
		return nil
	}
	return abierrors.Wrap(abierrors.Conflict, fmt.Sprintf("the records of %s kept changing under the update", id), lastErr)
}
