package rollout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
)

// Spec sources.
const (
	// SourceService: the spec is derived from the service document (its replicas and health
	// check) and follows every service write.
	SourceService = "service"
	// SourceOperator: the spec was written through the spec endpoint and owns placement.
	SourceOperator = "operator"
)

// SpecDoc is a document of collection "runtime_specs", one per service (_id the service id),
// written with one compare-and-set on Revision (docs/reconciliation.md section 1).
type SpecDoc struct {
	ServiceID string `bson:"_id"`
	// Revision equals Spec.Revision.
	Revision  int64      `bson:"revision"`
	Source    string     `bson:"source"`
	Spec      slots.Spec `bson:"spec"`
	UpdatedAt time.Time  `bson:"updated_at"`
	// LogOutbox holds the operator writes of this spec not yet in the
	// change log, written with them (docs/node-protocol.md section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
	// Reconcile is the pending reconcile request of an operator's write of the spec, written in
	// the same compare-and-set and cleared by the reconciler once a pass acted on it
	// ([Store.ClearSpecReconcile]), as a service document's ([services.Service.Reconcile]); nil
	// when none is pending. A derived spec writes none: the service's own write carries it.
	Reconcile *services.ReconcileRequest `bson:"reconcile,omitempty" json:"-"`
}

// AttemptRow is one attempt of a slot as stored.
type AttemptRow struct {
	ID          string `bson:"id"`
	Key         string `bson:"key"`
	Predecessor string `bson:"predecessor,omitempty"`
}

// SlotRow is one slot `<service>/<replica>` as stored in its service's slot set.
type SlotRow struct {
	Replica string `bson:"replica"`
	NodeID  string `bson:"node_id"`
	// Generation is 1 run, 2 stop or 3 remove for Attempt; Acked the highest receipt joined.
	Generation int        `bson:"generation"`
	Acked      int        `bson:"acked"`
	Attempt    AttemptRow `bson:"attempt"`
	// WorkloadID is the workload document that runs Attempt on NodeID.
	WorkloadID string `bson:"workload_id"`
	// Ancestors are the attempts before Attempt, newest first, at most slots.MaxAncestors.
	Ancestors   []AttemptRow `bson:"ancestors,omitempty"`
	CommittedAt time.Time    `bson:"committed_at"`
	// LastFailure is the newest failure of the slot's earlier attempts, carried from attempt to
	// attempt when a successor is committed (its Count sums theirs), and FailureKey the attempt
	// key that failed; nil when none of them failed. The current attempt's own failure is on its
	// workload.
	LastFailure *services.Failure `bson:"last_failure,omitempty"`
	FailureKey  string            `bson:"failure_key,omitempty"`
}

// carry returns the failure a successor of row inherits, with w the workload of row's attempt
// (nil when gone): w's own failure when it reported one (its count already includes the earlier
// attempts', [services.Workload.FailureBase]), otherwise row's carried failure.
func carry(row SlotRow, w *services.Workload) (*services.Failure, string) {
	if f := ownFailure(row, w); f != nil {
		return f, row.Attempt.Key
	}
	return row.LastFailure, row.FailureKey
}

// ownFailure returns the failure the node reported of w, row's current attempt, and nil while
// w shows only the failure it inherited from the earlier attempts.
func ownFailure(row SlotRow, w *services.Workload) *services.Failure {
	if w == nil || w.LastFailure == nil || w.LastFailure.Equal(row.LastFailure) {
		return nil
	}
	f := *w.LastFailure
	return &f
}

// SlotSet is a document of collection "slots": every slot of one service (_id the service id).
// All of a service's slots live in one document so that each commit re-decides over one
// consistent read of them and writes with one compare-and-set on Revision
// (docs/reconciliation.md section 6).
type SlotSet struct {
	ServiceID string    `bson:"_id"`
	Revision  int64     `bson:"revision"`
	Slots     []SlotRow `bson:"slots"`
}

