package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berthhq/berth/abi/node"
)

// WorkloadLogs is the answer of GET /api/v1/workloads/{id}/logs: the newest
// lines of the workload's output, read by its node (docs/api.md). Detail
// says when older lines were left out.
type WorkloadLogs struct {
	WorkloadID string         `json:"workload_id"`
	NodeID     string         `json:"node_id"`
	Lines      []node.LogLine `json:"lines"`
	Detail     string         `json:"detail,omitempty"`
}

// LogsOptions narrows a logs read (docs/logs.md section 7); the zero value narrows nothing.
type LogsOptions struct {
	Since string // RFC 3339 time or a duration ago ("2h"); empty: from the start
	Until string // the same; empty: to the end
	Grep  string // RE2 regular expression a line must match; empty: every line
}

func (o LogsOptions) set(q url.Values) {
	for k, v := range map[string]string{"since": o.Since, "until": o.Until, "grep": o.Grep} {
		if v != "" {
			q.Set(k, v)
		}
	}
}

// ErrLiveTailUnavailable is returned by a follow of a workload whose node could not be asked
// after every shipped line was delivered: the node is gone or not connected.
var ErrLiveTailUnavailable = errors.New("berth: the shipped log ended and the live tail is unavailable: the workload's node is gone or not connected")

// WorkloadLogs asks the workload's node for its newest output; tail 0 means
// as many lines as fit one answer (1 MiB). Errors carry the API's code
// (unavailable when the node is not connected).
func (c *Client) WorkloadLogs(ctx context.Context, workloadID string, tail int) (*WorkloadLogs, error) {
	return c.WorkloadLogsWith(ctx, workloadID, tail, LogsOptions{})
}

// WorkloadLogsWith is WorkloadLogs narrowed by opt: the workload's shipped log merged with its
// node's live tail, answered from the shipped log alone (Detail says so) when the node is gone.
func (c *Client) WorkloadLogsWith(ctx context.Context, workloadID string, tail int, opt LogsOptions) (*WorkloadLogs, error) {
	q := url.Values{}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	opt.set(q)
	var out WorkloadLogs
	if err := c.do(ctx, http.MethodGet, "/workloads/"+url.PathEscape(workloadID)+"/logs", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NodeLogs is WorkloadLogs addressed to a node, for a workload the core may no longer list,
// such as a slot's previous attempt (GET /api/v1/nodes/{id}/logs?workload=...).
func (c *Client) NodeLogs(ctx context.Context, nodeID, workloadID string, tail int) (*WorkloadLogs, error) {
	q := url.Values{"workload": {workloadID}}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	var out WorkloadLogs
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(nodeID)+"/logs", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FollowWorkloadLogs streams the workload's output: the newest tail lines
// (0: the node's default of 100), then new lines as they come, calling fn for
// each until ctx ends, the stream ends, or fn returns an error (returned).
// Errors also carry the API's code: stream_limit when the node's session
// already carries its limit of streams, and unauthenticated when the stream
// ended because the client's bearer stopped being valid (revoked, rotated).
func (c *Client) FollowWorkloadLogs(ctx context.Context, workloadID string, tail int, fn func(node.LogLine) error) error {
	return c.followLogs(ctx, "/workloads/"+url.PathEscape(workloadID)+"/logs", url.Values{}, tail, fn)
}

// FollowWorkloadLogsWith is FollowWorkloadLogs narrowed by opt. It returns
// [ErrLiveTailUnavailable] after the shipped lines when the workload's node cannot be asked.
func (c *Client) FollowWorkloadLogsWith(ctx context.Context, workloadID string, tail int, opt LogsOptions, fn func(node.LogLine) error) error {
	q := url.Values{}
	opt.set(q)
	return c.followLogs(ctx, "/workloads/"+url.PathEscape(workloadID)+"/logs", q, tail, fn)
}

// FollowNodeLogs is FollowWorkloadLogs addressed to a node, for a workload
// the core may no longer list (GET /api/v1/nodes/{id}/logs).
func (c *Client) FollowNodeLogs(ctx context.Context, nodeID, workloadID string, tail int, fn func(node.LogLine) error) error {
	return c.followLogs(ctx, "/nodes/"+url.PathEscape(nodeID)+"/logs", url.Values{"workload": {workloadID}}, tail, fn)
}

func (c *Client) followLogs(ctx context.Context, path string, q url.Values, tail int, fn func(node.LogLine) error) error {
	q.Set("follow", "true")
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	resp, err := c.send(ctx, http.MethodGet, path, q, nil, "", "application/x-ndjson", true)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), node.MaxMessageBytes)
	for sc.Scan() {
		var l node.LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("GET %s: decode a log line: %w", path, err)
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	// The server's trailer says why the stream ended (docs/api.md section 9).
	if resp.Trailer.Get("Berth-Stream-End") == "live_unavailable" {
		return ErrLiveTailUnavailable
	}
	if resp.Trailer.Get("Berth-Stream-End") == "unauthenticated" {
		return &APIError{Status: http.StatusUnauthorized, Problem: Problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
			Detail: "the log stream ended: the token was revoked, rotated or outdated"}}
	}
	return nil
}

// NodeMetrics asks a node for its metrics ring (the last 10 minutes, in
// memory on the node): the node's samples and those of the named workloads.
func (c *Client) NodeMetrics(ctx context.Context, nodeID string, workloadIDs ...string) (*node.Metrics, error) {
	q := url.Values{}
	for _, id := range workloadIDs {
		q.Add("workload", id)
	}
	var out node.Metrics
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(nodeID)+"/metrics", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
