package session

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
)

// fakeDNS stands for core/dnsrecords.Records (tested against a real knot in its package): it
// records what it was asked to write, per node.
type fakeDNS struct {
	mu     sync.Mutex
	served func(fqdn string) bool
	held   map[string]bool // node \x00 fqdn \x00 value
}

var _ DNSChallenger = (*fakeDNS)(nil)

func (f *fakeDNS) Served(fqdn string) bool { return f.served(fqdn) }

func (f *fakeDNS) PresentNodeTXT(_ context.Context, nodeID, fqdn, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[nodeID+"\x00"+fqdn+"\x00"+value] = true
	return nil
}

func (f *fakeDNS) CleanupNodeTXT(_ context.Context, nodeID, fqdn, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, nodeID+"\x00"+fqdn+"\x00"+value)
	return nil
}

func (f *fakeDNS) holds(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[key]
}

// TestDNSChallengeOnlyForTheNodesOwnAcmeRoutes: a node may have the core set and clear
// _acme-challenge.<host> only for an acme route of its own desired state in a served zone; any
// other host, a plain route, a zone the provider does not write and a bad action are refused with
// a stable code and write nothing.
func TestDNSChallengeOnlyForTheNodesOwnAcmeRoutes(t *testing.T) {
	t.Parallel()
	dns := &fakeDNS{served: func(fqdn string) bool { return fqdn != "_acme-challenge.other.test." }, held: map[string]bool{}}
	f := newFixture(t, func(c *Config) { c.DNS = dns })
	ctx := context.Background()
	n, _ := f.reg.Get(ctx, f.node.ID)
	spec := `{"workloads":[],"routes":[` +
		`{"hostname":"blog.example.test","service_id":"svc_a","workload_ids":[],"tls_mode":"acme"},` +
		`{"hostname":"*.shop.example.test","service_id":"svc_b","workload_ids":[],"tls_mode":"acme"},` +
		`{"hostname":"plain.example.test","service_id":"svc_c","workload_ids":[],"tls_mode":"none"},` +
		`{"hostname":"other.test","service_id":"svc_d","workload_ids":[],"tls_mode":"acme"}],"network":{"address":"127.0.0.1"}}`
	if _, _, err := f.reg.SetDesired(ctx, n, "h1", spec); err != nil {
		t.Fatal(err)
	}
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	ask := func(ch node.DNSChallenge) node.DNSChallengeResult {
		t.Helper()
		p.send(1, node.TypeDNSChallenge, ch)
		for range 10 { // a log_entries delivery may come first
			env := p.next()
			if env.Type != node.TypeDNSChallengeResult {
				continue
			}
			if env.Re != "msg_test" {
				t.Fatalf("result re %q, want msg_test", env.Re)
			}
			var r node.DNSChallengeResult
			if err := json.Unmarshal(env.Body, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		t.Fatal("no dns_challenge_result")
		return node.DNSChallengeResult{}
	}
	mine := f.node.ID + "\x00_acme-challenge.blog.example.test.\x00tok1"
	if r := ask(node.DNSChallenge{Action: "set", Hostname: "Blog.Example.Test", Value: "tok1"}); !r.OK || r.RecordID == "" {
		t.Fatalf("set for an acme route: %+v", r)
	}
	if !dns.holds(mine) {
		t.Fatalf("the record was not written for the node: %v", dns.held)
	}
	if r := ask(node.DNSChallenge{Action: "set", Hostname: "*.shop.example.test", Value: "tok2"}); !r.OK || !dns.holds(f.node.ID+"\x00_acme-challenge.shop.example.test.\x00tok2") {
		t.Fatalf("set for a wildcard acme route: %+v %v", r, dns.held)
	}
	for _, tc := range []struct {
		ch   node.DNSChallenge
		code abierrors.Code
	}{
		{node.DNSChallenge{Action: "set", Hostname: "evil.example.test", Value: "x"}, abierrors.DNSChallengeHostUnknown},
		{node.DNSChallenge{Action: "set", Hostname: "plain.example.test", Value: "x"}, abierrors.DNSChallengeHostUnknown},
		{node.DNSChallenge{Action: "set", Hostname: "other.test", Value: "x"}, abierrors.DNSZoneNotServed},
		{node.DNSChallenge{Action: "delete", Hostname: "blog.example.test", Value: "x"}, abierrors.BadMessage},
		{node.DNSChallenge{Action: "set", Hostname: "blog.example.test", Value: ""}, abierrors.BadMessage},
	} {
		if r := ask(tc.ch); r.OK || r.Code != string(tc.code) {
			t.Errorf("%+v: got %+v, want refused %s", tc.ch, r, tc.code)
		}
	}
	if len(dns.held) != 2 {
		t.Errorf("refused challenges wrote records: %v", dns.held)
	}
	if r := ask(node.DNSChallenge{Action: "clear", Hostname: "blog.example.test", Value: "tok1"}); !r.OK || dns.holds(mine) {
		t.Fatalf("clear: %+v %v", r, dns.held)
	}
}
