// Package dnsrecords is berthd's side of DNS (docs/dns.md sections 6 to 8): the desired RRsets,
// one document per record, and the durable operations that write them through the DNS plugin.
package dnsrecords

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per record (docs/dns.md section 6.1).
const Collection = "dns_records"

// Operation constants (docs/dns.md section 6.2). Every DNS write is an operation of kind
// KindWrite in the fence sequence of project ProjectID, targeted at Target so that no runner
// node ever claims it; a fence from one sequence for every record keeps each record's fencing
// tokens increasing whichever part of berthd asked for the write.
const (
	KindWrite = "dns.write"
	ProjectID = "dns"
	Target    = "core:dns"
)

// MaxAttempts is the attempt limit of a DNS write: with the queue's backoff (1 s doubling to
// 5 min) a server that stays down is retried for about three days.
const MaxAttempts = 900

// Writer is what the package needs of the DNS provider plugin; *host/plugin.Provider is one.
type Writer interface {
	Plan(ctx context.Context, req *abiprovider.PlanRequest) (*abiprovider.PlanResponse, error)
	Apply(ctx context.Context, req *abiprovider.ApplyRequest) (*abiprovider.ApplyResponse, error)
	Delete(ctx context.Context, req *abiprovider.DeleteRequest) (*abiprovider.DeleteResponse, error)
}

// TXTPublisher publishes and clears the TXT records of ACME DNS-01 challenges; [*Records] is one.
type TXTPublisher interface {
	PresentTXT(ctx context.Context, fqdn, value string) error
	CleanupTXT(ctx context.Context, fqdn, value string) error
}

var _ TXTPublisher = (*Records)(nil)

