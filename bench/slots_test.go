package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/core/slots"
)

// slotsInputs returns n decision inputs cycling through every row of the slot decision table.
func slotsInputs(n int) []slots.Input {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const a, b = "sha256:aaaa", "sha256:bbbb"
	slot := func(g, acked slots.Generation, key string, phase slots.Phase, ready bool) slots.Slot {
		return slots.Slot{Exists: true, Replica: "0", NodeID: "nod_1", Attempt: slots.Attempt{ID: "att_1", Key: key, Predecessor: "att_0"},
			Generation: g, Acked: acked, Observed: slots.Observation{Phase: phase, Ready: ready, AcceptedAt: now.Add(-15 * time.Second)},
			Ancestors: []slots.Attempt{{ID: "att_0", Key: key}}}
	}
	rows := []slots.Input{
		{Desired: true, DesiredKey: a},
		{},
		{Slot: slot(slots.GenRemove, slots.GenRemove, a, slots.PhaseStopped, false), Desired: true, DesiredKey: b},
		{Slot: slot(slots.GenRemove, slots.GenRemove, a, slots.PhaseStopped, false)},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseRunning, true), Desired: true, DesiredKey: a},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseRunning, true), Desired: true, DesiredKey: b},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseRunning, true)},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseFailed, false), Desired: true, DesiredKey: a},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseFailed, false), Desired: true, DesiredKey: a, Now: now.Add(time.Minute)},
		{Slot: slot(slots.GenStop, slots.GenRun, a, slots.PhaseRunning, true)},
		{Slot: slot(slots.GenStop, slots.GenStop, a, slots.PhaseStopped, false)},
		{Slot: slot(slots.GenRemove, slots.GenStop, a, slots.PhaseStopped, false)},
		{Slot: slot(slots.GenRun, slots.GenRun, a, slots.PhaseRunning, true), Desired: true, DesiredKey: b, ReplacementInFlight: true},
	}
	out := make([]slots.Input, n)
	for i := range out {
		out[i] = rows[i%len(rows)]
		if out[i].Now.IsZero() {
			out[i].Now = now
		}
	}
	return out
}

// BenchmarkSlotsDecide is the pure slot decision (every row of the table in turn), in memory.
func BenchmarkSlotsDecide(b *testing.B) {
	ins := slotsInputs(1024)
	var sink slots.Case
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		sink = slots.DecideSlotTransition(ins[i%len(ins)]).Case
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	if sink == "" {
		b.Fatal("no case")
	}
}

// BenchmarkSlotsPlanService plans one service of 3 slots mid-rollout (one replacing, two drifted
// waiting) per iteration, and reports slot decisions per second.
func BenchmarkSlotsPlanService(b *testing.B) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in := slots.ServiceInput{SpecRevision: 2, Now: now}
	for i := 0; i < 3; i++ {
		r := fmt.Sprint(i)
		in.Desired = append(in.Desired, slots.DesiredSlot{Replica: r, NodeID: "nod_1", Key: "sha256:bbbb"})
		s := slots.Slot{Exists: true, Replica: r, NodeID: "nod_1", Attempt: slots.Attempt{ID: "att_" + r, Key: "sha256:aaaa"},
			Generation: slots.GenRun, Acked: slots.GenRun, Observed: slots.Observation{Phase: slots.PhaseRunning, Ready: true, AcceptedAt: now}}
		if i == 0 {
			s.Generation, s.Acked = slots.GenStop, slots.GenRun
		}
		in.Slots = append(in.Slots, s)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if p := slots.PlanService(in); len(p.Slots) != 3 {
			b.Fatalf("planned %d slots", len(p.Slots))
		}
	}
	b.ReportMetric(float64(3*b.N)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkSlotsAttemptKey is the desired attempt key of a slot with a 20-variable environment.
func BenchmarkSlotsAttemptKey(b *testing.B) {
	env := map[string]string{}
	for i := 0; i < 20; i++ {
		env[fmt.Sprintf("VAR_%02d", i)] = fmt.Sprintf("value-%d", i)
	}
	in := slots.KeyInput{ReleaseDigest: "sha256:0123456789abcdef", SpecRevision: 7, Env: env, Platform: "linux/amd64", NetworkMode: slots.NetworkHost}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := slots.DesiredAttemptKey(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "keys/s")
}
