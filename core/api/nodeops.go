package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/berthhq/berth/core/services"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/session"
)

// NodeCommander reaches nodes over their live sessions: one-off commands
// and streams (docs/node-protocol.md sections 5.15 and 5.17).
// *session.Server satisfies it.
type NodeCommander interface {
	Command(ctx context.Context, nodeID string, cmd node.Command) (*node.CommandResult, error)
	OpenStream(ctx context.Context, nodeID, kind string, params any) (*session.Stream, error)
}

// maxLogTail bounds ?tail= of the logs endpoint.
const maxLogTail = 10000

// registerNodeOps adds the operator endpoints that ask a node: workload
// logs (once or followed) and node metrics.
func (s *Server) registerNodeOps(v1 *echo.Group) {
	if s.cfg.NodeOps == nil {
		return
	}
	v1.GET("/workloads/:id/logs", s.workloadLogs, s.auth(identity.ScopeServicesRead))
	v1.GET("/nodes/:id/logs", s.nodeLogs, s.auth(identity.ScopeNodesRead))
	v1.GET("/nodes/:id/metrics", s.nodeMetrics, s.auth(identity.ScopeNodesRead))
}

// workloadLogs serves GET /api/v1/workloads/{id}/logs?tail=N[&since=][&until=][&grep=][&follow=true]
// (docs/api.md, docs/logs.md section 7). Without follow it answers {"lines": [...], "detail":
// "..."}: the workload's shipped segments merged by sequence number with the live tail its node
// has not shipped yet. With follow it writes the same as one JSON log line per text line
// (application/x-ndjson), then the node's new lines until the client leaves or the stream ends.
// A workload whose node is gone is answered from its shipped segments, and detail (or the
// trailer live_unavailable) says the live tail is unavailable. Errors: not_found (no such
// workload and no shipped log of it), validation_failed (a bad tail, since, until or grep), 503
// unavailable (no shipped log and its node has no live session), 429 stream_limit, and the
// node's own refusals.
func (s *Server) workloadLogs(c echo.Context) error {
	id := c.Param("id")
	if !strings.HasPrefix(id, "wl_") {
		return problem(abierrors.NotFound, "no workload "+id)
	}
	wls, err := s.cfg.Catalog.FindWorkloads(c.Request().Context(), services.WorkloadFilter{ID: id})
	if err != nil {
		return err
	}
	if len(wls) > 0 {
		return s.logs(c, wls[0].NodeID, id)
	}
	if s.cfg.ShippedLogs != nil {
		if _, err := s.cfg.ShippedLogs.Workload(c.Request().Context(), id); err == nil {
			return s.logs(c, "", id) // the workload is gone; its shipped log names its node
		}
	}
	return problem(abierrors.NotFound, "no workload "+id)
}

// nodeLogs serves GET /api/v1/nodes/{id}/logs?workload=wl_...: the same as
// workloadLogs, addressed to a node by the operator, for a workload the
// core may no longer list (the node answers not_found when it has none).
func (s *Server) nodeLogs(c echo.Context) error {
	wl := c.QueryParam("workload")
	if !strings.HasPrefix(wl, "wl_") {
		return problem(abierrors.ValidationFailed, "workload must name a workload id (wl_...)")
	}
	if err := s.knownNode(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return s.logs(c, c.Param("id"), wl)
}

// knownNode answers node_not_found for an id no node has, so that a
// mistyped id is not reported as a node that is away.
func (s *Server) knownNode(ctx context.Context, id string) error {
	_, err := s.cfg.Nodes.Get(ctx, id)
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, "no node "+id)
	}
	return err
}

// logQuery is the decoded query of a logs request.
type logQuery struct {
	tail         int
	follow       bool
	since, until *time.Time
	grep         *regexp.Regexp
}

// logTime reads a since or until value: RFC 3339, or a duration ("2h") meaning that long ago.
func logTime(name, v string, now time.Time) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		t := now.Add(-d)
		return &t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, problem(abierrors.ValidationFailed, name+" must be an RFC 3339 time or a duration such as 2h")
	}
	return &t, nil
}

