package rollout_test

import (
	"strings"
	"testing"

	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// attempts returns the attempt id of every slot of svc by slot name.
func (h *harness) attempts(svc *services.Service) map[string]string {
	h.t.Helper()
	set, err := h.rs.Slots(h.ctx, svc.ID)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range set.Slots {
		out[r.Replica] = r.Attempt.ID
	}
	return out
}

// TestReplicaCountChangeTouchesNoOtherReplica: raising replicas from 2 to 3 starts replica 2 and
// leaves the attempts of replicas 0 and 1 running, never stopped; lowering back to 2 stops only
// replica 2. (Before, the replica count moved the spec revision inside the desired attempt key,
// so both running replicas were replaced one by one.)
func TestReplicaCountChangeTouchesNoOtherReplica(t *testing.T) {
	h := newHarness(t, 2)
	svc := h.put("sha256:a", 2)
	h.until(10, "converged on 2 replicas", h.converged(svc.ID), nil)
	before := h.attempts(svc)
	untouched := func() {
		t.Helper()
		set, _ := h.rs.Slots(h.ctx, svc.ID)
		for _, r := range set.Slots {
			if id, ok := before[r.Replica]; ok && (r.Attempt.ID != id || r.Generation != int(slots.GenRun)) {
				t.Fatalf("replica %s: attempt %s at generation %d, want %s still running", r.Replica, r.Attempt.ID, r.Generation, id)
			}
			if strings.HasSuffix(r.Replica, slots.SurgeSuffix) {
				t.Fatalf("slot %s: a replica count change started a replacement", r.Replica)
			}
		}
	}
	svc = h.put("sha256:a", 3)
	h.until(10, "converged on 3 replicas", func() bool {
		return h.converged(svc.ID)() && h.serving(svc)["sha256:a"] == 3
	}, untouched)
	untouched()
	svc = h.put("sha256:a", 2)
	h.until(10, "converged on 2 replicas again", func() bool {
		return h.converged(svc.ID)() && h.serving(svc)["sha256:a"] == 2
	}, untouched)
	if got := h.attempts(svc); len(got) != 2 {
		t.Fatalf("slots %v after scaling back, want replicas 0 and 1", got)
	}
}

// TestOneReplicaRolloutNeverStopsServing: under the default bounds (surge 1, unavailable 0) a
// one-replica service starts its successor, waits until it is ready and only then stops the
// incumbent, so a replica serves after every pass.
func TestOneReplicaRolloutNeverStopsServing(t *testing.T) {
	h := newHarness(t, 1)
	svc := h.put("sha256:a", 1)
	h.until(10, "converged on release a", h.converged(svc.ID), nil)
	svc = h.put("sha256:b", 1)
	both := false
	h.until(20, "converged on release b", func() bool {
		return h.converged(svc.ID)() && h.serving(svc)["sha256:b"] == 1 && h.serving(svc)["sha256:a"] == 0
	}, func() {
		got := h.serving(svc)
		if got["sha256:a"]+got["sha256:b"] == 0 {
			t.Fatalf("nothing serving during the rollout: %v", got)
		}
		both = both || got["sha256:a"] == 1 && got["sha256:b"] == 1
	})
	if !both {
		t.Fatal("the successor never served beside the incumbent")
	}
}

// TestSurgingRolloutOfACrashingReleaseKeepsEveryReplica: with surge, a release that crashes
// never takes a replica away: all three old replicas serve while its successor backs off.
func TestSurgingRolloutOfACrashingReleaseKeepsEveryReplica(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.put("sha256:good", 3)
	h.until(10, "converged", h.converged(svc.ID), nil)
	h.crash["sha256:bad"] = true
	svc = h.put("sha256:bad", 3)
	h.until(10, "waiting on the failure backoff", func() bool {
		return h.verdict(svc.ID).State == slots.Waiting
	}, nil)
	for range 10 {
		h.step()
		if got := h.serving(svc); got["sha256:good"] != 3 {
			t.Fatalf("serving %v during the failed rollout, want the 3 old replicas", got)
		}
		if n := len(h.attempts(svc)); n > 4 {
			t.Fatalf("%d slots, want at most 3 replicas plus 1 surge", n)
		}
	}
}

// TestRolloutPauseResumeRestart: a pause holds the rollout where it is (waiting(rollout-paused),
// no replica moves), resume finishes it, and restart replaces every replica under the bounds
// without ever serving fewer than the replica count.
func TestRolloutPauseResumeRestart(t *testing.T) {
	h := newHarness(t, 2)
	svc := h.put("sha256:a", 3)
	h.until(10, "converged", h.converged(svc.ID), nil)
	svc = h.put("sha256:b", 3)
	h.until(10, "one replica on release b", func() bool { return h.serving(svc)["sha256:b"] >= 1 }, nil)
	paused, wrote, err := h.cat.ControlRollout(h.ctx, h.p, "web", services.RolloutPause, nil)
	if err != nil || !wrote || !paused.RolloutPaused {
		t.Fatalf("pause: %+v %v %v", paused, wrote, err)
	}
	if _, wrote, err := h.cat.ControlRollout(h.ctx, h.p, "web", services.RolloutPause, nil); err != nil || wrote {
		t.Fatalf("second pause wrote %v (%v), want an idempotent no-op", wrote, err)
	}
	h.until(10, "waiting on the pause", func() bool {
		return h.verdict(svc.ID) == slots.Verdict{SpecRevision: h.verdict(svc.ID).SpecRevision, State: slots.Waiting, Reason: slots.ReasonRolloutPaused}
	}, nil)
	held := h.serving(svc)
	for range 5 {
		h.step()
		if got := h.serving(svc); got != nil && (got["sha256:a"] != held["sha256:a"] || got["sha256:b"] != held["sha256:b"]) {
			t.Fatalf("serving %v while paused, was %v", got, held)
		}
	}
	if _, _, err := h.cat.ControlRollout(h.ctx, h.p, "web", services.RolloutResume, nil); err != nil {
		t.Fatal(err)
	}
	h.until(30, "converged after resume", func() bool {
		return h.converged(svc.ID)() && h.serving(svc)["sha256:b"] == 3
	}, nil)
	before := h.attempts(svc)
	if _, _, err := h.cat.ControlRollout(h.ctx, h.p, "web", services.RolloutRestart, nil); err != nil {
		t.Fatal(err)
	}
	h.until(40, "every replica restarted", func() bool {
		if !h.converged(svc.ID)() || h.serving(svc)["sha256:b"] != 3 {
			return false
		}
		for _, id := range h.attempts(svc) {
			for _, old := range before {
				if id == old {
					return false
				}
			}
		}
		return true
	}, func() {
		if got := h.serving(svc)["sha256:b"]; got < 3 {
			t.Fatalf("%d replicas serving during the restart, want never fewer than 3 (max_unavailable 0)", got)
		}
	})
}
