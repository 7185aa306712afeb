package dns_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/plugins/dns"
	"github.com/berthhq/berth/sdk/provider"
)

// knot is the one knotd of this package, serving zones example.test and
// second.test; started in TestMain.
var knot *knottest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	bin, err := knottest.Find()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "knottest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	knot, err = knottest.Run(bin, dir, "example.test", "second.test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer knot.Stop()
	return m.Run()
}

// config is a plugin configuration for the package's knotd; change edits it.
func config(change func(*dns.Config)) json.RawMessage {
	c := dns.Config{
		Server: knot.Addr, Zones: []string{"example.test", "second.test", "unserved.test"},
		TSIGKeyName: knot.Key.Name, TSIGAlgorithm: knot.Key.Algorithm, TSIGSecret: knot.Key.Secret,
	}
	if change != nil {
		change(&c)
	}
	raw, _ := json.Marshal(c)
	return raw
}

// open returns a configured plugin on a fresh state directory.
func open(t *testing.T, cfg json.RawMessage) *dns.Plugin {
	t.Helper()
	p, err := dns.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Configure(t.Context(), &provider.ConfigRequest{Config: cfg, APIVersion: provider.APIVersion}); err != nil {
		t.Fatal(err)
	}
	return p
}

func record(id string, ttl uint32, values ...string) provider.Resource {
	raw, _ := json.Marshal(dns.Attributes{Values: values, TTL: ttl})
	return provider.Resource{Type: dns.ResourceType, ID: id, Attributes: raw}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// apply plans and applies r with a fresh key and token.
func apply(t *testing.T, p *dns.Plugin, r provider.Resource, token uint64) (provider.Resource, error) {
	t.Helper()
	plan, err := p.Plan(ctx(t), &provider.PlanRequest{Desired: r})
	if err != nil {
		return provider.Resource{}, err
	}
	out, err := p.Apply(ctx(t), &provider.ApplyRequest{Planned: plan.Planned, Mutation: provider.Mutation{IdempotencyKey: fmt.Sprintf("k-%d-%s", token, r.Attributes), FencingToken: token}})
	if err != nil {
		return provider.Resource{}, err
	}
	return out.State, nil
}

// values is the live RRset of name and type on knot, as sorted strings.
func values(t *testing.T, name string, rrtype uint16) []string {
	t.Helper()
	rrs, err := knot.Lookup(name, rrtype)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rr := range rrs {
		switch x := rr.(type) {
		case *mdns.A:
			out = append(out, x.A.String())
		case *mdns.AAAA:
			out = append(out, x.AAAA.String())
		case *mdns.TXT:
			out = append(out, strings.Join(x.Txt, ""))
		case *mdns.CNAME:
			out = append(out, x.Target)
		}
	}
	slices.Sort(out)
	return out
}

// foreign writes rr on knot as an operator would, with no ownership record.
func foreign(t *testing.T, rr string) {
	t.Helper()
	r, err := mdns.NewRR(rr)
	if err != nil {
		t.Fatal(err)
	}
	m := new(mdns.Msg)
	m.SetUpdate("example.test.")
	m.Insert([]mdns.RR{r})
	m.SetTsig(knot.Key.Name, mdns.HmacSHA256, 300, time.Now().Unix())
	c := &mdns.Client{Net: "tcp", Timeout: 5 * time.Second, TsigSecret: map[string]string{knot.Key.Name: knot.Key.Secret}}
	in, _, err := c.Exchange(m, knot.Addr)
	if err != nil || in.Rcode != mdns.RcodeSuccess {
		t.Fatalf("foreign update %s: %v %v", rr, err, in)
	}
}

func wantCode(t *testing.T, what string, err error, code abierrors.Code) {
	t.Helper()
	if !errors.Is(err, abierrors.New(code, "")) {
		t.Errorf("%s: got %v, want code %s", what, err, code)
	}
}

// TestConformance runs the provider suite on the plugin in process and as
// the built binary. The records and their fences live on the server, so
// every case (each with a fresh state directory) gets a fresh knotd on the
// same address and key; a relaunch on the same directory keeps it.
func TestConformance(t *testing.T) {
	k := knottest.Start(t, "example.test")
	cfg, _ := json.Marshal(dns.Config{Server: k.Addr, Zones: []string{"example.test"}, TSIGKeyName: k.Key.Name, TSIGSecret: k.Key.Secret})
	last := ""
	fresh := func(dir string) {
		if dir == last {
			return
		}
		last = dir
		if err := k.Reset(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("in-process", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Factory:      func(dir string) (provider.Provider, error) { fresh(dir); return dns.Open(dir, nil) },
			PluginConfig: cfg,
			Samples:      [2]provider.Resource{record("example.test/conf-a/TXT", 60, "one"), record("example.test/conf-a/TXT", 120, "one", "two")},
		})
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-dns")
		if os.Getenv("BERTH_BIN_DIR") == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-dns")
		}
		conformance.RunProvider(t, conformance.ProviderConfig{
			Binary:       bin,
			Args:         func(dir string) []string { fresh(dir); return []string{"--state-dir", dir} },
			PluginConfig: cfg,
			Samples:      [2]provider.Resource{record("example.test/conf-b/A", 60, "192.0.2.1"), record("example.test/conf-b/A", 60, "192.0.2.1", "192.0.2.2")},
		})
	})
}

