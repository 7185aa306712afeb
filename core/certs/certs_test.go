package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/pebbletest"
	"github.com/berthhq/berth/internal/proctest"
)

// blockedName is a name pebble refuses by policy (rejectedIdentifier).
const blockedName = "blocked.example.com"

// The package's one pebble and one DNS test server (started in TestMain),
// and the loopback server that answers HTTP-01 from the tables the sinks
// received, as the gateway does.
var (
	ca      *pebbletest.Server
	dnsSrv  *pebbletest.ChallSrv
	answers = &answerHub{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "certs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	dnsSrv, err = pebbletest.NewChallSrv(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer dnsSrv.Stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: answers, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	ca, err = pebbletest.New(pebbletest.Config{DNSServer: dnsSrv.DNSAddr, HTTPPort: ln.Addr().(*net.TCPAddr).Port,
		Blocklist: []string{blockedName}}, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ca.Stop()
	return m.Run()
}

// answerHub serves GET /.well-known/acme-challenge/TOKEN for the Host from
// the Challenges of every sink's last table, as the gateway serves its own.
type answerHub struct {
	mu     sync.Mutex
	sinks  []*sink
	served int
}

func (h *answerHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.URL.Path, "/.well-known/acme-challenge/")
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sinks {
		s.mu.Lock()
		for _, c := range s.last.Challenges {
			if ok && c.Host == host && c.Token == token {
				s.mu.Unlock()
				h.served++
				w.Header().Set("Content-Type", "text/plain")
				_, _ = w.Write([]byte(c.KeyAuth))
				return
			}
		}
		s.mu.Unlock()
	}
	http.NotFound(w, r)
}

// sink stands in for the gateway: it keeps the tables it is given.
type sink struct {
	mu      sync.Mutex
	last    abiroutes.Table
	changed chan struct{}
}

func newSink(t testing.TB) *sink {
	s := &sink{changed: make(chan struct{}, 1)}
	answers.mu.Lock()
	answers.sinks = append(answers.sinks, s)
	answers.mu.Unlock()
	t.Cleanup(func() {
		answers.mu.Lock()
		defer answers.mu.Unlock()
		for i, o := range answers.sinks {
			if o == s {
				answers.sinks = append(answers.sinks[:i], answers.sinks[i+1:]...)
				return
			}
		}
	})
	return s
}

func (s *sink) SetRoutes(_ context.Context, t abiroutes.Table) error {
	s.mu.Lock()
	if t.Revision <= s.last.Revision {
		s.mu.Unlock()
		return fmt.Errorf("revision %d after %d", t.Revision, s.last.Revision)
	}
	s.last = t
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// await waits until cond holds for the last table, at most 2 minutes.
func (s *sink) await(t testing.TB, what string, cond func(abiroutes.Table) bool) abiroutes.Table {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		s.mu.Lock()
		last := s.last
		s.mu.Unlock()
		if cond(last) {
			return last
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s; last table: %d certificates, %d challenges", what, len(last.Certificates), len(last.Challenges))
		}
	}
}

// txtPublisher writes DNS-01 records to the DNS test server pebble asks.
type txtPublisher struct{ c *pebbletest.ChallSrv }

func (p txtPublisher) PresentTXT(ctx context.Context, fqdn, value string) error {
	return p.c.SetTXT(ctx, fqdn, value)
}
func (p txtPublisher) CleanupTXT(ctx context.Context, fqdn, _ string) error {
	return p.c.ClearTXT(ctx, fqdn)
}

var _ certs.TXTPublisher = txtPublisher{}

