package certs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mholt/acmez/v3/acme"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// StatusCollection holds one [Status] document per hostname
// (docs/certificates.md section 5).
const StatusCollection = "certificates"

// State is a hostname's certificate state.
type State string

// Certificate states (docs/certificates.md section 5).
const (
	// StatePending: no certificate yet; an order is under way or waits for
	// its next try (LastError says why when DNS did not take a DNS-01
	// record: [ErrDNSUnavailable]).
	StatePending State = "pending"
	// StateIssued: a certificate is held and served.
	StateIssued State = "issued"
	// StateRenewing: a certificate is held and served while a newer one is
	// ordered.
	StateRenewing State = "renewing"
	// StateFailed: the last order failed (LastError says why); it is retried
	// with backoff, and a certificate held keeps serving until NotAfter.
	StateFailed State = "failed"
)

// EventCertificateFailed is the event type raised per failed order, with
// data {hostname, renewal, error}.
const EventCertificateFailed = "certificate.failed"

// Status is one hostname's certificate status as stored.
type Status struct {
	Hostname string `bson:"_id" json:"hostname"`
	State    State  `bson:"state" json:"state"`
	// Challenge is how the hostname is validated: "http-01" or "dns-01".
	Challenge string `bson:"challenge" json:"challenge"`
	// NotAfter is the expiry of the certificate held; zero when none.
	NotAfter time.Time `bson:"not_after" json:"not_after,omitzero"`
	// LastError is the last failure: the CA's problem type and detail when
	// the CA refused, else what failed; empty after a success.
	LastError string    `bson:"last_error" json:"last_error,omitempty"`
	UpdatedAt time.Time `bson:"updated_at" json:"updated_at"`
	Revision  int64     `bson:"revision" json:"-"`
}

type statusStore struct {
	coll *mongo.Collection
	st   *store.Store
	now  func() time.Time
}

// update applies decide to h's status (a zero Status with Hostname set when
// none is stored) and writes it when decide reports a change: one insert,
// or one compare-and-set on the document's revision, re-decided on a lost
// race.
func (s *statusStore) update(ctx context.Context, h string, decide func(*Status) bool) error {
	return store.RetryOnConflict(ctx, func() error {
		var cur Status
		err := store.FindByID(ctx, s.coll, h, &cur)
		found := err == nil
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("certs: read status of %s: %w", h, err)
		}
		if !found {
			cur = Status{Hostname: h}
		}
		next := cur
		if !decide(&next) {
			return nil
		}
		next.Hostname = h
		next.UpdatedAt = s.now().UTC()
		if !found {
			next.Revision = 1
			_, err := s.coll.InsertOne(ctx, next)
			if store.IsDuplicateKey(err) {
				return fmt.Errorf("certs: store status of %s: written meanwhile: %w", h, store.ErrConflict)
			}
			if err != nil {
				return fmt.Errorf("certs: store status of %s: %w", h, err)
			}
			return nil
		}
		_, err = s.st.UpdateIfRevision(ctx, s.coll, h, cur.Revision, bson.M{"$set": bson.M{
			"state": next.State, "challenge": next.Challenge, "not_after": next.NotAfter,
			"last_error": next.LastError, "updated_at": next.UpdatedAt,
		}})
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("certs: store status of %s: cleared meanwhile: %w", h, store.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("certs: store status of %s: %w", h, err)
		}
		return nil
	})
}

// clear removes h's status (a withdrawn hostname); absent is done.
func (s *statusStore) clear(ctx context.Context, h string) error {
	if _, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: h}}); err != nil {
		return fmt.Errorf("certs: clear status of %s: %w", h, err)
	}
	return nil
}

// Statuses returns the stored status of each of hostnames that has one,
// keyed by hostname: one read by _id each (DESIGN.md section 4).
func Statuses(ctx context.Context, st *store.Store, hostnames []string) (map[string]Status, error) {
	coll := st.Collection(StatusCollection)
	out := make(map[string]Status, len(hostnames))
	for _, h := range hostnames {
		var s Status
		err := store.FindByID(ctx, coll, h, &s)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("certs: read status of %s: %w", h, err)
		}
		out[h] = s
	}
	return out, nil
}

// Status returns h's stored status; an error wrapping [store.ErrNotFound]
// when no route asked a certificate for h.
func (m *Manager) Status(ctx context.Context, h string) (Status, error) {
	var s Status
	if err := store.FindByID(ctx, m.status.coll, h, &s); err != nil {
		return Status{}, fmt.Errorf("certs: status of %s: %w", h, err)
	}
	return s, nil
}

// ProblemDetail says why err failed in one line: the ACME problem's type
// and detail (and those of its subproblems) when a CA refused, else err's
// text.
func ProblemDetail(err error) string {
	var p acme.Problem
	if !errors.As(err, &p) {
		return err.Error()
	}
	out := p.Type + ": " + p.Detail
	for _, sp := range p.Subproblems {
		out += "; " + sp.Type + ": " + sp.Detail
	}
	return out
}

func failedEvent(h string, renewal bool, detail string, now time.Time) node.Event {
	return node.Event{
		SchemaVersion: 1, ID: identity.NewID("evt_"), Type: EventCertificateFailed, Time: now.UTC(),
		Source:  node.EventSource{Kind: "core"},
		Subject: node.EventRef{Type: "hostname", ID: h},
		Actor:   node.EventRef{Type: "system", ID: "berthd"},
		Data:    map[string]any{"hostname": h, "renewal": renewal, "error": detail},
	}
}

type metrics struct {
	failures prometheus.Counter
	orders   prometheus.Counter
	notAfter *prometheus.GaugeVec
}

// newMetrics makes the Manager's families and registers them on reg when
// it is not nil (panicking, as MustRegister does, on a second registration).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_certificate_failures_total",
			Help: "Certificate orders and renewals that failed (the CA refused, or a challenge could not be answered)."}),
		orders: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_certificate_orders_total",
			Help: "Certificate orders this berthd sent to the ACME CA."}),
		notAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "berth_certificate_not_after_seconds",
			Help: "Expiry of the certificate held for each hostname, in Unix seconds."}, []string{"hostname"}),
	}
	if reg != nil {
		reg.MustRegister(m.failures, m.orders, m.notAfter)
	}
	return m
}

// StatusReader reads the stored certificate statuses of a store (for the API's domain views).
type StatusReader struct{ st *store.Store }

// NewStatusReader returns the status reader of st.
func NewStatusReader(st *store.Store) StatusReader { return StatusReader{st: st} }

// Statuses is [Statuses] on the reader's store.
func (r StatusReader) Statuses(ctx context.Context, hostnames []string) (map[string]Status, error) {
	return Statuses(ctx, r.st, hostnames)
}
