package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Release is one binary berthd serves for upgrades (GET /releases,
// docs/api.md "Releases"): Name is the program ("berth-agent"), OS and Arch
// Go's GOOS and GOARCH, SHA256 64 lower-case hex digits, Size bytes.
type Release struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
}

// ListReleases lists the binaries berthd serves (GET /releases).
func (c *Client) ListReleases(ctx context.Context) ([]Release, error) {
	var out List[Release]
	if err := c.do(ctx, http.MethodGet, "/releases", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// OpenRelease streams the release whose SHA-256 is sum (GET
// /releases/{sum}); nodes call it with their credential. The caller closes
// the body and checks the hash of what it read. A missing release fails
// with code "release_not_found".
func (c *Client) OpenRelease(ctx context.Context, sum string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, http.MethodGet, "/releases/"+pathEscape(sum), nil, nil, "", "application/octet-stream", true)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UpgradeRequest is the body of POST /nodes/{id}/upgrade. Program is the
// binary to replace: "berth-agent" (empty), the node's runtime driver
// plugin "berth-plugin-<driver>" or its network plugin
// "berth-plugin-<network>" (docs/upgrades.md section 3.5). Version empty means the newest release of
// Program berthd serves; Force allows a downgrade and a version outside the
// skew; TimeoutS bounds the wait for the node to come back (0: the server's
// default of 120 s).
type UpgradeRequest struct {
	Program  string `json:"program,omitempty"`
	Version  string `json:"version,omitempty"`
	Force    bool   `json:"force,omitempty"`
	TimeoutS int    `json:"timeout_s,omitempty"`
}

// UpgradeResult is the answer of POST /nodes/{id}/upgrade (From is empty
// for a plugin, whose version berthd learns only from the node): State is
// "upgraded" (the node came back at To) or "unchanged" (it already ran To);
// DurationMS is from the command to the node's new session.
type UpgradeResult struct {
	NodeID     string `json:"node_id"`
	Program    string `json:"program"`
	From       string `json:"from"`
	To         string `json:"to"`
	State      string `json:"state"`
	DurationMS int64  `json:"duration_ms"`
}

// UpgradeNode upgrades one node's agent in place and waits until it is back
// (POST /nodes/{id}/upgrade, docs/upgrades.md section 3). Refusals carry the
// codes agent_downgrade, agent_version_skew, release_not_found,
// digest_mismatch, upgrade_in_progress, upgrade_failed (the node rolled
// back) and node_not_found.
func (c *Client) UpgradeNode(ctx context.Context, id string, req UpgradeRequest) (*UpgradeResult, error) {
	var out UpgradeResult
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/"+pathEscape(id)+"/upgrade", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FleetUpgrade is the outcome of one node of [UpgradeNodes]: Result on
// success, Err otherwise; Start and End bound its upgrade.
type FleetUpgrade struct {
	NodeID     string
	Result     *UpgradeResult
	Err        error
	Start, End time.Time
}

// UpgradeNodes upgrades ids with at most maxParallel upgrades at once (a
// value below 1 means 1), each with [Client.UpgradeNode], and returns one
// outcome per id in the order of ids. Since each call returns only once its
// node is back (or rolled back), no more than maxParallel agents restart at
// a time. A failed node does not stop the others; ctx ending does: nodes
// not yet begun fail with ctx's error.
func (c *Client) UpgradeNodes(ctx context.Context, ids []string, req UpgradeRequest, maxParallel int) []FleetUpgrade {
	return upgradeFleet(ctx, ids, maxParallel, func(ctx context.Context, id string) (*UpgradeResult, error) {
		return c.UpgradeNode(ctx, id, req)
	})
}

func upgradeFleet(ctx context.Context, ids []string, maxParallel int, one func(context.Context, string) (*UpgradeResult, error)) []FleetUpgrade {
	if maxParallel < 1 {
		maxParallel = 1
	}
	out := make([]FleetUpgrade, len(ids))
	sem := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		out[i].NodeID = id
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i].Err = fmt.Errorf("upgrade node %s: %w", id, ctx.Err())
			continue
		}
		wg.Add(1)
		go func(i int, id string) {
			defer wg.Done()
			defer func() { <-sem }()
			out[i].Start = time.Now()
			out[i].Result, out[i].Err = one(ctx, id)
			out[i].End = time.Now()
		}(i, id)
	}
	wg.Wait()
	return out
}
