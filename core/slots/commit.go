package slots

import (
	"errors"
	"fmt"
)

// ErrConflict is returned by [CheckCommit] when the slot's case or desired key moved between the
// planning read and the commit's fresh read; the caller aborts that slot's commit, records the
// verdict waiting(conflict) and leaves the slot to the next sweep. Its text carries the stable
// code "conflict".
var ErrConflict = errors.New("berth: conflict: the slot moved under the sweep")

// CheckCommit re-decides a slot from fresh, the inputs the committing compare-and-set read again
// (the slot row, the desire and the service's other slots), and returns the fresh decision when it
// is the same step as made: the same case and, for a run, the same key and predecessor. Otherwise
// it returns the fresh decision and an error wrapping [ErrConflict]. Pure; it never commits.
//
// The caller's commit is then one compare-and-set on the slot document, conditioned on the
// revision it read for fresh (docs/reconciliation.md section 6); losing that compare-and-set is a
// conflict too.
func CheckCommit(made Decision, fresh Input) (Decision, error) {
	got := DecideSlotTransition(fresh)
	switch {
	case got.Case != made.Case:
		return got, fmt.Errorf("slot %q: decided %s, now %s: %w", fresh.Slot.Replica, made.Case, got.Case, ErrConflict)
	case got.Step == StepRun && (got.Key != made.Key || got.Predecessor != made.Predecessor):
		return got, fmt.Errorf("slot %q: desired key moved: %w", fresh.Slot.Replica, ErrConflict)
	case !made.Acts():
		return got, fmt.Errorf("slot %q: case %s commits nothing: %w", fresh.Slot.Replica, made.Case, ErrConflict)
	}
	return got, nil
}
