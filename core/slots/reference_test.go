package slots

import (
	"math/rand/v2"
	"testing"
	"time"
)

// referenceRows is a second, independent statement of the decision table: one predicate per row.
// For every input exactly one row must hold, and it must be the case DecideSlotTransition names.
func referenceRows(in Input) map[Case]bool {
	s := in.Slot
	valid := s.Exists && s.Generation >= 1 && s.Generation <= 3 && s.Acked >= 0 && s.Acked <= s.Generation
	run := valid && s.Generation == 1
	atKey := run && in.Desired && s.Attempt.Key == in.DesiredKey
	failed := s.Observed.Phase == PhaseFailed || s.Observed.Phase == PhaseStopped
	n := 0
	for _, a := range s.Ancestors {
		if n == 8 || a.Key != in.DesiredKey {
			break
		}
		n++
	}
	wait := time.Duration(1<<min(n, 6)) * 10 * time.Second
	if wait > 10*time.Minute {
		wait = 10 * time.Minute
	}
	elapsed := !in.Now.Before(s.Observed.AcceptedAt.Add(wait))
	return map[Case]bool{
		CaseAbsent:               !s.Exists && !in.Desired,
		CaseAdmitRunFirst:        !s.Exists && in.Desired && !in.StartHeld,
		CaseStartHeld:            (!s.Exists || valid && s.Generation == 3 && s.Acked == 3) && in.Desired && in.StartHeld,
		CaseInvalid:              s.Exists && !valid,
		CaseAdmitRunSuccessor:    valid && s.Generation == 3 && s.Acked == 3 && in.Desired && !in.StartHeld,
		CaseSettled:              valid && s.Generation == 3 && s.Acked == 3 && !in.Desired,
		CaseRemoveReceiptPending: valid && s.Generation == 3 && s.Acked < 3,
		CaseStopReceiptPending:   valid && s.Generation == 2 && s.Acked < 2,
		CaseRemove:               valid && s.Generation == 2 && s.Acked == 2,
		CaseUndesired:            run && !in.Desired,
		CaseDrift:                run && in.Desired && s.Attempt.Key != in.DesiredKey && !in.ReplacementInFlight,
		CaseReplacementInFlight:  run && in.Desired && s.Attempt.Key != in.DesiredKey && in.ReplacementInFlight,
		CaseFailedElapsed:        atKey && failed && elapsed,
		CaseFailedWaiting:        atKey && failed && !elapsed,
		CaseRunning:              atKey && !failed,
	}
}

func TestDecideSlotTransitionMatchesReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 50_000; i++ {
		in := randomInput(r)
		var holds []Case
		for c, ok := range referenceRows(in) {
			if ok {
				holds = append(holds, c)
			}
		}
		if len(holds) != 1 {
			t.Fatalf("input %+v: reference rows %v hold, want exactly one", in, holds)
		}
		if got := DecideSlotTransition(in).Case; got != holds[0] {
			t.Fatalf("input %+v: decided %s, reference %s", in, got, holds[0])
		}
	}
}