func decodeLogQuery(c echo.Context) (logQuery, error) {
	var q logQuery
	if v := c.QueryParam("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLogTail {
			return q, problem(abierrors.ValidationFailed, "tail must be a whole number from 0 to 10000")
		}
		q.tail = n
	}
	q.follow = c.QueryParam("follow") == "true" || c.QueryParam("follow") == "1"
	now := time.Now()
	var err error
	if q.since, err = logTime("since", c.QueryParam("since"), now); err != nil {
		return q, err
	}
	if q.until, err = logTime("until", c.QueryParam("until"), now); err != nil {
		return q, err
	}
	if v := c.QueryParam("grep"); v != "" {
		if len(v) > 1024 {
			return q, problem(abierrors.ValidationFailed, "grep is at most 1024 bytes")
		}
		if q.grep, err = regexp.Compile(v); err != nil {
			return q, problem(abierrors.ValidationFailed, "grep is not a regular expression (RE2 syntax): "+err.Error())
		}
	}
	return q, nil
}

// nodeLive asks nodes for the unshipped part of a workload's log ([logs.Live]).
type nodeLive struct{ ops NodeCommander }

// After implements [logs.Live] with one logs_query.
func (l nodeLive) After(ctx context.Context, nodeID, workloadID string, after int64, since, until *time.Time) ([]node.LogLine, bool, error) {
	raw, _ := json.Marshal(node.LogsQuery{WorkloadID: workloadID, AfterSeq: after, Since: since, Until: until})
	res, err := l.ops.Command(ctx, nodeID, node.Command{Kind: node.CommandLogsQuery, Params: raw})
	if errors.Is(err, session.ErrNotConnected) {
		return nil, false, fmt.Errorf("%w: node %s has no live session with this server", logs.ErrLiveUnavailable, nodeID)
	}
	if err != nil {
		return nil, false, err
	}
	if res.Status != "ok" {
		return nil, false, nodeRefusal(res)
	}
	return res.Lines, res.More, nil
}

// logs answers nodeID's (empty: the node the shipped log names) output of workloadID, once or
// followed: shipped segments and the live tail merged (docs/logs.md section 7).
func (s *Server) logs(c echo.Context, nodeID, workloadID string) error {
	ctx := c.Request().Context()
	lq, err := decodeLogQuery(c)
	if err != nil {
		return err
	}
	shipped := false
	if s.cfg.ShippedLogs != nil {
		_, err := s.cfg.ShippedLogs.Workload(ctx, workloadID)
		shipped = err == nil
	}
	if !shipped {
		if lq.follow {
			return s.followLive(c, nodeID, workloadID, lq, node.LogsQuery{WorkloadID: workloadID, Tail: lq.tail}, 0)
		}
		q := node.LogsQuery{WorkloadID: workloadID, Tail: lq.tail, Since: lq.since, Until: lq.until}
		raw, _ := json.Marshal(q)
		res, err := s.cfg.NodeOps.Command(ctx, nodeID, node.Command{Kind: node.CommandLogsQuery, Params: raw})
		if err != nil {
			return nodeOpError(err)
		}
		if res.Status != "ok" {
			return nodeRefusal(res)
		}
		lines := []node.LogLine{}
		for _, l := range res.Lines {
			if lq.grep == nil || lq.grep.MatchString(l.Line) {
				lines = append(lines, l)
			}
		}
		return c.JSON(http.StatusOK, map[string]any{"workload_id": workloadID, "node_id": nodeID, "lines": lines, "detail": res.Detail})
	}
	tail := lq.tail
	if lq.follow && tail == 0 {
		tail = 100
	}
	res, err := s.cfg.ShippedLogs.Read(ctx, logs.Query{WorkloadID: workloadID, NodeID: nodeID, Since: lq.since, Until: lq.until, Grep: lq.grep, Tail: tail}, nodeLive{ops: s.cfg.NodeOps})
	if errors.Is(err, logs.ErrLiveUnavailable) {
		return problem(abierrors.Unavailable, err.Error())
	}
	if err != nil {
		return err
	}
	var details []string
	if res.Truncated {
		details = append(details, "older lines were left out to fit the answer or the tail asked")
	}
	if res.LiveUnavailable != "" {
		details = append(details, fmt.Sprintf("the live tail is unavailable (%s): these lines come from the %d shipped log segments only", res.LiveUnavailable, res.Shipped))
	}
	if !lq.follow {
		return c.JSON(http.StatusOK, map[string]any{"workload_id": workloadID, "node_id": res.NodeID, "lines": res.Lines, "detail": strings.Join(details, "; ")})
	}
	if res.LiveUnavailable != "" {
		w := startNDJSON(c)
		w.Header().Set(HeaderStreamEnd, StreamEndLiveUnavailable)
		enc := json.NewEncoder(w)
		for _, l := range res.Lines {
			if err := enc.Encode(l); err != nil {
				return nil
			}
		}
		w.Flush()
		return nil
	}
	after := max(res.NextSeq-1, 0)
	return s.followLive(c, res.NodeID, workloadID, lq, node.LogsQuery{WorkloadID: workloadID, AfterSeq: after, Tail: lq.tail}, after, res.Lines...)
}