// StatusDoc is a document of collection "runtime_status": a service's verdict, written only
// when it changed (docs/reconciliation.md section 7).
type StatusDoc struct {
	ServiceID string        `bson:"_id"`
	Verdict   slots.Verdict `bson:"verdict"`
	ChangedAt time.Time     `bson:"changed_at"`
	// ServiceRevision is the service document revision the verdict was decided over: a release
	// change does not move the spec revision, so a verdict older than the service is not yet
	// about what the service runs now.
	ServiceRevision int64 `bson:"service_revision"`
	// Progress is how far the current rollout came (docs/reconciliation.md section 7.2); nil
	// before the first sweep kept one, and for a service being deleted.
	Progress *slots.Progress `bson:"progress,omitempty"`
}

// Store reads and writes runtime specs, slot sets and verdicts.
type Store struct {
	st     *store.Store
	specs  *mongo.Collection
	slots  *mongo.Collection
	status *mongo.Collection
	// refusals holds the refused changes the verdict shows ([DeployRefusal]).
	refusals *mongo.Collection
	catalog  *services.Catalog
	now      func() time.Time
}

// NewStore returns a Store over st; now may be nil (time.Now).
func NewStore(st *store.Store, catalog *services.Catalog, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{st: st, specs: st.Collection("runtime_specs"), slots: st.Collection("slots"),
		status: st.Collection("runtime_status"), refusals: st.Collection(RefusalsCollection), catalog: catalog, now: now}
}

