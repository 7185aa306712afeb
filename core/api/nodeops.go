package api

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/berthhq/berth/core/services"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
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

// workloadLogs serves GET /api/v1/workloads/{id}/logs?tail=N[&follow=true].
// Without follow it answers {"lines": [...], "detail": "..."} from the
// node's logs_query. With follow it opens an app_logs stream and writes one
// JSON log line per text line (application/x-ndjson) until the client
// leaves or the stream ends. Errors: not_found (no such workload), 503
// unavailable (its node has no live session), 429 stream_limit (the node's
// session already carries 32 streams), and the node's own refusals.
func (s *Server) workloadLogs(c echo.Context) error {
	id := c.Param("id")
	if !strings.HasPrefix(id, "wl_") {
		return problem(abierrors.NotFound, "no workload "+id)
	}
	wls, err := s.cfg.Catalog.FindWorkloads(c.Request().Context(), services.WorkloadFilter{ID: id})
	if err != nil {
		return err
	}
	if len(wls) == 0 {
		return problem(abierrors.NotFound, "no workload "+id)
	}
	return s.logs(c, wls[0].NodeID, id)
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

// logs asks nodeID for workloadID's output, once or followed.
func (s *Server) logs(c echo.Context, nodeID, workloadID string) error {
	ctx := c.Request().Context()
	tail := 0
	if v := c.QueryParam("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLogTail {
			return problem(abierrors.ValidationFailed, "tail must be a whole number from 0 to 10000")
		}
		tail = n
	}
	follow := c.QueryParam("follow") == "true" || c.QueryParam("follow") == "1"
	q := node.LogsQuery{WorkloadID: workloadID, Tail: tail}
	if !follow {
		raw, _ := json.Marshal(q)
		res, err := s.cfg.NodeOps.Command(ctx, nodeID, node.Command{Kind: node.CommandLogsQuery, Params: raw})
		if err != nil {
			return nodeOpError(err)
		}
		if res.Status != "ok" {
			return nodeRefusal(res)
		}
		lines := res.Lines
		if lines == nil {
			lines = []node.LogLine{}
		}
		return c.JSON(http.StatusOK, map[string]any{"workload_id": workloadID, "node_id": nodeID, "lines": lines, "detail": res.Detail})
	}
	st, err := s.cfg.NodeOps.OpenStream(ctx, nodeID, node.StreamAppLogs, q)
	if err != nil {
		return nodeOpError(err)
	}
	defer func() { _ = st.Close(context.WithoutCancel(ctx)) }()
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Trailer", HeaderStreamEnd)
	w.WriteHeader(http.StatusOK)
	w.Flush()
	enc := json.NewEncoder(w)
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
				if err := enc.Encode(l); err != nil {
					return nil // the client left
				}
			}
			w.Flush()
		}
	}
}

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
