package rollout_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"maps"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// enrollLabelled enrolls and connects a node with labels, and adds it to the harness.
func (h *harness) enrollLabelled(labels map[string]string) *nodes.Node {
	h.t.Helper()
	tok, _, err := h.reg.CreateJoinToken(h.ctx, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, _, err := h.reg.Enroll(h.ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub),
		Hostname: "h", Address: "127.0.0.1", Labels: labels})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.reg.SessionStarted(h.ctx, n.ID, "ses_"+n.ID, "v", []string{"process"}); err != nil {
		h.t.Fatal(err)
	}
	h.nodes = append(h.nodes, n)
	return n
}

// placedOn counts the service's workloads desired running, by node.
func (h *harness) placedOn(svc *services.Service) map[string]int {
	h.t.Helper()
	ws, err := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]int{}
	for _, w := range ws {
		if w.DesiredStatus == services.DesiredRunning {
			out[w.NodeID]++
		}
	}
	return out
}

// TestRolloutPlacesWithTheDecider: the rollout places replicas only on nodes meeting the
// service's node_selector, moves them when the selector changes, keeps them where they are
// when a node joins, and leaves a replica that fits nowhere unplaced with the decider's reason
// in the verdict (docs/placement.md).
func TestRolloutPlacesWithTheDecider(t *testing.T) {
	h := newHarness(t, 0)
	ssd1 := h.enrollLabelled(map[string]string{"disk": "ssd"})
	hdd := h.enrollLabelled(map[string]string{"disk": "hdd"})
	ssd2 := h.enrollLabelled(map[string]string{"disk": "ssd"})
	put := func(sc services.Scheduling, res services.Resources) *services.Service {
		t.Helper()
		svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", BundleDigest: "sha256:a", Command: []string{"./web"},
			Port: 8080, Replicas: 4, Scheduling: sc, Resources: res}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	svc := put(services.Scheduling{NodeSelector: map[string]string{"disk": "ssd"}}, services.Resources{})
	h.until(12, "converged on the ssd nodes", h.converged(svc.ID), nil)
	if got, want := h.placedOn(svc), map[string]int{ssd1.ID: 2, ssd2.ID: 2}; !maps.Equal(got, want) {
		t.Fatalf("placed on %v, want two on each ssd node %v", got, want)
	}

	// A new selector moves every replica to the one hdd node.
	svc = put(services.Scheduling{NodeSelector: map[string]string{"disk": "hdd"}}, services.Resources{})
	h.until(30, "converged on the hdd node", func() bool {
		return h.verdict(svc.ID).State == slots.Converged && maps.Equal(h.placedOn(svc), map[string]int{hdd.ID: 4})
	}, nil)

	// A node that joins takes nothing that runs.
	h.enrollLabelled(map[string]string{"disk": "hdd"})
	for range 4 {
		h.step()
	}
	if got := h.placedOn(svc); !maps.Equal(got, map[string]int{hdd.ID: 4}) {
		t.Fatalf("after a node joined, placed on %v, want all 4 still on %s", got, hdd.ID)
	}

	// A gpu no node has: the replicas wait with the reason and never land.
	gpu, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "gpu", BundleDigest: "sha256:a", Command: []string{"./gpu"},
		Port: 8081, Replicas: 1, Resources: services.Resources{Extended: map[string]int64{"gpu": 1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := slots.Verdict{State: slots.Waiting, Reason: "unplaceable: needs gpu 1, largest free 0 on 4 nodes"}
	h.until(6, "gpu waits unplaceable", func() bool {
		v := h.verdict(gpu.ID)
		return v.State == want.State && v.Reason == want.Reason
	}, nil)
	if got := h.placedOn(gpu); len(got) != 0 {
		t.Fatalf("an unplaceable replica landed: %v", got)
	}
	if v := h.verdict(gpu.ID); !strings.HasPrefix(string(v.Reason), "unplaceable: ") || !slots.IsUnplaceable(v.Reason) {
		t.Fatalf("verdict %v", v)
	}
}

// TestStatefulLeaseGoesWhereTheDeciderSays: a stateful service's lease is granted only to a node
// meeting its selector; with none, nothing is granted and the verdict waits with the reason.
func TestStatefulLeaseGoesWhereTheDeciderSays(t *testing.T) {
	h := newHarnessOpts(t, 0, nil, true)
	h.enrollLabelled(map[string]string{"disk": "hdd"})
	ssd := h.enrollLabelled(map[string]string{"disk": "ssd"})
	put := func(name, disk string) *services.Service {
		t.Helper()
		svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: name, BundleDigest: "sha256:a", Command: []string{"./db"},
			Replicas: 1, PlacementMode: services.PlacementStateful, LeaseMode: "local",
			Scheduling: services.Scheduling{NodeSelector: map[string]string{"disk": disk}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	db := put("db", "ssd")
	h.until(12, "db converged", h.converged(db.ID), nil)
	if got := h.placedOn(db); !maps.Equal(got, map[string]int{ssd.ID: 1}) {
		t.Fatalf("db on %v, want the ssd node %s", got, ssd.ID)
	}
	nvme := put("fast", "nvme")
	want := "unplaceable: no node matches disk=nvme (refused: 2 node_selector)"
	h.until(6, "fast waits unplaceable", func() bool { return string(h.verdict(nvme.ID).Reason) == want }, nil)
	if got := h.placedOn(nvme); len(got) != 0 {
		t.Fatalf("an unplaceable stateful replica landed: %v", got)
	}
}
