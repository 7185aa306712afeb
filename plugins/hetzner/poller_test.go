package hetzner

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/berthhq/berth/plugins/hetzner/hcloudsim"
	"github.com/berthhq/berth/sdk/provider"
)

// TestPollerBatchesWaits: N creates waiting on 2N actions cost one
// GET /actions carrying all 2N ids, and that one poll finishes every wait.
func TestPollerBatchesWaits(t *testing.T) {
	sim := hcloudsim.Start()
	t.Cleanup(sim.Close)
	sim.SetActionPolls(1)
	p, err := Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// A poll interval of a minute: only the test's PollOnce polls.
	cfg, _ := json.Marshal(Config{Token: hcloudsim.Token, Endpoint: sim.URL, PollIntervalMS: 60000, RequestsPerHour: 360000, Burst: 1000})
	if err := p.Configure(t.Context(), &provider.ConfigRequest{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	c, _ := p.connection()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 6
	var ids [][]int64
	for i := range n {
		res, _, err := c.client.Server.Create(ctx, hcloud.ServerCreateOpts{Name: "m-poll-" + string(rune('a'+i)),
			ServerType: &hcloud.ServerType{Name: "cx22"}, Image: &hcloud.Image{Name: "debian-12"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, []int64{res.Action.ID, res.NextActions[0].ID})
	}
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for _, w := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if failed, err := c.poller.Wait(ctx, w...); err != nil || failed != nil {
				errs <- "a wait ended without success"
			}
		}()
	}
	for c.poller.Pending() < 2*n {
		select {
		case <-ctx.Done():
			t.Fatalf("only %d actions registered", c.poller.Pending())
		case <-time.After(5 * time.Millisecond):
		}
	}
	before := len(sim.Log())
	c.poller.PollOnce(ctx)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	var polls []hcloudsim.Request
	for _, r := range sim.Log()[before:] {
		if r.Method == http.MethodGet && r.Path == "/actions" {
			polls = append(polls, r)
		}
	}
	if len(polls) != 1 {
		t.Fatalf("GET /actions requests for %d waiting actions: %d, want 1", 2*n, len(polls))
	}
	if got := strings.Count(polls[0].Query, "id="); got != 2*n {
		t.Errorf("the poll asked about %d ids, want %d: %s", got, 2*n, polls[0].Query)
	}
	if c.poller.Pending() != 0 {
		t.Errorf("%d actions still waited for", c.poller.Pending())
	}
}