// startNDJSON starts a followed log answer.
func startNDJSON(c echo.Context) *echo.Response {
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Trailer", HeaderStreamEnd)
	w.WriteHeader(http.StatusOK)
	w.Flush()
	return w
}

// followLive writes first, then opens an app_logs stream with q on nodeID and writes its
// lines whose sequence is after after (lines without one always), until the client leaves or
// the stream ends.
func (s *Server) followLive(c echo.Context, nodeID, workloadID string, lq logQuery, q node.LogsQuery, after int64, first ...node.LogLine) error {
	ctx := c.Request().Context()
	st, err := s.cfg.NodeOps.OpenStream(ctx, nodeID, node.StreamAppLogs, q)
	if err != nil {
		return nodeOpError(err)
	}
	defer func() { _ = st.Close(context.WithoutCancel(ctx)) }()
	w := startNDJSON(c)
	enc := json.NewEncoder(w)
	for _, l := range first {
		if err := enc.Encode(l); err != nil {
			return nil
		}
	}
	w.Flush()
	recheck := time.NewTicker(streamRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-recheck.C:
			if !s.bearerStillValid(c) {
				// Revoked, rotated or outdated: the stream ends, and its trailer says why
				// (docs/api.md section 9).
				w.Header().Set(HeaderStreamEnd, string(abierrors.Unauthenticated))
				return nil
			}
		case d, ok := <-st.Data:
			if !ok {
				if end := st.End(); end.Reason == node.StreamError {
					s.log.Info("log stream ended by the node", "node_id", nodeID, "workload_id", workloadID, "detail", end.Detail)
				}
				w.Header().Set(HeaderStreamEnd, "end")
				return nil
			}
			for _, l := range d.Lines {
				if l.Seq > 0 && l.Seq <= after {
					continue // held shipped and written already
				}
				if l.Seq > 0 {
					after = l.Seq
				}
				if lq.grep != nil && !lq.grep.MatchString(l.Line) {
					continue
				}
				if err := enc.Encode(l); err != nil {
					return nil // the client left
				}
			}
			w.Flush()
		}
	}
}

// StreamEndLiveUnavailable is the [HeaderStreamEnd] trailer of a followed log whose shipped
// lines were all written but whose node could not be asked for its live tail.
const StreamEndLiveUnavailable = "live_unavailable"

// HeaderStreamEnd is the HTTP trailer a followed log stream ends with: "end" when the node
// ended it, "unauthenticated" when the request's bearer stopped being valid (revoked, rotated,
// or of an older credential generation); absent when the server went away mid-stream.
const HeaderStreamEnd = "Berth-Stream-End"

// nodeMetrics serves GET /api/v1/nodes/{id}/metrics[?workload=wl_...]: the
// node's metrics ring (metrics_query) for the node itself and the named
// workloads.
func (s *Server) nodeMetrics(c echo.Context) error {
	ctx := c.Request().Context()
	if err := s.knownNode(ctx, c.Param("id")); err != nil {
		return err
	}
	q := node.MetricsQuery{Node: true, WorkloadIDs: c.QueryParams()["workload"]}
	raw, _ := json.Marshal(q)
	res, err := s.cfg.NodeOps.Command(ctx, c.Param("id"), node.Command{Kind: node.CommandMetricsQuery, Params: raw})
	if err != nil {
		return nodeOpError(err)
	}
	if res.Status != "ok" {
		return nodeRefusal(res)
	}
	return c.JSON(http.StatusOK, res.Metrics)
}

// nodeOpError maps a session error to a problem.
func nodeOpError(err error) error {
	switch {
	case errors.Is(err, session.ErrNotConnected):
		return problem(abierrors.Unavailable, "the node has no live session with this server; try again when it is connected")
	case errors.Is(err, session.ErrStreamLimit):
		return problem(abierrors.StreamLimit, "the node's session already carries its limit of open streams; close one and retry")
	}
	return err
}

// nodeRefusal turns a node's error answer into a problem with its code.
func nodeRefusal(res *node.CommandResult) error {
	code, msg := abierrors.Unavailable, res.Detail
	if res.Error != nil {
		if res.Error.Code != "" {
			code = abierrors.Code(res.Error.Code)
		}
		if res.Error.Message != "" {
			msg = res.Error.Message
		}
	}
	return problem(code, "the node refused: "+msg)
}