func keyring(t testing.TB) *secrets.Keyring {
	t.Helper()
	k, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keyring.json"), true)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newManager(t testing.TB, st *store.Store, kr *secrets.Keyring, owner string, next certs.TableSink, reg prometheus.Registerer) *certs.Manager {
	t.Helper()
	m, err := certs.New(certs.Config{
		Store: st, Keyring: kr, Next: next, Owner: owner,
		DirectoryURL: ca.Directory, CARootFile: ca.CARootFile, Email: "ops@example.com",
		DNS: txtPublisher{dnsSrv}, HTTP01Reachable: true,
		Events: events.New(st, time.Now), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func table(routes ...abiroutes.Route) abiroutes.Table {
	t := abiroutes.Table{Revision: 1, Routes: routes}
	t.Normalize()
	return t
}

func route(host, mode string) abiroutes.Route {
	return abiroutes.Route{Hostname: host, Project: "shop", Service: "web", TLSMode: mode,
		Upstreams: []abiroutes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:1", Healthy: true}}}
}

func certFor(t abiroutes.Table, name string) (abiroutes.Certificate, bool) {
	for _, c := range t.Certificates {
		for _, n := range c.Names {
			if n == name {
				return c, true
			}
		}
	}
	return abiroutes.Certificate{}, false
}

// verifyChain checks that c's chain verifies against pebble's root of this
// start for serverName, and that its key matches its leaf.
func verifyChain(t *testing.T, c abiroutes.Certificate, serverName string) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	roots, err := ca.Roots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	rest := []byte(c.CertPEM)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		x, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, x)
	}
	if len(chain) == 0 {
		t.Fatalf("certificate for %v holds no PEM certificate", c.Names)
	}
	inter := x509.NewCertPool()
	for _, x := range chain[1:] {
		inter.AddCert(x)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: serverName}); err != nil {
		t.Fatalf("chain for %s does not verify against pebble's root: %v", serverName, err)
	}
	if _, err := tls.X509KeyPair([]byte(c.CertPEM), []byte(c.KeyPEM)); err != nil {
		t.Fatalf("key of %v does not match its certificate: %v", c.Names, err)
	}
	if !c.NotAfter.Equal(chain[0].NotAfter.UTC()) {
		t.Fatalf("not_after %s, leaf says %s", c.NotAfter, chain[0].NotAfter)
	}
	return chain[0]
}

