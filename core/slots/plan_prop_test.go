package slots

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPlanServiceProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5_000; i++ {
		in := ServiceInput{SpecRevision: 1, Now: t0.Add(time.Duration(r.IntN(120)) * time.Second)}
		n := r.IntN(7)
		for j := 0; j < n; j++ {
			rin := randomInput(r)
			s := rin.Slot
			if s.Exists {
				s.Replica = fmt.Sprint(j)
				in.Slots = append(in.Slots, s)
			}
			if rin.Desired {
				in.Desired = append(in.Desired, DesiredSlot{Replica: fmt.Sprint(j), NodeID: "nod_1", Key: []string{keyA, keyB}[r.IntN(2)]})
			}
		}
		if r.IntN(4) == 0 {
			in.Blocker = &Blocker{Refused: r.IntN(2) == 0, Reason: ReasonReleaseMissing}
		}
		if i%2 == 0 {
			in = randomService(r)
		}
		p := PlanService(in)
		// Order-independent and deterministic.
		shuffled := in
		shuffled.Slots, shuffled.Desired = slices.Clone(in.Slots), slices.Clone(in.Desired)
		r.Shuffle(len(shuffled.Slots), func(a, b int) { shuffled.Slots[a], shuffled.Slots[b] = shuffled.Slots[b], shuffled.Slots[a] })
		r.Shuffle(len(shuffled.Desired), func(a, b int) { shuffled.Desired[a], shuffled.Desired[b] = shuffled.Desired[b], shuffled.Desired[a] })
		if diff := cmp.Diff(p, PlanService(shuffled)); diff != "" {
			t.Fatalf("input order changed the plan:\n%s", diff)
		}
		state := map[string]Slot{}
		for _, sl := range in.Slots {
			state[sl.Replica] = sl
		}
		runningBefore, readyBefore := boundsCount(in, state)
		for _, sp := range p.Slots {
			if !slices.Contains(AllCases(), sp.Decision.Case) {
				t.Fatalf("unnamed case %q", sp.Decision.Case)
			}
			if sp.Withheld && (in.Blocker == nil || !sp.Decision.NeedsBuild()) {
				t.Fatalf("withheld without a blocker or for a step with no desire behind it: %+v", sp)
			}
			if in.Blocker != nil && sp.Decision.Acts() && !sp.Decision.NeedsBuild() && !sp.Commits() {
				t.Fatalf("a blocker held back a stop or removal: %+v", sp)
			}
			if in.Rollout.Paused && sp.Commits() && (sp.Decision.Case == CaseDrift || sp.Decision.Case == CaseAdmitRunFirst && BaseReplica(sp.Replica) != sp.Replica) {
				t.Fatalf("a paused rollout began a replacement: %+v", sp)
			}
			// Every plan's decision is what its own input decides.
			if d := DecideSlotTransition(sp.Input); !cmp.Equal(d, sp.Decision) {
				t.Fatalf("slot %s: plan %+v, input decides %+v", sp.Replica, sp.Decision, d)
			}
			if sp.Commits() {
				applyStep(state, sp)
			}
		}
		// The rollout's bounds: never more running than desired replicas plus the surge (or
		// than ran before), never fewer ready replicas than desired minus the unavailability
		// (or than were ready before).
		ro := resolved(in.Rollout)
		running, ready := boundsCount(in, state)
		if limit := max(runningBefore, len(in.Desired)+ro.MaxSurge); running > limit {
			t.Fatalf("plan %d: %d running after the plan, limit %d (rollout %+v)\ninput %+v", i, running, limit, ro, in)
		}
		if floor := min(readyBefore, len(in.Desired)-ro.MaxUnavailable); ready < floor {
			t.Fatalf("plan %d: %d ready replicas after the plan, floor %d (rollout %+v)\ninput %+v", i, ready, floor, ro, in)
		}
	}
}

// resolved is r as the planner reads it.
func resolved(r Rollout) Rollout {
	r.MaxSurge, r.MaxUnavailable = max(r.MaxSurge, 0), max(r.MaxUnavailable, 0)
	if r.MaxSurge == 0 && r.MaxUnavailable == 0 {
		r.MaxUnavailable = 1
	}
	return r
}

// boundsCount counts the running slots of state and the desired replicas of in with a ready
// slot in state.
func boundsCount(in ServiceInput, state map[string]Slot) (running, ready int) {
	readyOf := map[string]bool{}
	for _, s := range state {
		if Running(s) {
			running++
		}
		if Ready(s) {
			readyOf[BaseReplica(s.Replica)] = true
		}
	}
	for _, d := range in.Desired {
		if readyOf[d.Replica] {
			ready++
		}
	}
	return running, ready
}

