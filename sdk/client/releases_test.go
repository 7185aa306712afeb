package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestUpgradeNodesMaxParallel: ten nodes with max-parallel 2 over HTTP.
// Each upgrade request is held open (as berthd holds it until the node is
// back) until the test releases it; never more than two are open at once,
// two are open while the fleet is busy, one failure does not stop the rest,
// and the outcomes come back in the order of the ids.
func TestUpgradeNodesMaxParallel(t *testing.T) {
	var inFlight, most atomic.Int32
	started := make(chan string, 16)
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	gate := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if release[id] == nil {
			release[id] = make(chan struct{})
		}
		return release[id]
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/"), "/upgrade")
		if !ok || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		started <- id
		select {
		case <-gate(id):
		case <-r.Context().Done():
		}
		inFlight.Add(-1)
		if id == "nod_3" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"code":"upgrade_failed","title":"rolled back","status":409}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(UpgradeResult{NodeID: id, From: "0.3.0", To: "0.4.0", State: "upgraded"})
	}))
	defer srv.Close()
	defer func() { // a failed test releases every held request first
		for _, id := range []string{"nod_0", "nod_1", "nod_2", "nod_3", "nod_4", "nod_5", "nod_6", "nod_7", "nod_8", "nod_9"} {
			g := gate(id)
			select {
			case <-g:
			default:
				close(g)
			}
		}
	}()
	c, err := New(srv.URL, WithToken("brt_test"))
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("nod_%d", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan []FleetUpgrade, 1)
	go func() { done <- c.UpgradeNodes(ctx, ids, UpgradeRequest{Version: "0.4.0"}, 2) }()
	// Release one upgrade each time one starts, once two are open.
	open := []string{}
	for finished := 0; finished < len(ids); {
		for len(open) < 2 && finished+len(open) < len(ids) {
			select {
			case id := <-started:
				open = append(open, id)
			case <-ctx.Done():
				t.Fatalf("upgrades stalled with %v open", open)
			}
		}
		if n := inFlight.Load(); n > 2 {
			t.Fatalf("%d upgrades open at once, want at most 2", n)
		}
		if finished == 0 {
			// The one check of an absence: with two open, no third starts
			// while they are held (a broken limiter starts all ten at once).
			select {
			case id := <-started:
				t.Fatalf("%s started while %v were open", id, open)
			case <-time.After(300 * time.Millisecond):
			}
		}
		close(gate(open[0]))
		open = open[1:]
		finished++
	}
	out := <-done
	if m := most.Load(); m != 2 {
		t.Fatalf("at most %d upgrades were open at once, want exactly 2", m)
	}
	for i, o := range out {
		switch {
		case o.NodeID != ids[i]:
			t.Fatalf("outcome %d is for %s, want %s", i, o.NodeID, ids[i])
		case o.NodeID == "nod_3":
			if o.Err == nil || !strings.Contains(o.Err.Error(), "upgrade_failed") {
				t.Fatalf("nod_3: %v, want upgrade_failed", o.Err)
			}
		case o.Err != nil || o.Result.State != "upgraded":
			t.Fatalf("%s: %+v %v", o.NodeID, o.Result, o.Err)
		}
	}
}
