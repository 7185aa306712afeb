package dnsrecords_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/clocktest"
	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/proctest"
)

// pluginBin is the DNS plugin binary: from BERTH_BIN_DIR, or built by TestMain.
var pluginBin string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if d := os.Getenv("BERTH_BIN_DIR"); d != "" {
		pluginBin = filepath.Join(d, "berth-plugin-dns")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "dnsrecords-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginBin = filepath.Join(dir, "berth-plugin-dns")
	cmd := exec.Command("go", "build", "-o", pluginBin, "github.com/berthhq/berth/cmd/berth-plugin-dns")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the DNS plugin:", err)
		return 1
	}
	return m.Run()
}

func pluginBinary(testing.TB) string { return pluginBin }

// rig is one berthd's DNS part: a real knotd, the real plugin process, the embedded store.
type rig struct {
	knot *knottest.Server
	st   *store.Store
	q    *operations.Queue
	r    *dnsrecords.Records
}

func newRig(t *testing.T, knot *knottest.Server, opts ...func(*dnsrecords.Config)) *rig {
	t.Helper()
	st := storetest.Open(t)
	return addBerthd(t, knot, st, opts...)
}

// addBerthd starts another berthd's DNS part (its own plugin process and worker) on st.
func addBerthd(t testing.TB, knot *knottest.Server, st *store.Store, opts ...func(*dnsrecords.Config)) *rig {
	t.Helper()
	cfg, _ := json.Marshal(map[string]any{"server": knot.Addr, "zones": knot.Zones, "tsig_key_name": knot.Key.Name,
		"tsig_secret": knot.Key.Secret, "timeout_ms": 1000})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h, err := plugin.LaunchProvider(ctx, plugin.Config{Name: "dns", Path: pluginBinary(t), Args: []string{"--state-dir", t.TempDir()}, PluginConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	q := operations.NewQueue(st, operations.Config{Policy: operations.Policy{BaseDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond}})
	if err := q.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	rc := dnsrecords.Config{Store: st, Queue: q, Writer: h, Zones: knot.Zones, Poll: 50 * time.Millisecond}
	for _, o := range opts {
		o(&rc)
	}
	r, err := dnsrecords.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })
	return &rig{knot: knot, st: st, q: q, r: r}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func txt(t *testing.T, k *knottest.Server, name string) []string {
	t.Helper()
	rrs, err := k.Lookup(name, mdns.TypeTXT)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rr := range rrs {
		out = append(out, strings.Join(rr.(*mdns.TXT).Txt, ""))
	}
	slices.Sort(out)
	return out
}

// TestPresentAndCleanupTXT: PresentTXT returns once the server holds the value, two values of one
// name coexist, CleanupTXT withdraws only its own value, and the last one takes the record and its
// ownership record with it; a node's value is withdrawn only by that node.
func TestPresentAndCleanupTXT(t *testing.T) {
	k := knottest.Start(t, "example.test")
	g := newRig(t, k)
	const name = "_acme-challenge.www.example.test."
	if err := g.r.PresentTXT(ctxFor(t, time.Minute), name, "token-one"); err != nil {
		t.Fatal(err)
	}
	if got := txt(t, k, name); !slices.Equal(got, []string{"token-one"}) {
		t.Fatalf("after PresentTXT: %v", got)
	}
	if err := g.r.PresentTXT(ctxFor(t, time.Minute), name, "token-two"); err != nil {
		t.Fatal(err)
	}
	if err := g.r.PresentNodeTXT(ctxFor(t, time.Minute), "nod_a", name, "node-value"); err != nil {
		t.Fatal(err)
	}
	if got := txt(t, k, name); !slices.Equal(got, []string{"node-value", "token-one", "token-two"}) {
		t.Fatalf("after three presents: %v", got)
	}
	if err := g.r.CleanupTXT(ctxFor(t, time.Minute), name, "token-one"); err != nil {
		t.Fatal(err)
	}
	// Another node (or the ACME client) withdrawing the node's value changes nothing.
	if err := g.r.CleanupNodeTXT(ctxFor(t, time.Minute), "nod_b", name, "node-value"); err != nil {
		t.Fatal(err)
	}
	if err := g.r.CleanupTXT(ctxFor(t, time.Minute), name, "node-value"); err != nil {
		t.Fatal(err)
	}
	if got := txt(t, k, name); !slices.Equal(got, []string{"node-value", "token-two"}) {
		t.Fatalf("after cleanups of values not theirs: %v", got)
	}
	for _, f := range []func() error{
		func() error { return g.r.CleanupTXT(ctxFor(t, time.Minute), name, "token-two") },
		func() error { return g.r.CleanupNodeTXT(ctxFor(t, time.Minute), "nod_a", name, "node-value") },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if got := txt(t, k, name); len(got) != 0 {
		t.Errorf("after every cleanup: %v", got)
	}
	if got := txt(t, k, "_berth-owner."+name); len(got) != 1 || !strings.HasSuffix(got[0], ";deleted") {
		t.Errorf("ownership record after every cleanup: %v, want one tombstone", got)
	}
	if _, err := g.r.Get(t.Context(), name, "TXT"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the record document after every cleanup: %v, want gone", err)
	}
}

// TestRefusedWritesReturnTheirCode: a name outside the zones is refused before anything is
// queued, and a record an operator made is refused dns_record_not_owned by the plugin and left
// alone; neither is retried.
func TestRefusedWritesReturnTheirCode(t *testing.T) {
	k := knottest.Start(t, "example.test")
	g := newRig(t, k)
	err := g.r.PresentTXT(ctxFor(t, time.Minute), "_acme-challenge.elsewhere.test.", "v")
	if !errors.Is(err, abierrors.New(abierrors.DNSZoneNotServed, "")) {
		t.Errorf("outside the zones: %v, want dns_zone_not_served", err)
	}
	m := new(mdns.Msg)
	m.SetUpdate("example.test.")
	rr, _ := mdns.NewRR(`_acme-challenge.op.example.test. 60 IN TXT "operator"`)
	m.Insert([]mdns.RR{rr})
	m.SetTsig(k.Key.Name, mdns.HmacSHA256, 300, time.Now().Unix())
	c := &mdns.Client{Net: "tcp", TsigSecret: map[string]string{k.Key.Name: k.Key.Secret}}
	if in, _, err := c.Exchange(m, k.Addr); err != nil || in.Rcode != mdns.RcodeSuccess {
		t.Fatalf("operator's record: %v %v", err, in)
	}
	err = g.r.PresentTXT(ctxFor(t, time.Minute), "_acme-challenge.op.example.test.", "berth")
	if !errors.Is(err, abierrors.New(abierrors.DNSRecordNotOwned, "")) {
		t.Errorf("over an operator's record: %v, want dns_record_not_owned", err)
	}
	if got := txt(t, k, "_acme-challenge.op.example.test."); !slices.Equal(got, []string{"operator"}) {
		t.Errorf("the operator's record is now %v", got)
	}
	// Once the operator removed their record, asking again writes it.
	m = new(mdns.Msg)
	m.SetUpdate("example.test.")
	m.RemoveRRset([]mdns.RR{rr})
	m.SetTsig(k.Key.Name, mdns.HmacSHA256, 300, time.Now().Unix())
	if in, _, err := c.Exchange(m, k.Addr); err != nil || in.Rcode != mdns.RcodeSuccess {
		t.Fatalf("remove the operator's record: %v %v", err, in)
	}
	if err := g.r.PresentTXT(ctxFor(t, time.Minute), "_acme-challenge.op.example.test.", "berth"); err != nil {
		t.Fatalf("present again after the operator's record went: %v", err)
	}
	if got := txt(t, k, "_acme-challenge.op.example.test."); !slices.Equal(got, []string{"berth"}) {
		t.Errorf("after presenting again: %v", got)
	}
}

// TestWriteRetriesWhileTheServerIsDown: with knot stopped, PresentTXT waits (the write is
// retried with backoff, the operation in retry); once knot is back the same write lands without
// a new request.
func TestWriteRetriesWhileTheServerIsDown(t *testing.T) {
	k := knottest.Start(t, "example.test")
	g := newRig(t, k)
	k.Stop()
	const name = "_acme-challenge.down.example.test."
	err := g.r.PresentTXT(ctxFor(t, 2*time.Second), name, "later")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PresentTXT with the server down: %v, want the deadline", err)
	}
	ops, err := g.q.List(t.Context(), dnsrecords.ProjectID)
	if err != nil || len(ops) != 1 {
		t.Fatalf("operations: %v %v", ops, err)
	}
	if ops[0].State == operations.Succeeded || ops[0].State == operations.Failed || ops[0].Attempts == 0 || !strings.Contains(ops[0].LastError, "unavailable") {
		t.Fatalf("the write while the server is down: %+v, want retried and unavailable", ops[0])
	}
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	rec, err := g.r.Get(t.Context(), name, "TXT")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.r.Wait(ctxFor(t, time.Minute), name, "TXT", rec.Generation); err != nil {
		t.Fatal(err)
	}
	if got := txt(t, k, name); !slices.Equal(got, []string{"later"}) {
		t.Errorf("after the server came back: %v", got)
	}
}

// TestManagedRecordsFollowTheEdge: a managed service's domains get A and AAAA records of the edge
// addresses; a changed edge set rewrites them, a dropped address family withdraws its records, a
// domain held by two services stays until both let go, and an empty domain list withdraws
// everything.
func TestManagedRecordsFollowTheEdge(t *testing.T) {
	k := knottest.Start(t, "example.test")
	g := newRig(t, k)
	sync := func(domains []dnsrecords.Domain, edge ...string) {
		t.Helper()
		skipped, err := g.r.SyncManaged(ctxFor(t, time.Minute), domains, edge)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(skipped, []string{"shop.other.test"}) && slices.ContainsFunc(domains, func(d dnsrecords.Domain) bool { return d.Host == "shop.other.test" }) {
			t.Errorf("skipped %v, want shop.other.test", skipped)
		}
	}
	wait := func(name string, rrtype uint16, want ...string) {
		t.Helper()
		proctest.WaitFor(t, time.Minute, name+" "+mdns.TypeToString[rrtype]+" = "+strings.Join(want, ","), func() (bool, string) {
			got := k.Addresses(t, name, rrtype)
			return slices.Equal(got, want), strings.Join(got, ",")
		})
	}
	web, api := dnsrecords.ServiceHolder("svc_web"), dnsrecords.ServiceHolder("svc_api")
	sync([]dnsrecords.Domain{{web, "www.example.test"}, {web, "example.test"}, {web, "shop.other.test"}, {api, "www.example.test"}},
		"192.0.2.1", "192.0.2.2", "2001:db8::1", "not-an-address")
	wait("www.example.test", mdns.TypeA, "192.0.2.1", "192.0.2.2")
	wait("example.test", mdns.TypeA, "192.0.2.1", "192.0.2.2")
	wait("www.example.test", mdns.TypeAAAA, "2001:db8::1")

	sync([]dnsrecords.Domain{{web, "www.example.test"}, {web, "example.test"}, {api, "www.example.test"}}, "192.0.2.3")
	wait("www.example.test", mdns.TypeA, "192.0.2.3")
	wait("example.test", mdns.TypeA, "192.0.2.3")
	wait("www.example.test", mdns.TypeAAAA)

	sync([]dnsrecords.Domain{{api, "www.example.test"}}, "192.0.2.3")
	wait("example.test", mdns.TypeA)
	wait("www.example.test", mdns.TypeA, "192.0.2.3")
	sync(nil, "192.0.2.3")
	wait("www.example.test", mdns.TypeA)
	// The zone's own NS glue, which Berth never wrote, is still there.
	wait("ns1.example.test", mdns.TypeA, "127.0.0.1")
}

// TestTwoBerthdsShareTheWrites: two berthd processes' workers and plugins on one store write the
// values both ask for concurrently; every value lands once and the fences keep a late writer from
// undoing a later state.
func TestTwoBerthdsShareTheWrites(t *testing.T) {
	k := knottest.Start(t, "example.test")
	a := newRig(t, k)
	b := addBerthd(t, k, a.st)
	const name = "_acme-challenge.shared.example.test."
	values := []string{"v1", "v2", "v3", "v4", "v5", "v6"}
	var wg sync.WaitGroup
	errs := make([]error, len(values))
	for i, v := range values {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := a
			if i%2 == 1 {
				g = b
			}
			errs[i] = g.r.PresentTXT(ctxFor(t, 2*time.Minute), name, v)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("present %s: %v", values[i], err)
		}
	}
	rec, err := a.r.Get(t.Context(), name, "TXT")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.r.Wait(ctxFor(t, time.Minute), name, "TXT", rec.Generation); err != nil {
		t.Fatal(err)
	}
	if got := txt(t, k, name); !slices.Equal(got, values) {
		t.Errorf("TXT %s = %v, want %v", name, got, values)
	}
}