// TestApplyWritesTheRecordAndItsOwner: Apply writes the values and the
// ownership record, Plan over the live RRset sees a change made behind the
// plugin's back, and Delete removes both.
func TestApplyWritesTheRecordAndItsOwner(t *testing.T) {
	p := open(t, config(nil))
	st, err := apply(t, p, record("example.test/www/A", 0, "192.0.2.20", "192.0.2.10", "192.0.2.10"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"values":["192.0.2.10","192.0.2.20"],"ttl":300}`; string(st.Attributes) != want {
		t.Errorf("state %s, want %s", st.Attributes, want)
	}
	// A second type at the same name: its ownership string joins the same
	// TXT RRset, and later writes of either type must name both in their
	// prerequisites.
	if _, err := apply(t, p, record("example.test/www/AAAA", 0, "2001:db8::10"), 1); err != nil {
		t.Fatal(err)
	}
	if got := values(t, "www.example.test", mdns.TypeA); !slices.Equal(got, []string{"192.0.2.10", "192.0.2.20"}) {
		t.Errorf("A www.example.test = %v", got)
	}
	if got := values(t, "_berth-owner.www.example.test", mdns.TypeTXT); !slices.Equal(got, []string{"berth-owner=berth;type=A;fence=1", "berth-owner=berth;type=AAAA;fence=1"}) {
		t.Errorf("ownership record = %v", got)
	}
	// Unchanged: no changes. Changed on the server: changes.
	plan, err := p.Plan(ctx(t), &provider.PlanRequest{Desired: record("example.test/www/A", 300, "192.0.2.10", "192.0.2.20"), Current: &st})
	if err != nil || plan.Changes {
		t.Fatalf("plan over the applied state: %v changes=%v", err, plan != nil && plan.Changes)
	}
	foreign(t, "www.example.test. 300 IN A 192.0.2.99")
	plan, err = p.Plan(ctx(t), &provider.PlanRequest{Desired: record("example.test/www/A", 300, "192.0.2.10", "192.0.2.20"), Current: &st})
	if err != nil || !plan.Changes {
		t.Fatalf("plan after a value was added on the server: %v changes=%v, want changes", err, plan != nil && plan.Changes)
	}
	if _, err := apply(t, p, record("example.test/www/A", 300, "192.0.2.10", "192.0.2.20"), 2); err != nil {
		t.Fatal(err)
	}
	if got := values(t, "www.example.test", mdns.TypeA); !slices.Equal(got, []string{"192.0.2.10", "192.0.2.20"}) {
		t.Errorf("A www.example.test after the repair = %v", got)
	}
	if _, err := p.Delete(ctx(t), &provider.DeleteRequest{Type: dns.ResourceType, ID: "example.test/www/A", Mutation: provider.Mutation{IdempotencyKey: "del", FencingToken: 3}}); err != nil {
		t.Fatal(err)
	}
	if got := values(t, "www.example.test", mdns.TypeA); len(got) != 0 {
		t.Errorf("A www.example.test after Delete = %v", got)
	}
	if got := values(t, "_berth-owner.www.example.test", mdns.TypeTXT); !slices.Equal(got, []string{"berth-owner=berth;type=A;fence=3;deleted", "berth-owner=berth;type=AAAA;fence=1"}) {
		t.Errorf("ownership record after Delete = %v, want the tombstone", got)
	}
	if _, err := p.Read(ctx(t), &provider.ReadRequest{Type: dns.ResourceType, ID: "example.test/www/A"}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Read after Delete: %v, want not_found", err)
	}
	// A late write under an older token, from another plugin process (its
	// own fencing records are empty), cannot bring the record back.
	late := open(t, config(nil))
	if _, err := apply(t, late, record("example.test/www/A", 300, "192.0.2.66"), 2); !errors.Is(err, abierrors.New(abierrors.StaleFencingToken, "")) {
		t.Errorf("a late write under token 2 after a delete under 3: %v, want stale_fencing_token", err)
	}
	if got := values(t, "www.example.test", mdns.TypeA); len(got) != 0 {
		t.Errorf("A www.example.test after the late write = %v", got)
	}
	if _, err := apply(t, late, record("example.test/www/A", 300, "192.0.2.67"), 4); err != nil {
		t.Errorf("a write under a newer token after the delete: %v", err)
	}
}

// TestNeverTouchesRecordsItDidNotWrite: a record an operator made, and one
// another Berth owns, are refused dns_record_not_owned by Plan, Apply and
// Delete, and stay as they were.
func TestNeverTouchesRecordsItDidNotWrite(t *testing.T) {
	p := open(t, config(nil))
	foreign(t, "mail.example.test. 300 IN A 192.0.2.50")
	_, err := apply(t, p, record("example.test/mail/A", 0, "192.0.2.1"), 1)
	wantCode(t, "apply over an operator's record", err, abierrors.DNSRecordNotOwned)
	_, err = p.Apply(ctx(t), &provider.ApplyRequest{Planned: record("example.test/mail/A", 300, "192.0.2.1"), Mutation: provider.Mutation{IdempotencyKey: "x", FencingToken: 2}})
	wantCode(t, "apply (no plan) over an operator's record", err, abierrors.DNSRecordNotOwned)
	_, err = p.Delete(ctx(t), &provider.DeleteRequest{Type: dns.ResourceType, ID: "example.test/mail/A", Mutation: provider.Mutation{IdempotencyKey: "y", FencingToken: 3}})
	wantCode(t, "delete of an operator's record", err, abierrors.DNSRecordNotOwned)
	if got := values(t, "mail.example.test", mdns.TypeA); !slices.Equal(got, []string{"192.0.2.50"}) {
		t.Errorf("the operator's record is now %v", got)
	}

	other := open(t, config(func(c *dns.Config) { c.Owner = "other-berth" }))
	if _, err := apply(t, other, record("example.test/shared/TXT", 0, "theirs"), 1); err != nil {
		t.Fatal(err)
	}
	_, err = apply(t, p, record("example.test/shared/TXT", 0, "mine"), 1)
	wantCode(t, "apply over another owner's record", err, abierrors.DNSRecordNotOwned)
	_, err = p.Delete(ctx(t), &provider.DeleteRequest{Type: dns.ResourceType, ID: "example.test/shared/TXT", Mutation: provider.Mutation{IdempotencyKey: "z", FencingToken: 2}})
	wantCode(t, "delete of another owner's record", err, abierrors.DNSRecordNotOwned)
	if got := values(t, "shared.example.test", mdns.TypeTXT); !slices.Equal(got, []string{"theirs"}) {
		t.Errorf("the other owner's record is now %v", got)
	}
	// The same name with another type is free.
	if _, err := apply(t, p, record("example.test/shared/A", 0, "192.0.2.7"), 1); err != nil {
		t.Errorf("apply of another type at a name another owner uses: %v", err)
	}
}

// TestRefusalsHaveStableCodes: a key the server refuses, a zone it does not
// serve or the plugin is not configured for, a server that is down, and bad
// input, each with its code and nothing written.
func TestRefusalsHaveStableCodes(t *testing.T) {
	other, err := knottest.NewKey(knottest.KeyName)
	if err != nil {
		t.Fatal(err)
	}
	wrongKey := open(t, config(func(c *dns.Config) { c.TSIGSecret = other.Secret }))
	_, err = wrongKey.Apply(ctx(t), &provider.ApplyRequest{Planned: record("example.test/badkey/A", 300, "192.0.2.1"), Mutation: provider.Mutation{FencingToken: 1}})
	wantCode(t, "apply with a secret the server does not know", err, abierrors.DNSAuthRefused)
	unknownKey := open(t, config(func(c *dns.Config) { c.TSIGKeyName = "nobody." }))
	_, err = unknownKey.Apply(ctx(t), &provider.ApplyRequest{Planned: record("example.test/badkey/A", 300, "192.0.2.1"), Mutation: provider.Mutation{FencingToken: 1}})
	wantCode(t, "apply with a key name the server does not know", err, abierrors.DNSAuthRefused)
	if got := values(t, "badkey.example.test", mdns.TypeA); len(got) != 0 {
		t.Errorf("a refused key wrote %v", got)
	}

	p := open(t, config(nil))
	_, err = p.Apply(ctx(t), &provider.ApplyRequest{Planned: record("unserved.test/www/A", 300, "192.0.2.1"), Mutation: provider.Mutation{FencingToken: 1}})
	wantCode(t, "apply in a zone the server does not serve", err, abierrors.DNSZoneNotServed)
	_, err = p.Plan(ctx(t), &provider.PlanRequest{Desired: record("elsewhere.test/www/A", 300, "192.0.2.1")})
	wantCode(t, "plan in a zone not configured", err, abierrors.DNSZoneNotServed)

	down := open(t, config(func(c *dns.Config) { c.Server = proctest.FreeAddr(t); c.TimeoutMS = 1000 }))
	_, err = down.Apply(ctx(t), &provider.ApplyRequest{Planned: record("example.test/down/A", 300, "192.0.2.1"), Mutation: provider.Mutation{FencingToken: 1}})
	wantCode(t, "apply with the server down", err, abierrors.Unavailable)

	for _, bad := range []provider.Resource{
		record("example.test/www/MX", 300, "10 mail"),
		record("example.test/www/A", 300, "2001:db8::1"),
		record("example.test/www/AAAA", 300, "192.0.2.1"),
		record("example.test/www/CNAME", 300, "a.test", "b.test"),
		record("example.test/www/A", 300),
		record("example.test/www/TXT", 300, strings.Repeat("x", 256)),
		record("example.test/_berth-owner.www/TXT", 300, "forged"),
		record("example.test/www", 300, "192.0.2.1"),
		{Type: dns.ResourceType, ID: "example.test/www/A", Attributes: json.RawMessage(`{"values":["192.0.2.1"],"ttl":300,"x":1}`)},
	} {
		_, err := p.Plan(ctx(t), &provider.PlanRequest{Desired: bad})
		wantCode(t, "plan "+bad.ID+" "+string(bad.Attributes), err, abierrors.ValidationFailed)
	}

	v, err := p.ValidateConfig(ctx(t), &provider.ConfigRequest{Config: config(func(c *dns.Config) { c.TSIGSecret = "not base64 !" })})
	if err != nil || len(v.Problems) == 0 {
		t.Errorf("a secret that is not base64: %v %v", err, v)
	}
	for _, pr := range v.Problems {
		if strings.Contains(pr, "not base64 !") {
			t.Errorf("a problem quotes the secret: %q", pr)
		}
	}
}

// TestSecretFromFile: the secret may come from a 0600 file; a file others
// can read is refused.
func TestSecretFromFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tsig.secret")
	if err := os.WriteFile(path, []byte(knot.Key.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := open(t, config(func(c *dns.Config) { c.TSIGSecret = ""; c.TSIGSecretFile = path }))
	if _, err := apply(t, p, record("second.test/fromfile/TXT", 0, "ok"), 1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := p.ValidateConfig(ctx(t), &provider.ConfigRequest{Config: config(func(c *dns.Config) { c.TSIGSecret = ""; c.TSIGSecretFile = path })})
	if err != nil || len(v.Problems) == 0 {
		t.Errorf("a group-readable secret file was accepted: %v %v", err, v)
	}
}
