package store

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Writes beside the plan log (docs/store.md section 2.3). A document the plan applier writes may
// also be written directly (a heartbeat on a runner node, an observation on a placement), but
// never while the applier's writes to it wait for the materializer: the store still holds the
// document as it was before them, so a compare-and-set on the revision read before the plan
// would pass and the materializer would then lay the plan's writes over a change the plan never
// saw. [Store.Settled] runs such a direct write only once the document has no folded writes,
// and [Store.Decide] keeps the applier from deciding while it runs: each side sees the other.

// Settled runs write once document id of coll has no plan writes waiting for the materializer,
// and keeps the plan applier from deciding until it returns ([Store.Decide]), so write and the
// applier's decisions on the document are ordered one after the other. It waits for the
// materializer as long as ctx allows. write must not submit a plan or wait for the applier. Use
// it for every direct write (compare-and-set, insert, delete) of a document plans write; other
// documents need nothing. On a store no applier writes to ([Store.ExpectPlans] never called) it
// runs write at once, taking no lock. Errors: write's, or ctx's wrapped when it ends while
// waiting.
func (s *Store) Settled(ctx context.Context, coll *mongo.Collection, id string, write func() error) error {
	if !s.planned.Load() {
		return write() // no applier on this store: nothing to wait for or order with
	}
	for {
		s.planMu.Lock()
		wait := s.view.pendingFor(coll.Name(), id)
		if wait == nil {
			err := write()
			s.planMu.Unlock()
			return err
		}
		s.planMu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("store: %s %s: wait for the plan log's writes to be materialized: %w", coll.Name(), id, ctx.Err())
		}
	}
}

// ExpectPlans records that a plan applier writes to this store from now on: [Store.Settled]
// orders direct writes with it from then on, and costs nothing before. plans.Open calls it
// before the applier decides anything.
func (s *Store) ExpectPlans() { s.planned.Store(true) }

// Decide runs decide while no write guarded by [Store.Settled] runs: the plan applier decides a
// batch, appends it and folds it into the view inside decide, so a guarded write either finished
// before (the view shows it) or starts after the batch is folded (and waits for its materializing).
func (s *Store) Decide(decide func()) {
	s.planMu.Lock()
	defer s.planMu.Unlock()
	decide()
}
