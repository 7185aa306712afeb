package rollout_test

import (
	"testing"

	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// TestCrashLoopingReplicaIsReplacedWhenItsInvocationChanges: a lone replica under the default
// (surging) rollout that crash-loops (its run needs something its spec lacks, such as a binding's
// secrets) is replaced when the spec changes what it runs: the new attempt starts in place of the
// failed one, which costs no availability.
func TestCrashLoopingReplicaIsReplacedWhenItsInvocationChanges(t *testing.T) {
	h := newHarness(t, 1)
	put := func(release string) *services.Service {
		svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", BundleDigest: release, Command: []string{"./web"}, Port: 8080,
			Replicas: 1, Domains: []string{"web.localhost"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	h.crash["sha256:bad"] = true
	svc := put("sha256:bad")
	h.until(10, "the lone replica failed", func() bool {
		return h.verdict(svc.ID).State == slots.Waiting
	}, nil)
	set, _ := h.rs.Slots(h.ctx, svc.ID)
	if len(set.Slots) != 1 {
		t.Fatalf("slots %+v, want one", set.Slots)
	}
	old := set.Slots[0].Attempt.Key
	svc = put("sha256:good")
	h.until(30, "the new attempt serving", func() bool {
		return h.serving(svc)["sha256:good"] == 1
	}, nil)
	set, _ = h.rs.Slots(h.ctx, svc.ID)
	for _, r := range set.Slots {
		if r.Generation == int(slots.GenRun) && r.Attempt.Key == old {
			t.Fatalf("the crash-looping attempt still runs: %+v", set.Slots)
		}
	}
	h.until(10, "converged", h.converged(svc.ID), nil)
}
