// Package certs obtains, stores and renews the gateway's ACME certificates in berthd and
// hands them, with the HTTP-01 answers, to the gateway inside the route table.
//
// A [Manager] sits between the reconciler and the gateway as the route table's sink: for every
// route with tls_mode acme it keeps a certificate (certmagic, with [Storage] in the store, keys
// sealed under the secrets keyring, and [Locks] as store leases), records its [Status], and
// pushes each table on with the certificates it holds and the challenges in flight
// (docs/certificates.md).
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// TableSink receives the complete route table (the gateway; the same shape
// as the reconciler's RouteSink).
type TableSink interface {
	SetRoutes(ctx context.Context, t abiroutes.Table) error
}

// Config configures a [Manager]. Store, Keyring, Next and Owner are
// required.
type Config struct {
	// Store holds the certificates, locks and statuses.
	Store *store.Store
	// Keyring seals every stored value (core/secrets).
	Keyring *secrets.Keyring
	// Next receives every table the Manager composes.
	Next TableSink
	// Owner names this berthd among the holders of certificate locks
	// ("brd_<ULID>"); two Managers on one store need two owners.
	Owner string
	// DirectoryURL is the ACME directory, e.g.
	// https://acme-v02.api.letsencrypt.org/directory; empty means no ACME:
	// tls_mode acme routes are recorded failed and only manual ones served.
	DirectoryURL string
	// CARootFile, when set, is a PEM file of the only roots trusted for the
	// directory's TLS (a private CA); empty means the system roots.
	CARootFile string
	// Email is the ACME account's contact; empty registers none.
	Email string
	// DNS publishes DNS-01 records; nil means no name can use DNS-01
	// (wildcards and names under DNS01Zones then fail with a clear error,
	// and [Config.CheckDomain] refuses them).
	DNS TXTPublisher
	// DNSPublishWait bounds how long one DNS-01 order waits for DNS to
	// take its challenge record; past it the order ends with
	// [ErrDNSUnavailable] and is tried again with backoff, the hostname
	// staying pending. Zero means 2 minutes.
	DNSPublishWait time.Duration
	// DNS01Zones are the zones Berth manages DNS for: names under them (and
	// every wildcard) are validated by DNS-01; all others by HTTP-01.
	DNS01Zones []string
	// Manual, when not nil, supplies the certificate of every tls_mode
	// manual route; nil leaves such routes without one.
	Manual ManualSource
	// ManualRefresh is how often manual certificates are read again, so a
	// new version of a tls secret is served without a route change; zero
	// means one minute, negative never.
	ManualRefresh time.Duration
	// HTTP01Reachable reports whether the gateway's port 80 is reachable
	// from the CA for every hostname routed to it; when false, a name outside
	// DNS01Zones cannot be validated ([Config.CheckDomain]).
	HTTP01Reachable bool
	// RenewCheckInterval is how often held certificates are checked for
	// renewal; zero means certmagic's 10 minutes.
	RenewCheckInterval time.Duration
	// RenewalWindowRatio is the part of a certificate's lifetime left when
	// renewal starts; zero means one third.
	RenewalWindowRatio float64
	// LockTTL is the lifetime of a certificate lock without renewal; zero
	// means 30 s.
	LockTTL time.Duration
	// Events, when not nil, receives a certificate.failed event per failed
	// order (docs/certificates.md section 5).
	Events *events.Log
	// Metrics, when not nil, receives berth_certificate_failures_total,
	// berth_certificate_orders_total and berth_certificate_not_after_seconds.
	Metrics prometheus.Registerer
	// Logger receives the Manager's messages; nil discards.
	Logger *slog.Logger
	// Now is the clock of status times; nil means time.Now.
	Now func() time.Time
}

// Manager keeps certificates for the table's acme routes. Create it with
// [New], give it every compiled table through [Manager.SetRoutes], and
// [Manager.Close] it once. Safe for concurrent use.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	storage *Storage
	issuer  *acmeIssuer
	cache   *certmagic.Cache
	cm      *certmagic.Config
	metrics *metrics
	status  *statusStore

	life   context.Context
	cancel context.CancelFunc

	pushMu sync.Mutex // serialises pushes so revisions reach Next in order
	rev    int64      // last revision pushed; pushMu must be held

	mu          sync.Mutex
	base        abiroutes.Table
	haveBase    bool
	names       map[string]context.CancelFunc    // wanted hostname -> stops its management
	certs       map[string]abiroutes.Certificate // acme certificates by hostname
	manual      map[string]abiroutes.Certificate // manual certificates by hostname
	manualHosts map[string]bool                  // hostnames of manual routes
	challenges  map[abiroutes.Challenge]bool
}