// Spec returns the stored spec document of a service, nil when there is none.
func (s *Store) Spec(ctx context.Context, serviceID string) (*SpecDoc, error) {
	var d SpecDoc
	err := s.st.View().Get(ctx, s.specs, serviceID, &d)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// DerivedSpec returns the spec a service without an operator spec runs under: scheduled
// placement of its replicas, an http readiness probe on its port (the node probes every
// workload's port over http), host network, no resource limits beyond the service's own.
func DerivedSpec(svc *services.Service) slots.Spec {
	path := svc.HealthCheck.Path
	if path == "" {
		path = "/"
	}
	sp := slots.Spec{
		Placement: slots.Placement{Mode: slots.PlacementScheduled},
		Replicas:  slots.Replicas{Total: max(svc.Replicas, 0)},
		Readiness: slots.Probe{Kind: slots.ProbeHTTP, Port: svc.Port, Path: path},
		Network:   slots.NetworkHost,
	}
	if svc.Port <= 0 {
		sp.Readiness = slots.Probe{Kind: slots.ProbeProcess}
	}
	if ms := svc.HealthCheck.IntervalS; ms > 0 {
		sp.Readiness.IntervalMS = int64(ms) * 1000
	}
	if ms := svc.HealthCheck.TimeoutS; ms > 0 {
		sp.Readiness.TimeoutMS = int64(ms) * 1000
	}
	sp.Readiness.Failures = svc.HealthCheck.Failures
	return sp
}

// SpecInForce returns the spec svc runs under: its stored spec, or, while none is stored, an
// unstored document of source service holding [DerivedSpec] of svc (revision 0). It writes
// nothing.
func (s *Store) SpecInForce(ctx context.Context, svc *services.Service) (*SpecDoc, error) {
	d, err := s.Spec(ctx, svc.ID)
	if err != nil {
		return nil, err
	}
	if d == nil {
		d = &SpecDoc{ServiceID: svc.ID, Source: SourceService, Spec: DerivedSpec(svc)}
	}
	return d, nil
}

// EnsureDerivedSpec keeps the spec of a service that has no operator spec equal to
// [DerivedSpec]: it inserts one at revision 1, or replaces a stale derived one with one
// compare-and-set on its revision. An operator spec is returned unchanged. It returns the
// spec in force.
func (s *Store) EnsureDerivedSpec(ctx context.Context, svc *services.Service) (*SpecDoc, error) {
	// Two writers (an API request and a sweep) may derive at once: the loser reads the winner's
	// spec and derives again, as the store's retry policy says.
	var d *SpecDoc
	err := store.RetryOnConflict(ctx, func() (err error) {
		d, err = s.ensureDerivedSpec(ctx, svc)
		return err
	}, &slots.Refusal{Reason: slots.ReasonConflict})
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (s *Store) ensureDerivedSpec(ctx context.Context, svc *services.Service) (*SpecDoc, error) {
	cur, err := s.Spec(ctx, svc.ID)
	if err != nil || (cur != nil && cur.Source == SourceOperator) {
		return cur, err
	}
	var expected *int64
	if cur != nil {
		expected = &cur.Revision
	}
	ports := []int{}
	if svc.Port > 0 {
		ports = append(ports, svc.Port)
	}
	want := DerivedSpec(svc)
	next, err := slots.NextSpec(slots.SpecWrite{Spec: want, ExpectedRevision: expected}, slots.ServiceFacts{Exists: true, Ports: ports}, specOf(cur), nil)
	if err != nil {
		// A service whose derived values are out of bounds (more than 256 replicas, a health
		// check outside the probe's limits) runs under the closest valid spec.
		want.Replicas.Total = min(want.Replicas.Total, slots.MaxReplicas)
		want.Readiness = slots.Probe{Kind: want.Readiness.Kind, Port: want.Readiness.Port, Path: want.Readiness.Path}
		if next, err = slots.NextSpec(slots.SpecWrite{Spec: want, ExpectedRevision: expected}, slots.ServiceFacts{Exists: true, Ports: ports}, specOf(cur), nil); err != nil {
			return nil, fmt.Errorf("derive runtime spec of %s: %w", svc.ID, err)
		}
	}
	if cur != nil && sameSpec(cur.Spec, next) {
		return cur, nil
	}
	return s.writeSpec(ctx, svc.ID, cur, next, SourceService)
}

// PutSpec applies an operator's spec write (docs/reconciliation.md section 1): expected nil
// states that the writer read no operator spec. Refusals are *slots.Refusal values by name
// (conflict, service-not-found, service-deleting, spec-node-unknown, ...). nodes are the ids of
// enrolled nodes that are not retired.
func (s *Store) PutSpec(ctx context.Context, svc *services.Service, w slots.SpecWrite, nodes map[string]bool) (*SpecDoc, error) {
	facts := slots.ServiceFacts{Exists: svc != nil}
	var cur *SpecDoc
	if svc != nil {
		facts.Deleting = svc.Deleting
		if svc.Port > 0 {
			facts.Ports = []int{svc.Port}
		}
		var err error
		if cur, err = s.Spec(ctx, svc.ID); err != nil {
			return nil, err
		}
	}
	// A derived spec is not the operator's: stating null over it is the first operator write.
	read := specOf(cur)
	exp := w.ExpectedRevision
	if cur != nil && cur.Source == SourceService {
		read = nil
		if exp == nil {
			exp = &cur.Revision
		} else {
			return nil, &slots.Refusal{Reason: slots.ReasonConflict, Detail: "no operator spec exists (the spec in force is derived from the service)"}
		}
	}
	check := slots.SpecWrite{Spec: w.Spec, ExpectedRevision: w.ExpectedRevision}
	if _, err := slots.NextSpec(check, facts, read, nodes); err != nil {
		return nil, err
	}
	next, err := slots.NextSpec(slots.SpecWrite{Spec: w.Spec, ExpectedRevision: exp}, facts, specOf(cur), nodes)
	if err != nil {
		return nil, err
	}
	return s.writeSpec(ctx, svc.ID, cur, next, SourceOperator)
}

// writeSpec stores next (whose revision is one above cur's) as one compare-and-set, or inserts
// it when cur is nil. A lost race is a conflict refusal.
func (s *Store) writeSpec(ctx context.Context, serviceID string, cur *SpecDoc, next slots.Spec, source string) (*SpecDoc, error) {
	d := &SpecDoc{ServiceID: serviceID, Revision: next.Revision, Source: source, Spec: next, UpdatedAt: s.now().UTC()}
	// An operator's write is a change of desired state; a spec derived
	// from the service is not (the service's own entry records it).
	var pend *changelog.Pending
	if a, ok := changelog.ActorFrom(ctx); ok && source == SourceOperator {
		p, err := changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: "runtime_spec", EntityID: serviceID, Op: node.OpUpdate, Payload: next})
		if err != nil {
			return nil, fmt.Errorf("store runtime spec of %s: %w", serviceID, err)
		}
		pend = &p
		d.LogOutbox = []changelog.Pending{p}
	}
	if source == SourceOperator {
		d.Reconcile = &services.ReconcileRequest{Revision: next.Revision, Cause: services.CauseSpec, At: d.UpdatedAt}
	}
	if cur == nil {
		if _, err := s.specs.InsertOne(ctx, d); err != nil {
			if store.IsDuplicateKey(err) {
				return nil, &slots.Refusal{Reason: slots.ReasonConflict, Detail: "a spec was written concurrently"}
			}
			return nil, fmt.Errorf("store runtime spec of %s: %w", serviceID, err)
		}
		return d, nil
	}
	update := bson.M{"$set": bson.M{"source": source, "spec": next, "updated_at": d.UpdatedAt}}
	if d.Reconcile != nil {
		update["$set"].(bson.M)["reconcile"] = d.Reconcile
	}
	if pend != nil {
		update["$push"] = bson.M{changelog.OutboxField: *pend}
	}
	_, err := s.st.UpdateIfRevision(ctx, s.specs, serviceID, cur.Revision, update)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return nil, &slots.Refusal{Reason: slots.ReasonConflict, Detail: "the spec changed concurrently"}
	}
	if err != nil {
		return nil, fmt.Errorf("store runtime spec of %s: %w", serviceID, err)
	}
	return d, nil
}

