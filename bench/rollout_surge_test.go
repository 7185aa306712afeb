package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthhq/berth/core/slots"
)

// surgeSim is a simulation of the rollout decision loop (core/slots.PlanService, committed one
// slot at a time after a fresh plan and slots.CheckCommit, settled slots pruned, as
// core/rollout's producer does) against simulated nodes: a sweep every second, every committed
// step acknowledged by the next sweep, and each new run ready after a start-up time drawn
// between minReady and maxReady. It runs on a simulated clock, so it measures the decisions'
// pacing, not this machine.
type surgeSim struct {
	rollout            slots.Rollout
	replicas           int
	minReady, maxReady time.Duration
	seed               uint64
}

// converge rolls the service from key a to key b and returns the simulated time until the
// verdict is converged, with the sweeps it took.
func (s surgeSim) converge() (time.Duration, int, error) {
	r := rand.New(rand.NewPCG(s.seed, 1))
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	state := map[string]*slots.Slot{}
	readyAt := map[string]time.Time{}
	desire := func(key string) []slots.DesiredSlot {
		out := make([]slots.DesiredSlot, s.replicas)
		for i := range out {
			out[i] = slots.DesiredSlot{Replica: fmt.Sprint(i), NodeID: fmt.Sprintf("nod_%d", i%10), Key: key}
		}
		return out
	}
	input := func(desired []slots.DesiredSlot) slots.ServiceInput {
		in := slots.ServiceInput{SpecRevision: 1, Desired: desired, Rollout: s.rollout, Now: now}
		for _, sl := range state {
			in.Slots = append(in.Slots, *sl)
		}
		return in
	}
	sweep := func(desired []slots.DesiredSlot) (slots.Plan, error) {
		plan := slots.PlanService(input(desired))
		for _, sp := range plan.Slots {
			if !sp.Commits() {
				continue
			}
			for _, f := range slots.PlanService(input(desired)).Slots {
				if f.Replica == sp.Replica {
					if _, err := slots.CheckCommit(sp.Decision, f.Input); err != nil {
						return plan, err
					}
				}
			}
			d := sp.Decision
			switch d.Step {
			case slots.StepRun:
				id, _ := slots.AttemptID(d.Key, d.Predecessor)
				state[sp.Replica] = &slots.Slot{Exists: true, Replica: sp.Replica, NodeID: sp.NodeID, Generation: slots.GenRun,
					Attempt: slots.Attempt{ID: id, Key: d.Key, Predecessor: d.Predecessor}}
				readyAt[sp.Replica] = now.Add(s.minReady + time.Duration(r.Int64N(int64(s.maxReady-s.minReady)+1)))
			default:
				state[sp.Replica].Generation = d.Generation
			}
		}
		for _, sp := range plan.Slots {
			if sp.Decision.Case == slots.CaseSettled {
				delete(state, sp.Replica)
			}
		}
		return plan, nil
	}
	// The nodes: between two sweeps every step is acknowledged and runs past their start-up
	// time report ready.
	nodes := func() {
		for name, sl := range state {
			sl.Acked = sl.Generation
			if sl.Generation == slots.GenRun && !now.Before(readyAt[name]) {
				sl.Observed = slots.Observation{Phase: slots.PhaseRunning, Ready: true, EverReady: true, AcceptedAt: now}
			}
		}
	}
	const maxSweeps = 100_000
	for phase, key := range []string{"sha256:aaaa", "sha256:bbbb"} {
		began := now
		for n := 1; n <= maxSweeps; n++ {
			plan, err := sweep(desire(key))
			if err != nil {
				return 0, 0, err
			}
			if plan.Verdict.State == slots.Converged {
				if phase == 1 {
					return now.Sub(began), n, nil
				}
				break
			}
			now = now.Add(time.Second)
			nodes()
		}
		if now.Sub(began) >= maxSweeps*time.Second {
			return 0, 0, fmt.Errorf("no convergence within %d sweeps", maxSweeps)
		}
	}
	return 0, 0, fmt.Errorf("unreachable")
}

// BenchmarkRolloutSurge100 is the time for a release change of 100 replicas to converge with
// max_surge 10 against max_surge 1 (max_unavailable 0 both), in a simulation of the decision
// loop over simulated ready times (each new run ready 5 to 15 s after it was committed; a sweep
// a second): the decisions of core/slots, not a cluster of 100 real workloads, which this
// machine cannot host. One run; the figures are simulated seconds and their ratio.
func BenchmarkRolloutSurge100(b *testing.B) {
	var one, ten time.Duration
	var sweepsOne, sweepsTen int
	for i := 0; i < b.N; i++ {
		var err error
		sim := surgeSim{replicas: 100, minReady: 5 * time.Second, maxReady: 15 * time.Second, seed: 100}
		sim.rollout = slots.Rollout{MaxSurge: 1}
		if one, sweepsOne, err = sim.converge(); err != nil {
			b.Fatalf("max_surge 1: %v", err)
		}
		sim.rollout = slots.Rollout{MaxSurge: 10}
		if ten, sweepsTen, err = sim.converge(); err != nil {
			b.Fatalf("max_surge 10: %v", err)
		}
	}
	b.ReportMetric(one.Seconds(), "surge1_converge_s")
	b.ReportMetric(ten.Seconds(), "surge10_converge_s")
	b.ReportMetric(one.Seconds()/ten.Seconds(), "surge10_speedup_x")
	b.ReportMetric(float64(sweepsOne), "surge1_sweeps")
	b.ReportMetric(float64(sweepsTen), "surge10_sweeps")
}