// applyStep commits sp's step to slots the way the store would.
func applyStep(slots map[string]Slot, sp SlotPlan) {
	d := sp.Decision
	switch d.Step {
	case StepRun:
		id, _ := AttemptID(d.Key, d.Predecessor)
		slots[sp.Replica] = Slot{Exists: true, Replica: sp.Replica, NodeID: sp.NodeID, Generation: GenRun,
			Attempt: Attempt{ID: id, Key: d.Key, Predecessor: d.Predecessor}}
	case StepStop, StepRemove:
		s := slots[sp.Replica]
		s.Generation = d.Generation
		slots[sp.Replica] = s
	}
}

// randomService draws a service of up to 6 replicas in valid slot states, with one desired key per
// service (most replicas desired at it, on the node they stand on), so drifts, failures, moves and
// replacements meet in one plan often.
func randomService(r *rand.Rand) ServiceInput {
	keys := []string{keyA, keyB}
	nodesOf := []string{"nod_1", "nod_2"}
	want := keys[r.IntN(2)]
	in := ServiceInput{SpecRevision: 1, Now: t0.Add(time.Duration(r.IntN(120)) * time.Second)}
	phases := []Phase{PhaseNone, PhaseStarting, PhaseRunning, PhaseRunning, PhaseFailed, PhaseStopped}
	// Random bounds (the zero value too), a pause now and then, and replicas that hold both of
	// their slot names, so surges, in-place replacements and waits meet in one plan.
	if r.IntN(3) > 0 {
		in.Rollout = Rollout{MaxSurge: r.IntN(3), MaxUnavailable: r.IntN(3), Paused: r.IntN(6) == 0}
	}
	for j := range r.IntN(7) {
		rep, node := fmt.Sprint(j), nodesOf[r.IntN(2)]
		for _, name := range []string{rep, rep + SurgeSuffix} {
			if name != rep && r.IntN(3) > 0 || name == rep && r.IntN(5) == 0 {
				continue
			}
			s := Slot{Exists: true, Replica: name, NodeID: nodesOf[r.IntN(2)], Generation: Generation(1 + r.IntN(3)),
				Attempt:  Attempt{ID: "att_" + name, Key: keys[r.IntN(2)], Predecessor: []string{"", "att_p"}[r.IntN(2)]},
				Observed: Observation{Phase: phases[r.IntN(len(phases))], Ready: r.IntN(3) > 0, EverReady: r.IntN(2) == 0, AcceptedAt: t0.Add(time.Duration(r.IntN(60)) * time.Second)}}
			s.Acked = Generation(r.IntN(int(s.Generation) + 1))
			in.Slots = append(in.Slots, s)
		}
		if r.IntN(5) > 0 {
			if r.IntN(8) == 0 {
				node = nodesOf[r.IntN(2)]
			}
			in.Desired = append(in.Desired, DesiredSlot{Replica: rep, NodeID: node, Key: want})
		}
	}
	if r.IntN(4) == 0 {
		in.Blocker = &Blocker{Reason: ReasonReleaseMissing}
	}
	return in
}

// TestPlanCommitsInOrderNeverSelfConflict commits each plan's steps one at a time, re-deciding
// every slot from the state the earlier commits left, as the reconciler does: no step of a plan
// may conflict with an earlier step of the same plan.
func TestPlanCommitsInOrderNeverSelfConflict(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 20_000; i++ {
		in := randomService(r)
		state := map[string]Slot{}
		for _, s := range in.Slots {
			state[s.Replica] = s
		}
		plan := PlanService(in)
		for _, sp := range plan.Slots {
			if !sp.Commits() {
				continue
			}
			fresh := in
			fresh.Slots = nil
			for _, s := range state {
				fresh.Slots = append(fresh.Slots, s)
			}
			var freshSP SlotPlan
			for _, f := range PlanService(fresh).Slots {
				if f.Replica == sp.Replica {
					freshSP = f
				}
			}
			if _, err := CheckCommit(sp.Decision, freshSP.Input); err != nil || !freshSP.Commits() {
				t.Fatalf("plan %d, slot %s: %v (fresh commits: %v)\ninput %+v", i, sp.Replica, err, freshSP.Commits(), in)
			}
			applyStep(state, sp)
		}
	}
}