// TestForgottenChallengesExpire: a challenge value whose holder never cleaned it up (a berthd or
// node that died between present and cleanup) is withdrawn by the resume pass once it is older
// than ChallengeMaxAge; a younger one and a service's record stay.
func TestForgottenChallengesExpire(t *testing.T) {
	k := knottest.Start(t, "example.test")
	clk := clocktest.New(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g := newRig(t, k, func(c *dnsrecords.Config) { c.Now, c.ChallengeMaxAge = clk.Now, time.Hour })
	const name = "_acme-challenge.old.example.test."
	if err := g.r.PresentNodeTXT(ctxFor(t, time.Minute), "nod_gone", name, "forgotten"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.r.Set(ctxFor(t, time.Minute), "svc.example.test", "A", dnsrecords.ServiceHolder("svc_a"), []string{"192.0.2.1"}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50 * time.Minute)
	if err := g.r.PresentTXT(ctxFor(t, time.Minute), name, "recent"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(20 * time.Minute) // the node's value is 70 min old, the recent one 20
	if err := g.r.Resume(ctxFor(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, time.Minute, "the forgotten value withdrawn", func() (bool, string) {
		got := txt(t, k, name)
		return slices.Equal(got, []string{"recent"}), strings.Join(got, ",")
	})
	proctest.WaitFor(t, time.Minute, "the service's record, which never expires", func() (bool, string) {
		got := k.Addresses(t, "svc.example.test", mdns.TypeA)
		return slices.Equal(got, []string{"192.0.2.1"}), strings.Join(got, ",")
	})
	if rec, err := g.r.Get(t.Context(), "svc.example.test", "A"); err != nil || len(rec.Holdings) != 1 {
		t.Errorf("the service's record document after the pass: %+v %v", rec, err)
	}
}
