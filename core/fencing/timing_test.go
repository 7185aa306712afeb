package fencing

import (
	"math/rand"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

// timingRun is one random scenario of docs/node-protocol.md section 8.4: a node renews an expiring
// lease at t_send (real time), the core answers after a delay, then the node goes silent (paused,
// partitioned or dead). The node fences on its own monotonic clock at valid_until = t_send + D - M
// and finishes within T_grace + T_force <= M; the core opens the gate on its own clock through the
// real decider. Clocks: the node's and the core's readings of an interval differ from real time by
// a drift bounded by delta, and the core's clock has an arbitrary offset.
type timingRun struct {
	d, m, delta        time.Duration
	offset             time.Duration // core clock = real + offset (+ drift)
	driftNode          float64       // node elapsed = real elapsed * (1 + driftNode)
	driftCore          float64       // core elapsed = real elapsed * (1 + driftCore)
	toCore, fenceTaken time.Duration
}

func randomRun(r *rand.Rand, deltaFrac float64) timingRun {
	d := node.MinLeaseDuration + time.Duration(r.Int63n(int64(10*time.Minute)))
	m := node.LeaseMargin(d)
	delta := time.Duration(deltaFrac * float64(m))
	// Spread the drift bound between the two clocks: each side errs by at most delta over the
	// lease lifetime (about D + 2M), in either direction.
	life := float64(d + 2*m)
	side := func() float64 { return (2*r.Float64() - 1) * float64(delta) / life }
	return timingRun{
		d: d, m: m, delta: delta,
		offset:     time.Duration(r.Int63n(int64(time.Hour))) - 30*time.Minute,
		driftNode:  side(),
		driftCore:  side(),
		toCore:     time.Duration(r.Int63n(int64(5 * time.Second))),
		fenceTaken: time.Duration(r.Int63n(int64(m) + 1)),
	}
}

// check returns the real times at which the old holder's fence completes and the core first
// grants the lease to another node, probing the decider on the core's clock.
func (tr timingRun) check(t *testing.T) (fenceDone, granted time.Time) {
	t.Helper()
	realStart := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	tSend := realStart // node sends lease_renew
	arrive := tSend.Add(tr.toCore)
	coreClock := func(real time.Time) time.Time {
		el := real.Sub(realStart)
		return realStart.Add(tr.offset + time.Duration(float64(el)*(1+tr.driftCore)))
	}
	// The core decides the renewal when it arrives: T_grant on its own clock.
	s := held("n1", 7, node.LeaseExpiring, tr.d, time.Time{})
	s, err := Renew(s, "n1", 7, coreClock(arrive))
	if err != nil {
		t.Fatal(err)
	}
	// The node measures D - M from t_send on its monotonic clock, then fences within M.
	validFor := tr.d - tr.m
	realValid := time.Duration(float64(validFor) / (1 + tr.driftNode))
	fenceDone = tSend.Add(realValid + time.Duration(float64(tr.fenceTaken)/(1+tr.driftNode)))

	// Find the first real instant the decider lets n2 take the lease: it is monotone in time,
	// so a binary search over real time (ns resolution) finds it.
	lo, hi := arrive, arrive.Add(tr.d+4*tr.m+time.Hour)
	if _, _, err := Grant(s, "n2", node.LeaseExpiring, tr.d, coreClock(hi)); err != nil {
		t.Fatalf("the gate never opened: %v", err)
	}
	for hi.Sub(lo) > time.Nanosecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if _, _, err := Grant(s, "n2", node.LeaseExpiring, tr.d, coreClock(mid)); err == nil {
			hi = mid
		} else {
			lo = mid
		}
	}
	return fenceDone, hi
}

// TestTimingFenceBeforeGate is the property of section 8.4: for any D, clock offset, drift and
// offset bounded by delta < M, message delay and fence duration <= M, the old holder's fence
// completes before the core's gate lets another node take the lease.
func TestTimingFenceBeforeGate(t *testing.T) {
	r := newRand(1)
	for i := 0; i < 3000; i++ {
		tr := randomRun(r, 0.999*r.Float64())
		fenceDone, granted := tr.check(t)
		if !fenceDone.Before(granted) {
			t.Fatalf("run %d %+v: fence completes at %s, another node granted at %s", i, tr, fenceDone, granted)
		}
	}
}

// TestTimingMarginIsNeeded shows the property is not vacuous: with the drift at its worst and
// larger than M on both sides, another node can be granted before the old holder's fence ends.
func TestTimingMarginIsNeeded(t *testing.T) {
	d := 15 * time.Second
	m := node.LeaseMargin(d)
	life := float64(d + 2*m)
	tr := timingRun{d: d, m: m, delta: 2 * m, driftNode: -float64(2*m) / life, driftCore: float64(2*m) / life, fenceTaken: m}
	fenceDone, granted := tr.check(t)
	if fenceDone.Before(granted) {
		t.Fatalf("with drift 2M the fence (%s) still ends before the grant (%s): the test cannot tell a broken gate", fenceDone, granted)
	}
}