// Config configures [New]. Store, Queue and Writer are required.
type Config struct {
	Store  *store.Store
	Queue  *operations.Queue
	Writer Writer
	// Zones are the zones the DNS plugin is configured for; a name outside them is refused
	// dns_zone_not_served before anything is written. At least one.
	Zones []string
	// TTL of every record written, in seconds; 0 means 300. Challenge TXT records use
	// ChallengeTTL (0: 60).
	TTL, ChallengeTTL uint32
	// Poll is how often the worker looks for due retries when nothing woke it; 0 means 5 s.
	Poll time.Duration
	// Logger receives one line per write and failure; nil discards.
	Logger *slog.Logger
	// ChallengeMaxAge is how long a challenge value (ACME or node) may be held before the
	// resume pass withdraws it: a holder that died between its present and its cleanup leaves
	// nothing behind for longer. 0 means 1 h.
	ChallengeMaxAge time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Records owns the dns_records collection and runs the DNS write worker. Safe for concurrent use
// by any number of berthd processes on one store: every change of a record is one
// compare-and-set on its document.
type Records struct {
	cfg   Config
	zones []string // lower case, no trailing dot, longest first
	log   *slog.Logger
	wake  chan struct{}
}

// New returns Records over cfg. It does no I/O.
func New(cfg Config) (*Records, error) {
	if cfg.Store == nil || cfg.Queue == nil || cfg.Writer == nil {
		return nil, errors.New("dnsrecords: store, queue and writer are required")
	}
	if len(cfg.Zones) == 0 {
		return nil, errors.New("dnsrecords: at least one zone")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 300
	}
	if cfg.ChallengeTTL == 0 {
		cfg.ChallengeTTL = 60
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ChallengeMaxAge <= 0 {
		cfg.ChallengeMaxAge = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Records{cfg: cfg, log: cfg.Logger.With("component", "dns"), wake: make(chan struct{}, 1)}
	for _, z := range cfg.Zones {
		r.zones = append(r.zones, strings.TrimSuffix(strings.ToLower(z), "."))
	}
	slices.SortFunc(r.zones, func(a, b string) int { return len(b) - len(a) })
	return r, nil
}

// Holding is one holder's values of a record: a service's edge addresses, one ACME challenge,
// one node's challenge.
type Holding struct {
	Holder string    `bson:"holder"`
	Values []string  `bson:"values"`
	Since  time.Time `bson:"since"` // when the holder set these values
}

// Record is a document of [Collection]: a record's desired RRset as the union of its holdings,
// and how far the server has caught up (docs/dns.md section 6.1).
type Record struct {
	ID       string    `bson:"_id"` // the plugin's resource id, "<zone>/<name>/<type>"
	FQDN     string    `bson:"fqdn"`
	Type     string    `bson:"type"`
	TTL      uint32    `bson:"ttl"`
	Holdings []Holding `bson:"holdings"`
	// Generation counts the changes of the desired RRset; Written is the generation the server
	// was last seen to hold; Failed, with LastError and LastCode, the last generation whose write
	// failed for good.
	Generation int64     `bson:"generation"`
	Written    int64     `bson:"written"`
	Failed     int64     `bson:"failed"`
	LastError  string    `bson:"last_error,omitempty"`
	LastCode   string    `bson:"last_code,omitempty"`
	UpdatedAt  time.Time `bson:"updated_at"`
	Revision   int64     `bson:"revision"`
}

// Values is the desired RRset: every holding's values, sorted, without duplicates.
func (r *Record) Values() []string {
	var out []string
	for _, h := range r.Holdings {
		out = append(out, h.Values...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Name splits fqdn into the configured zone that holds it (the longest) and the name relative to
// it ("@" for the apex). Errors: dns_zone_not_served.
func (r *Records) Name(fqdn string) (zone, name string, err error) {
	n := strings.TrimSuffix(strings.ToLower(fqdn), ".")
	for _, z := range r.zones {
		switch {
		case n == z:
			return z, "@", nil
		case strings.HasSuffix(n, "."+z):
			return z, strings.TrimSuffix(n, "."+z), nil
		}
	}
	return "", "", abierrors.New(abierrors.DNSZoneNotServed, fmt.Sprintf("%s is in none of the DNS zones %v", fqdn, r.zones))
}

// Served reports whether fqdn is in one of the configured zones.
func (r *Records) Served(fqdn string) bool {
	_, _, err := r.Name(fqdn)
	return err == nil
}

// recordID is the resource id of fqdn's record of type typ.
func (r *Records) recordID(fqdn, typ string) (string, error) {
	zone, name, err := r.Name(fqdn)
	if err != nil {
		return "", err
	}
	return zone + "/" + name + "/" + typ, nil
}

// Set makes holder's values of fqdn's record of type typ ("A", "AAAA", "TXT", "CNAME") exactly
// values (nil or empty removes the holding) with one compare-and-set on the record's document,
// then enqueues the write. It returns the record's generation after the change; a call that
// changes nothing returns the current one (and enqueues the write again when the server has not
// caught up: the enqueue is idempotent). Errors: dns_zone_not_served; store errors.
func (r *Records) Set(ctx context.Context, fqdn, typ, holder string, values []string) (int64, error) {
	return r.set(ctx, fqdn, typ, holder, values, r.cfg.TTL, false)
}

// set is Set with the TTL of a new record; retryFailed makes a call that changes nothing count
// the generation up anyway when its write failed for good, so that asking again tries again.
func (r *Records) set(ctx context.Context, fqdn, typ, holder string, values []string, ttl uint32, retryFailed bool) (int64, error) {
	id, err := r.recordID(fqdn, typ)
	if err != nil {
		return 0, err
	}
	values = slices.Compact(slices.Sorted(slices.Values(values)))
	var gen int64
	err = store.RetryOnConflict(ctx, func() error {
		var cur Record
		err := r.cfg.Store.Get(ctx, Collection, id, &cur)
		if errors.Is(err, store.ErrNotFound) {
			if len(values) == 0 {
				gen = 0
				return nil // nothing held, nothing to withdraw
			}
			now := r.cfg.Now().UTC()
			doc := Record{ID: id, FQDN: dnsFQDN(fqdn), Type: typ, TTL: ttl, Holdings: []Holding{{Holder: holder, Values: values, Since: now}},
				Generation: 1, UpdatedAt: now}
			if err := r.cfg.Store.Insert(ctx, Collection, doc); store.IsDuplicateKey(err) {
				return fmt.Errorf("dnsrecords: create %s: created meanwhile: %w", id, store.ErrConflict)
			} else if err != nil {
				return fmt.Errorf("dnsrecords: create %s: %w", id, err)
			}
			gen = 1
			return r.enqueue(ctx, &doc)
		}
		if err != nil {
			return fmt.Errorf("dnsrecords: %w", err)
		}
		next := withHolding(cur.Holdings, holder, values, r.cfg.Now().UTC())
		same := slices.EqualFunc(next, cur.Holdings, func(a, b Holding) bool { return a.Holder == b.Holder && slices.Equal(a.Values, b.Values) })
		if same && !(retryFailed && cur.Failed >= cur.Generation) {
			if cur.Written < cur.Generation && cur.Failed < cur.Generation {
				gen = cur.Generation
				return r.enqueue(ctx, &cur)
			}
			gen = cur.Generation
			return nil
		}
		cur.Holdings, cur.Generation, cur.UpdatedAt = next, cur.Generation+1, r.cfg.Now().UTC()
		rev, err := r.cfg.Store.SetIfRevision(ctx, Collection, id, cur.Revision, store.Fields{
			"holdings": cur.Holdings, "generation": cur.Generation, "updated_at": cur.UpdatedAt})
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("dnsrecords: update %s: removed meanwhile: %w", id, store.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("dnsrecords: update %s: %w", id, err)
		}
		cur.Revision = rev
		gen = cur.Generation
		return r.enqueue(ctx, &cur)
	})
	return gen, err
}

func dnsFQDN(s string) string { return strings.TrimSuffix(strings.ToLower(s), ".") + "." }

// withHolding returns hs with holder's values replaced (removed when values is empty), sorted by
// holder; a holding whose values do not change keeps its Since, a changed one gets now.
func withHolding(hs []Holding, holder string, values []string, now time.Time) []Holding {
	out := make([]Holding, 0, len(hs)+1)
	since := now
	for _, h := range hs {
		if h.Holder != holder {
			out = append(out, h)
		} else if slices.Equal(h.Values, values) {
			since = h.Since
		}
	}
	if len(values) > 0 {
		out = append(out, Holding{Holder: holder, Values: values, Since: since})
	}
	slices.SortFunc(out, func(a, b Holding) int { return strings.Compare(a.Holder, b.Holder) })
	return out
}

// writePayload is a DNS write operation's payload: which record, at which generation. The
// worker writes what the record holds when it runs, never an older state from a payload.
type writePayload struct {
	Record     string `json:"record"`
	Generation int64  `json:"generation"`
}

// enqueue records the write of rec's current generation as an operation; its idempotency key is
// derived from the record id, the value set and the generation, so a repeat converges.
func (r *Records) enqueue(ctx context.Context, rec *Record) error {
	payload, _ := json.Marshal(writePayload{Record: rec.ID, Generation: rec.Generation}) // cannot fail
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%q\x00%d", rec.ID, rec.Values(), rec.Generation))
	_, _, err := r.cfg.Queue.Enqueue(ctx, operations.EnqueueRequest{ProjectID: ProjectID, Kind: KindWrite,
		IdempotencyKey: "dns:" + hex.EncodeToString(sum[:16]), Payload: payload, TargetNode: Target, MaxAttempts: MaxAttempts})
	if err != nil {
		return fmt.Errorf("dnsrecords: enqueue the write of %s: %w", rec.ID, err)
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

// Get returns the record document of fqdn and type. Errors: wrapping store.ErrNotFound.
func (r *Records) Get(ctx context.Context, fqdn, typ string) (*Record, error) {
	id, err := r.recordID(fqdn, typ)
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := r.cfg.Store.Get(ctx, Collection, id, &rec); err != nil {
		return nil, fmt.Errorf("dnsrecords: %w", err)
	}
	return &rec, nil
}

// waitEvery is how often Wait reads the record.
const waitEvery = 100 * time.Millisecond

// Wait returns once the server holds generation gen (or a later one) of fqdn's record of type
// typ, or with the error of the write that failed for good at or after gen (its code kept), or
// ctx's error. A record that no longer exists has been withdrawn: success.
func (r *Records) Wait(ctx context.Context, fqdn, typ string, gen int64) error {
	t := time.NewTicker(waitEvery)
	defer t.Stop()
	for {
		rec, err := r.Get(ctx, fqdn, typ)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil && ctx.Err() == nil:
			return err
		case err == nil && rec.Written >= gen:
			return nil
		case err == nil && rec.Failed >= gen:
			return fmt.Errorf("dns record %s: %w", rec.ID, abierrors.New(abierrors.Code(rec.LastCode), rec.LastError))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the dns record %s %s: %w", fqdn, typ, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// SplitAddresses returns the IPv4 and the IPv6 addresses among addrs (others are dropped), as
// net.IP prints them.
func SplitAddresses(addrs []string) (v4, v6 []string) {
	for _, a := range addrs {
		ip := net.ParseIP(a)
		switch {
		case ip == nil:
		case ip.To4() != nil:
			v4 = append(v4, ip.To4().String())
		default:
			v6 = append(v6, ip.String())
		}
	}
	return v4, v6
}