// New checks cfg and returns a Manager. It does no I/O beyond reading
// CARootFile.
func New(cfg Config) (*Manager, error) {
	switch {
	case cfg.Store == nil, cfg.Keyring == nil, cfg.Next == nil:
		return nil, errors.New("certs: Config.Store, Keyring and Next are required")
	case cfg.Owner == "":
		return nil, errors.New("certs: Config.Owner is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ManualRefresh == 0 {
		cfg.ManualRefresh = time.Minute
	}
	if cfg.DNSPublishWait <= 0 {
		cfg.DNSPublishWait = 2 * time.Minute
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CARootFile != "" {
		raw, err := os.ReadFile(cfg.CARootFile)
		if err != nil {
			return nil, fmt.Errorf("certs: read CA root file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("certs: CA root file %s holds no PEM certificate", cfg.CARootFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	log := cfg.Logger.With("component", "certs")
	lm := leases.NewManager(cfg.Store, leases.Config{Owner: cfg.Owner, TTL: cfg.LockTTL, Now: cfg.Now, Logger: log})
	m := &Manager{
		cfg:        cfg,
		log:        log,
		storage:    NewStorage(cfg.Store, cfg.Keyring, NewLocks(lm, log), log, cfg.Now),
		metrics:    newMetrics(cfg.Metrics),
		names:      map[string]context.CancelFunc{},
		certs:      map[string]abiroutes.Certificate{},
		manual:     map[string]abiroutes.Certificate{},
		challenges: map[abiroutes.Challenge]bool{},
	}
	m.status = &statusStore{coll: cfg.Store.Collection(StatusCollection), st: cfg.Store, now: cfg.Now}
	m.issuer = &acmeIssuer{m: m, client: &http.Client{Timeout: time.Minute, Transport: tr}}
	m.life, m.cancel = context.WithCancel(context.Background())
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return m.cm, nil },
		RenewCheckInterval: cfg.RenewCheckInterval,
		Logger:             zap.NewNop(),
	})
	m.cm = certmagic.New(m.cache, certmagic.Config{
		Storage:            m.storage,
		Issuers:            []certmagic.Issuer{m.issuer},
		RenewalWindowRatio: cfg.RenewalWindowRatio,
		OnEvent:            m.onEvent,
		OCSP:               certmagic.OCSPConfig{DisableStapling: true},
		DisableARI:         true,
		Logger:             zap.NewNop(),
	})
	if cfg.Manual != nil && cfg.ManualRefresh > 0 {
		go m.refreshManual(cfg.ManualRefresh)
	}
	return m, nil
}

// refreshManual reads the manual certificates of the last table again every
// interval and pushes the table when one changed, until Close.
func (m *Manager) refreshManual(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.life.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		base, have := m.base, m.haveBase
		m.mu.Unlock()
		if !have {
			continue
		}
		manual := m.manualCertificates(m.life, base)
		m.mu.Lock()
		// A table that arrived meanwhile read its own manual certificates.
		changed := m.base.Revision == base.Revision && !sameCertificates(manual, m.manual)
		if changed {
			m.manual = manual
		}
		m.mu.Unlock()
		if changed {
			if err := m.push(m.life); err != nil {
				m.log.Warn("push route table with a changed manual certificate", "error", err)
			}
		}
	}
}

func sameCertificates(a, b map[string]abiroutes.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for h, c := range a {
		if d, ok := b[h]; !ok || c.CertPEM != d.CertPEM || c.KeyPEM != d.KeyPEM {
			return false
		}
	}
	return true
}

// Close stops every order and renewal in flight and the renewal loop. The
// stored certificates and statuses stay.
func (m *Manager) Close() {
	m.cancel()
	m.cache.Stop()
}

// wanted reports whether a route of the last table asks a certificate for
// name.
func (m *Manager) wanted(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.names[name]
	return ok
}

// SetRoutes takes the compiled table t (the reconciler's sink): it starts
// managing a certificate for each new hostname whose route says tls_mode
// acme, stops (before any further certificate work, and dropping its
// certificate and challenges from the table) every hostname no route asks
// for any more, and pushes t on to Next with the certificates held and the
// HTTP-01 answers in flight, under a revision that increases with every
// push (t's own while it is ahead of the last one pushed). Errors: Next's; the caller retries with the same or a newer
// table.
func (m *Manager) SetRoutes(ctx context.Context, t abiroutes.Table) error {
	want := map[string]bool{}
	for _, r := range t.Routes {
		if r.TLSMode == abiroutes.TLSACME {
			want[r.Hostname] = true
		}
	}
	manual := m.manualCertificates(ctx, t)
	manualHosts := map[string]bool{}
	for _, r := range t.Routes {
		if r.TLSMode == ModeManual {
			manualHosts[r.Hostname] = true
		}
	}
	var removed []string
	added := map[string]context.Context{}
	m.mu.Lock()
	m.base, m.haveBase = t, true
	for h := range m.manualHosts {
		if !manualHosts[h] && !want[h] {
			removed = append(removed, h)
		}
	}
	m.manual, m.manualHosts = manual, manualHosts
	for h, stop := range m.names {
		if !want[h] {
			stop()
			delete(m.names, h)
			delete(m.certs, h)
			for c := range m.challenges {
				if c.Host == h {
					delete(m.challenges, c)
				}
			}
			removed = append(removed, h)
		}
	}
	for h := range want {
		if _, ok := m.names[h]; !ok {
			hctx, stop := context.WithCancel(m.life)
			m.names[h] = stop
			added[h] = hctx
		}
	}
	m.mu.Unlock()
	for _, h := range removed {
		m.cache.RemoveManaged([]certmagic.SubjectIssuer{{Subject: h}})
		if manualHosts[h] {
			continue // now served from its tls secret, which recorded its status
		}
		m.metrics.notAfter.DeleteLabelValues(h)
		if err := m.status.clear(ctx, h); err != nil {
			m.log.Warn("clear certificate status", "hostname", h, "error", err)
		}
		m.log.Info("certificate withdrawn", "hostname", h)
	}
	for _, h := range sortedKeys(added) {
		m.manage(ctx, h, added[h])
	}
	return m.push(ctx)
}

// manage starts certmagic's management of h under hctx (cancelled when h
// is withdrawn), after recording it pending when it has no status yet.
func (m *Manager) manage(ctx context.Context, h string, hctx context.Context) {
	challenge := "http-01"
	if m.usesDNS01(h) {
		challenge = "dns-01"
	}
	if err := m.status.update(ctx, h, func(s *Status) bool {
		changed := s.Challenge != challenge || s.State == ""
		if s.State == "" {
			s.State = StatePending
		}
		s.Challenge = challenge
		return changed
	}); err != nil {
		m.log.Warn("record certificate status", "hostname", h, "error", err)
	}
	if m.cfg.DirectoryURL == "" {
		m.fail(ctx, h, false, ErrNoACME)
		return
	}
	// A certificate stored already (by an earlier berthd, or another
	// replica) goes into the very next table, so a restart never pushes a
	// table without it.
	if _, err := m.refresh(ctx, h); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("load stored certificate", "hostname", h, "error", err)
	}
	if err := m.cm.ManageAsync(hctx, []string{h}); err != nil {
		m.fail(ctx, h, false, err)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// push composes the last table with the certificates held and the
// challenges in flight and hands it to Next under the next revision. It
// does nothing before the first table.
func (m *Manager) push(ctx context.Context) error {
	m.pushMu.Lock()
	defer m.pushMu.Unlock()
	m.mu.Lock()
	if !m.haveBase {
		m.mu.Unlock()
		return nil
	}
	t := m.base
	t.Certificates = nil
	for _, c := range m.certs {
		t.Certificates = append(t.Certificates, c)
	}
	for _, c := range m.manual {
		t.Certificates = append(t.Certificates, c)
	}
	sort.Slice(t.Certificates, func(i, j int) bool { return t.Certificates[i].Names[0] < t.Certificates[j].Names[0] })
	t.Challenges = nil
	for c := range m.challenges {
		t.Challenges = append(t.Challenges, c)
	}
	sort.Slice(t.Challenges, func(i, j int) bool {
		a, b := t.Challenges[i], t.Challenges[j]
		return a.Host+"/"+a.Token < b.Host+"/"+b.Token
	})
	m.mu.Unlock()
	// Tables keep the reconciler's revision while it is ahead, so both
	// count alike until a certificate or challenge adds a push of its own.
	m.rev = max(m.rev+1, t.Revision)
	t.Revision = m.rev
	if err := m.cfg.Next.SetRoutes(ctx, t); err != nil {
		return fmt.Errorf("certs: push route table revision %d: %w", t.Revision, err)
	}
	return nil
}

// refresh loads h's certificate and key from storage into the table's
// certificates (a certificate never replaces one that lasts longer) and
// returns its expiry.
func (m *Manager) refresh(ctx context.Context, h string) (time.Time, error) {
	ik := m.issuer.IssuerKey()
	certPEM, err := m.storage.Load(ctx, certmagic.StorageKeys.SiteCert(ik, h))
	if err != nil {
		return time.Time{}, err
	}
	keyPEM, err := m.storage.Load(ctx, certmagic.StorageKeys.SitePrivateKey(ik, h))
	if err != nil {
		return time.Time{}, err
	}
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return time.Time{}, fmt.Errorf("certs: stored certificate of %s holds no PEM block", h)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return time.Time{}, fmt.Errorf("certs: stored certificate of %s: %w", h, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.names[h]; !ok {
		return leaf.NotAfter, fmt.Errorf("certs: %s: %w", h, ErrWithdrawn)
	}
	if cur, ok := m.certs[h]; ok && cur.NotAfter.After(leaf.NotAfter) {
		return cur.NotAfter, nil
	}
	m.certs[h] = abiroutes.Certificate{Names: []string{h}, CertPEM: string(certPEM), KeyPEM: string(keyPEM), NotAfter: leaf.NotAfter.UTC()}
	return leaf.NotAfter.UTC(), nil
}

// onEvent follows certmagic's events (docs/certificates.md section 5).
func (m *Manager) onEvent(ctx context.Context, event string, data map[string]any) error {
	switch event {
	case "cert_obtaining":
		h, _ := data["identifier"].(string)
		if !m.wanted(h) {
			return fmt.Errorf("certs: %s: %w", h, ErrWithdrawn)
		}
		renewal, _ := data["renewal"].(bool)
		if err := m.status.update(ctx, h, func(s *Status) bool {
			if renewal || !s.NotAfter.IsZero() {
				s.State = StateRenewing
			} else if s.State != StateFailed {
				s.State = StatePending
			}
			return true
		}); err != nil {
			m.log.Warn("record certificate status", "hostname", h, "error", err)
		}
	case "cert_obtained":
		h, _ := data["identifier"].(string)
		m.installed(ctx, h)
	case "cached_managed_cert":
		sans, _ := data["sans"].([]string)
		for _, h := range sans {
			if m.wanted(h) {
				m.installed(ctx, h)
			}
		}
	case "cert_failed":
		h, _ := data["identifier"].(string)
		renewal, _ := data["renewal"].(bool)
		err, _ := data["error"].(error)
		if err == nil {
			err = errors.New("certificate order failed")
		}
		if errors.Is(err, ErrWithdrawn) || !m.wanted(h) {
			return nil
		}
		if errors.Is(err, ErrDNSUnavailable) {
			m.waitDNS(ctx, h, renewal, err)
			return nil
		}
		m.fail(ctx, h, renewal, err)
	}
	return nil
}

// installed takes h's stored certificate into the table, records it issued
// and pushes the table.
func (m *Manager) installed(ctx context.Context, h string) {
	notAfter, err := m.refresh(ctx, h)
	if err != nil {
		if !errors.Is(err, ErrWithdrawn) {
			m.log.Warn("load obtained certificate", "hostname", h, "error", err)
		}
		return
	}
	m.metrics.notAfter.WithLabelValues(h).Set(float64(notAfter.Unix()))
	if err := m.status.update(ctx, h, func(s *Status) bool {
		if notAfter.Before(s.NotAfter) {
			return false // a later certificate is recorded already
		}
		s.State, s.NotAfter, s.LastError = StateIssued, notAfter, ""
		return true
	}); err != nil {
		m.log.Warn("record certificate status", "hostname", h, "error", err)
	}
	m.log.Info("certificate installed", "hostname", h, "not_after", notAfter)
	if err := m.push(ctx); err != nil {
		m.log.Warn("push route table with new certificate", "hostname", h, "error", err)
	}
}

// waitDNS records an order of h that could not publish its DNS-01 record
// because DNS is down or unreachable (docs/certificates.md section 8): no
// CA refused anything, so h stays pending (renewing while a certificate is
// held) with the error as last_error, and certmagic tries again with
// backoff. It raises no failure event and counts no failure.
func (m *Manager) waitDNS(ctx context.Context, h string, renewal bool, err error) {
	detail := ProblemDetail(err)
	m.log.Warn("certificate order waits for DNS", "hostname", h, "renewal", renewal, "error", detail)
	if uerr := m.status.update(ctx, h, func(s *Status) bool {
		s.State = StatePending
		if !s.NotAfter.IsZero() {
			s.State = StateRenewing
		}
		s.LastError = detail
		return true
	}); uerr != nil {
		m.log.Warn("record certificate status", "hostname", h, "error", uerr)
	}
}

// fail records a failed order of h (the certificate held, if any, keeps
// serving), counts it and raises an event.
func (m *Manager) fail(ctx context.Context, h string, renewal bool, err error) {
	detail := ProblemDetail(err)
	m.metrics.failures.Inc()
	m.log.Warn("certificate order failed", "hostname", h, "renewal", renewal, "error", detail)
	if uerr := m.status.update(ctx, h, func(s *Status) bool {
		s.State, s.LastError = StateFailed, detail
		return true
	}); uerr != nil {
		m.log.Warn("record certificate status", "hostname", h, "error", uerr)
	}
	if m.cfg.Events != nil {
		if _, _, eerr := m.cfg.Events.Append(ctx, failedEvent(h, renewal, detail, m.cfg.Now())); eerr != nil {
			m.log.Warn("record certificate event", "hostname", h, "error", eerr)
		}
	}
}