// TestIssuesForTwoNames: one name by HTTP-01 (answered from the table's
// Challenges) and one wildcard by DNS-01 get certificates that verify
// against pebble's root with the right names; the route without tls gets
// none; statuses say issued; stored private keys are sealed.
func TestIssuesForTwoNames(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	m := newManager(t, st, keyring(t), "brd_a", s, prometheus.NewRegistry())
	ctx := context.Background()
	answers.mu.Lock()
	servedBefore := answers.served
	answers.mu.Unlock()

	if err := m.SetRoutes(ctx, table(route("shop.example.com", abiroutes.TLSACME),
		route("*.apps.example.com", abiroutes.TLSACME), route("plain.example.com", abiroutes.TLSNone))); err != nil {
		t.Fatal(err)
	}
	last := s.await(t, "certificates for both names", func(tb abiroutes.Table) bool {
		_, a := certFor(tb, "shop.example.com")
		_, b := certFor(tb, "*.apps.example.com")
		return a && b
	})
	if len(last.Routes) != 3 {
		t.Fatalf("table lost routes: %+v", last.Routes)
	}
	if _, ok := certFor(last, "plain.example.com"); ok {
		t.Fatal("a route without tls got a certificate")
	}
	c, _ := certFor(last, "shop.example.com")
	leaf := verifyChain(t, c, "shop.example.com")
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "shop.example.com" {
		t.Fatalf("SANs %v", leaf.DNSNames)
	}
	w, _ := certFor(last, "*.apps.example.com")
	leaf = verifyChain(t, w, "api.apps.example.com")
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "*.apps.example.com" {
		t.Fatalf("wildcard SANs %v", leaf.DNSNames)
	}
	answers.mu.Lock()
	served := answers.served - servedBefore
	answers.mu.Unlock()
	if served == 0 {
		t.Fatal("the HTTP-01 answer was never fetched from the table's challenges")
	}
	s.await(t, "challenges withdrawn", func(tb abiroutes.Table) bool { return len(tb.Challenges) == 0 })

	stats, err := certs.Statuses(ctx, st, []string{"shop.example.com", "*.apps.example.com", "plain.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 2 {
		t.Fatalf("statuses %+v, want two", stats)
	}
	for h, want := range map[string]string{"shop.example.com": "http-01", "*.apps.example.com": "dns-01"} {
		got := stats[h]
		if got.State != certs.StateIssued || got.NotAfter.IsZero() || got.LastError != "" || got.Challenge != want {
			t.Fatalf("status of %s = %+v", h, got)
		}
	}

	// Every stored value is sealed: the private key's PEM is nowhere in the store.
	cur, err := st.Collection(certs.StorageCollection).Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var raws []bson.Raw
	if err := cur.All(ctx, &raws); err != nil {
		t.Fatal(err)
	}
	if len(raws) == 0 {
		t.Fatal("nothing stored")
	}
	for _, r := range raws {
		if strings.Contains(string(r), "PRIVATE KEY") || strings.Contains(string(r), "BEGIN CERTIFICATE") {
			t.Fatalf("a stored value is in the clear: %s", r.Lookup("_id"))
		}
	}
}

// TestRefusedOrderFails: an order the CA refuses leaves the hostname failed
// with the CA's problem, counted and raised as an event, while another
// route's certificate is served.
func TestRefusedOrderFails(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	reg := prometheus.NewRegistry()
	m := newManager(t, st, keyring(t), "brd_a", s, reg)
	ctx := context.Background()
	if err := m.SetRoutes(ctx, table(route(blockedName, abiroutes.TLSACME), route("ok.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	s.await(t, "the good name's certificate", func(tb abiroutes.Table) bool { _, ok := certFor(tb, "ok.example.com"); return ok })
	var got certs.Status
	proctest.WaitFor(t, 2*time.Minute, blockedName+" failed", func() (bool, string) {
		var err error
		got, err = m.Status(ctx, blockedName)
		return err == nil && got.State == certs.StateFailed, fmt.Sprintf("%+v, %v", got, err)
	})
	if !strings.Contains(got.LastError, "rejectedIdentifier") || !strings.Contains(got.LastError, "forbidden by policy") {
		t.Fatalf("last_error %q does not carry the CA's problem", got.LastError)
	}
	if n := counterValue(t, reg, "berth_certificate_failures_total"); n < 1 {
		t.Fatalf("failures metric %v", n)
	}
	evs, err := events.New(st, time.Now).List(ctx, 0, certs.EventCertificateFailed, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[0].Event.Data["hostname"] != blockedName {
		t.Fatalf("events %+v", evs)
	}
	s.mu.Lock()
	_, blockedHas := certFor(s.last, blockedName)
	s.mu.Unlock()
	if blockedHas {
		t.Fatal("a refused name has a certificate")
	}
}

// TestTwoManagersOrderOnce: two berthd's managers on one store, both asked
// for one name, send one order between them and both serve its certificate;
// a third started afterwards serves it from its first table.
func TestTwoManagersOrderOnce(t *testing.T) {
	st := storetest.Open(t)
	kr := keyring(t)
	sa, sb := newSink(t), newSink(t)
	ra, rb := prometheus.NewRegistry(), prometheus.NewRegistry()
	ma := newManager(t, st, kr, "brd_a", sa, ra)
	mb := newManager(t, st, kr, "brd_b", sb, rb)
	ctx := context.Background()
	tb := table(route("both.example.com", abiroutes.TLSACME))
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, m := range []*certs.Manager{ma, mb} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- m.SetRoutes(ctx, tb) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	has := func(tb abiroutes.Table) bool { _, ok := certFor(tb, "both.example.com"); return ok }
	a := sa.await(t, "manager a's certificate", has)
	b := sb.await(t, "manager b's certificate", has)
	certA, _ := certFor(a, "both.example.com")
	certB, _ := certFor(b, "both.example.com")
	if certA.CertPEM != certB.CertPEM {
		t.Fatal("the two managers serve different certificates")
	}
	orders := counterValue(t, ra, "berth_certificate_orders_total") + counterValue(t, rb, "berth_certificate_orders_total")
	if orders != 1 {
		t.Fatalf("%v orders between the two managers, want 1", orders)
	}

	// A berthd started later on the same store pushes the stored
	// certificate in its very first table: a restart never serves without it.
	sc := newSink(t)
	mc := newManager(t, st, kr, "brd_c", sc, prometheus.NewRegistry())
	if err := mc.SetRoutes(ctx, tb); err != nil {
		t.Fatal(err)
	}
	sc.mu.Lock()
	first := sc.last
	sc.mu.Unlock()
	if c, ok := certFor(first, "both.example.com"); !ok || c.CertPEM != certA.CertPEM {
		t.Fatalf("the first table after a restart has certificates %+v", first.Certificates)
	}
}

// counterValue reads the named counter from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s on the registry", name)
	return 0
}

// TestRenewsAheadOfExpiry: a certificate inside its renewal window is
// ordered again, the table moves to the newer one and the status records
// its later expiry.
func TestRenewsAheadOfExpiry(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	// A window of the whole lifetime puts every certificate in it at once.
	m, err := certs.New(certs.Config{
		Store: st, Keyring: keyring(t), Next: s, Owner: "brd_a",
		DirectoryURL: ca.Directory, CARootFile: ca.CARootFile, HTTP01Reachable: true,
		RenewCheckInterval: time.Second, RenewalWindowRatio: 1, Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	if err := m.SetRoutes(ctx, table(route("renew.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	first := s.await(t, "the first certificate", func(tb abiroutes.Table) bool { _, ok := certFor(tb, "renew.example.com"); return ok })
	c1, _ := certFor(first, "renew.example.com")
	next := s.await(t, "a renewed certificate", func(tb abiroutes.Table) bool {
		c, ok := certFor(tb, "renew.example.com")
		return ok && c.CertPEM != c1.CertPEM
	})
	c2, _ := certFor(next, "renew.example.com")
	verifyChain(t, c2, "renew.example.com")
	if !c2.NotAfter.After(c1.NotAfter) {
		t.Fatalf("renewed not_after %s is not after %s", c2.NotAfter, c1.NotAfter)
	}
	proctest.WaitFor(t, time.Minute, "the status to record the renewal", func() (bool, string) {
		got, err := m.Status(ctx, "renew.example.com")
		return err == nil && !got.NotAfter.Before(c2.NotAfter), fmt.Sprintf("%+v, %v", got, err)
	})
}

// TestWithdrawnRouteStopsBeforeOrdering: a route withdrawn while its order
// waits for the certificate lock never reaches the CA: once the lock is
// free the manager orders the next name only, and nothing is stored for the
// withdrawn one.
func TestWithdrawnRouteStopsBeforeOrdering(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	reg := prometheus.NewRegistry()
	m := newManager(t, st, keyring(t), "brd_a", s, reg)
	ctx := context.Background()
	blocker := certs.NewLocks(leases.NewManager(st, leases.Config{Owner: "brd_blocker"}), nil)
	const lock = "issue_cert_gone.example.com"
	if err := blocker.Lock(ctx, lock); err != nil {
		t.Fatal(err)
	}
	if err := m.SetRoutes(ctx, table(route("gone.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Status(ctx, "gone.example.com"); err != nil || got.State != certs.StatePending {
		t.Fatalf("status while waiting for the lock: %+v, %v", got, err)
	}
	if err := m.SetRoutes(ctx, table(route("after.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Status(ctx, "gone.example.com"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a withdrawn hostname keeps its status: %v", err)
	}
	if err := blocker.Unlock(ctx, lock); err != nil {
		t.Fatal(err)
	}
	s.await(t, "the next name's certificate", func(tb abiroutes.Table) bool { _, ok := certFor(tb, "after.example.com"); return ok })
	if n := counterValue(t, reg, "berth_certificate_orders_total"); n != 1 {
		t.Fatalf("%v orders, want 1 (the withdrawn name was ordered)", n)
	}
	if _, ok := certFor(s.last, "gone.example.com"); ok {
		t.Fatal("the withdrawn name has a certificate in the table")
	}
	n, err := st.Collection(certs.StorageCollection).CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$regex", Value: `gone\.example\.com\.crt$`}}}})
	if err != nil || n != 0 {
		t.Fatalf("%d certificates stored for the withdrawn name (%v)", n, err)
	}
}

// failingPublisher stands for a DNS provider whose server is down.
type failingPublisher struct{}

func (failingPublisher) PresentTXT(context.Context, string, string) error {
	return errors.New("dns server 127.0.0.1:53 refused the update")
}
func (failingPublisher) CleanupTXT(context.Context, string, string) error { return nil }

// TestDNSFailureLeavesOthersServing: a DNS-01 name whose record cannot be
// published is failed with the provider's error, and an HTTP-01 name of
// the same table is issued and served.
func TestDNSFailureLeavesOthersServing(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	m, err := certs.New(certs.Config{
		Store: st, Keyring: keyring(t), Next: s, Owner: "brd_a",
		DirectoryURL: ca.Directory, CARootFile: ca.CARootFile, HTTP01Reachable: true,
		DNS: failingPublisher{}, Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	if err := m.SetRoutes(ctx, table(route("*.down.example.com", abiroutes.TLSACME), route("up.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	s.await(t, "the HTTP-01 name's certificate", func(tb abiroutes.Table) bool { _, ok := certFor(tb, "up.example.com"); return ok })
	proctest.WaitFor(t, 2*time.Minute, "the DNS-01 name failed", func() (bool, string) {
		got, err := m.Status(ctx, "*.down.example.com")
		return err == nil && got.State == certs.StateFailed && strings.Contains(got.LastError, "refused the update"), fmt.Sprintf("%+v, %v", got, err)
	})
}

// downPublisher stands for core/dnsrecords while the DNS server is down: the write (a present
// or a withdrawal) is retried behind the call, which returns only when its context ends.
type downPublisher struct{}

func (downPublisher) PresentTXT(ctx context.Context, fqdn, _ string) error {
	<-ctx.Done()
	return fmt.Errorf("present TXT %s: the DNS server does not answer: %w", fqdn, ctx.Err())
}
func (downPublisher) CleanupTXT(ctx context.Context, fqdn, _ string) error {
	<-ctx.Done()
	return fmt.Errorf("clean up TXT %s: the DNS server does not answer: %w", fqdn, ctx.Err())
}

// TestDNSOutageStaysPending: while DNS does not take a DNS-01 name's challenge record, the name
// stays pending with the outage as its last error, is not failed, counts no failure and raises
// no certificate.failed event; an HTTP-01 name of the same table is issued and served.
func TestDNSOutageStaysPending(t *testing.T) {
	st := storetest.Open(t)
	s := newSink(t)
	reg := prometheus.NewRegistry()
	m, err := certs.New(certs.Config{
		Store: st, Keyring: keyring(t), Next: s, Owner: "brd_a",
		DirectoryURL: ca.Directory, CARootFile: ca.CARootFile, HTTP01Reachable: true,
		DNS: downPublisher{}, DNSPublishWait: 300 * time.Millisecond,
		Events: events.New(st, time.Now), Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	if err := m.SetRoutes(ctx, table(route("*.outage.example.com", abiroutes.TLSACME), route("up.example.com", abiroutes.TLSACME))); err != nil {
		t.Fatal(err)
	}
	var got certs.Status
	proctest.WaitFor(t, 2*time.Minute, "the DNS-01 name pending with the outage as its last error", func() (bool, string) {
		var err error
		got, err = m.Status(ctx, "*.outage.example.com")
		if err == nil && got.State == certs.StateFailed {
			t.Fatalf("a DNS outage failed the name: %+v", got)
		}
		return err == nil && got.State == certs.StatePending && strings.Contains(got.LastError, "does not answer"), fmt.Sprintf("%+v, %v", got, err)
	})
	if !strings.Contains(got.LastError, "did not take the challenge record") {
		t.Errorf("last_error %q does not say DNS did not take the record", got.LastError)
	}
	s.await(t, "the HTTP-01 name's certificate", func(tb abiroutes.Table) bool { _, ok := certFor(tb, "up.example.com"); return ok })
	if got, err := m.Status(ctx, "*.outage.example.com"); err != nil || got.State != certs.StatePending {
		t.Fatalf("after the other name was issued: %+v, %v; want pending", got, err)
	}
	if n := counterValue(t, reg, "berth_certificate_failures_total"); n != 0 {
		t.Errorf("failures metric %v during a DNS outage, want 0", n)
	}
	evs, err := events.New(st, time.Now).List(ctx, 0, certs.EventCertificateFailed, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 0 {
		t.Errorf("certificate.failed events during a DNS outage: %+v", evs)
	}
}