// ClearSpecReconcile removes the reconcile request of service serviceID's runtime spec while the
// spec is still at revision rev, with one compare-and-set that leaves the revision alone; it
// reports whether it cleared (false: a newer write, whose request stays, or no spec). Only the
// reconciler calls it.
func (s *Store) ClearSpecReconcile(ctx context.Context, serviceID string, rev int64) (bool, error) {
	ok, err := s.st.UpdateIf(ctx, s.specs, serviceID, bson.D{{Key: store.RevisionField, Value: rev}},
		bson.M{"$unset": bson.M{"reconcile": ""}})
	if err != nil {
		return false, fmt.Errorf("clear reconcile request of the runtime spec of %s at revision %d: %w", serviceID, rev, err)
	}
	return ok, nil
}

// PendingSpecs returns the ids of the services whose runtime spec holds a reconcile request,
// each with the spec revision; read from the store's read view.
func (s *Store) PendingSpecs(ctx context.Context) (map[string]int64, error) {
	var docs []SpecDoc
	if err := s.st.View().Find(ctx, s.specs, nil, &docs); err != nil {
		return nil, fmt.Errorf("pending runtime spec requests: %w", err)
	}
	out := map[string]int64{}
	for _, d := range docs {
		if d.Reconcile != nil {
			out[d.ServiceID] = d.Revision
		}
	}
	return out, nil
}

// WatchSpecs returns a subscription to the writes of runtime specs (by service id), as
// [services.Catalog.WatchServices] does for services. The caller closes it.
func (s *Store) WatchSpecs(limit int) *store.Subscription {
	return s.st.View().Subscribe(s.specs.Name(), limit)
}

func specOf(d *SpecDoc) *slots.Spec {
	if d == nil {
		return nil
	}
	sp := d.Spec
	sp.Revision = d.Revision
	return &sp
}

// sameSpec compares two specs apart from their revisions.
func sameSpec(a, b slots.Spec) bool {
	a.Revision, b.Revision, a.RunRevision, b.RunRevision = 0, 0, 0, 0
	ra, _ := bson.Marshal(a)
	rb, _ := bson.Marshal(b)
	return string(ra) == string(rb)
}

// Slots returns a service's slot set; a service without one gets an empty set at revision 0.
func (s *Store) Slots(ctx context.Context, serviceID string) (*SlotSet, error) {
	var set SlotSet
	err := s.st.View().Get(ctx, s.slots, serviceID, &set)
	if errors.Is(err, store.ErrNotFound) {
		return &SlotSet{ServiceID: serviceID}, nil
	}
	if err != nil {
		return nil, err
	}
	return &set, nil
}

// ServicesWithSlots returns the ids of every service that has a slot set.
func (s *Store) ServicesWithSlots(ctx context.Context) ([]string, error) {
	var ids []struct {
		ID string `bson:"_id"`
	}
	if err := s.st.View().Find(ctx, s.slots, nil, &ids); err != nil {
		return nil, fmt.Errorf("list slot sets: %w", err)
	}
	out := make([]string, len(ids))
	for i, d := range ids {
		out[i] = d.ID
	}
	return out, nil
}

// writeSlots stores set's rows with one compare-and-set on the revision read (0: the set did
// not exist, so it is inserted). It returns slots.ErrConflict (wrapped) when the set moved.
func (s *Store) writeSlots(ctx context.Context, set *SlotSet, rows []SlotRow) error {
	if set.Revision == 0 {
		_, err := s.slots.InsertOne(ctx, SlotSet{ServiceID: set.ServiceID, Revision: 1, Slots: rows})
		if store.IsDuplicateKey(err) {
			return fmt.Errorf("slot set of %s created concurrently: %w", set.ServiceID, slots.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("store slot set of %s: %w", set.ServiceID, err)
		}
		set.Revision, set.Slots = 1, rows
		return nil
	}
	rev, err := s.st.UpdateIfRevision(ctx, s.slots, set.ServiceID, set.Revision, bson.M{"$set": bson.M{"slots": rows}})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("slot set of %s moved: %w", set.ServiceID, slots.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("store slot set of %s: %w", set.ServiceID, err)
	}
	set.Revision, set.Slots = rev, rows
	return nil
}

// Verdict returns a service's stored verdict, nil when none was written.
func (s *Store) Verdict(ctx context.Context, serviceID string) (*StatusDoc, error) {
	var d StatusDoc
	err := s.st.View().Get(ctx, s.status, serviceID, &d)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// writeVerdict stores v, decided over service revision svcRev, when it differs from prev (nil:
// none stored) or prev was decided over another service revision, and reports whether the
// verdict itself changed (its changed_at moves only then). The verdict document has a single
// writer, the sweep.
//
// progress (nil: none) is written with it, and a change of progress alone writes too.
func (s *Store) writeVerdict(ctx context.Context, serviceID string, prev *StatusDoc, v slots.Verdict, svcRev int64, progress *slots.Progress) (bool, error) {
	var pv *slots.Verdict
	if prev != nil {
		pv = &prev.Verdict
	}
	changed := slots.VerdictChanged(pv, v)
	if !changed && prev.ServiceRevision == svcRev && sameProgress(prev.Progress, progress) {
		return false, nil
	}
	if progress != nil {
		p := *progress
		p.At = p.At.UTC().Truncate(time.Millisecond) // as stored
		progress = &p
	}
	d := StatusDoc{ServiceID: serviceID, Verdict: v, ChangedAt: s.now().UTC(), ServiceRevision: svcRev, Progress: progress}
	if !changed {
		d.ChangedAt = prev.ChangedAt
	}
	if _, err := s.status.ReplaceOne(ctx, bson.D{{Key: "_id", Value: serviceID}}, d, replaceUpsert()); err != nil {
		return false, fmt.Errorf("store verdict of %s: %w", serviceID, err)
	}
	return changed, nil
}

// sameProgress reports whether a and b (either nil) are the same progress, to the millisecond
// the store keeps.
func sameProgress(a, b *slots.Progress) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	x, y := *a, *b
	x.At, y.At = x.At.UTC().Truncate(time.Millisecond), y.At.UTC().Truncate(time.Millisecond)
	return x == y
}

// forget removes a service's spec, slot set and verdict (the end of its deletion).
func (s *Store) forget(ctx context.Context, serviceID string) error {
	for _, c := range []*mongo.Collection{s.slots, s.specs, s.status, s.refusals} {
		if _, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: serviceID}}); err != nil {
			return fmt.Errorf("forget %s of %s: %w", c.Name(), serviceID, err)
		}
	}
	return nil
}

// SlotFailure returns the newest failure of a slot with row and its current workload w (nil
// when gone), as the views show it: the workload's own (counted across attempts) or the one the
// slot carries. nil when no attempt of the slot failed.
func SlotFailure(row SlotRow, w *services.Workload) *services.Failure {
	f, _ := carry(row, w)
	return f
}
