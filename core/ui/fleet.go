package ui

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// The workload and node pages (docs/ui.md section 1): what runs where, how it fares, its
// output, and what each node offers and uses. Every read is an API read with the viewer's
// bearer, like every other page.

// workloadRows lists the workloads the viewer may read, failing first (crashed or restarting,
// then by restarts), then by service and slot.
func workloadRows(ctx context.Context, c *client.Client) ([]client.Workload, error) {
	wls, err := c.ListWorkloads(ctx, "")
	if err != nil {
		return nil, err
	}
	bad := func(w client.Workload) int {
		if w.DesiredStatus == "running" && (w.ObservedStatus == "crashed" || w.RestartCount >= crashRestarts) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(wls, func(a, b client.Workload) int {
		return cmp.Or(cmp.Compare(bad(a), bad(b)), cmp.Compare(b.RestartCount, a.RestartCount),
			strings.Compare(a.Project, b.Project), strings.Compare(a.Service, b.Service), cmp.Compare(a.Slot, b.Slot))
	})
	return wls, nil
}

// logTail is how many of a workload's newest lines its page shows.
const logTail = 200

// workloadData is what a workload's page shows: the workload and, when its node answers, its
// newest output (LogsErr says why not otherwise); After is the sequence number of the last line
// shown, where the page's live log ([Handler.logStream]) goes on from.
type workloadData struct {
	Workload client.Workload
	Logs     []node.LogLine
	LogsNote string
	LogsErr  string
	After    int64
}

// loadWorkloadStatus reads workload id through the API, without its output: the page's live
// region (its output streams on its own).
func loadWorkloadStatus(ctx context.Context, c *client.Client, id string) (*workloadData, error) {
	wls, err := c.ListWorkloads(ctx, "")
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(wls, func(w client.Workload) bool { return w.ID == id })
	if i < 0 {
		return nil, &client.APIError{Status: http.StatusNotFound, Problem: client.Problem{Code: "workload_not_found", Detail: "There is no workload " + id + "."}}
	}
	return &workloadData{Workload: wls[i]}, nil
}

// loadWorkload reads workload id and its newest output through the API.
func loadWorkload(ctx context.Context, c *client.Client, id string) (*workloadData, error) {
	d, err := loadWorkloadStatus(ctx, c, id)
	if err != nil {
		return nil, err
	}
	logs, err := c.WorkloadLogs(ctx, id, logTail)
	switch {
	case err == nil:
		d.Logs, d.LogsNote = logs.Lines, logs.Detail
		for _, l := range d.Logs {
			d.After = max(d.After, l.Seq)
		}
	case ctx.Err() != nil:
		return nil, ctx.Err()
	default:
		d.LogsErr = "The node did not give the output: " + errText(err)
	}
	return d, nil
}

// errText is what an API error says in a page: its detail and code.
func errText(err error) string {
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		msg := cmp.Or(apiErr.Problem.Detail, apiErr.Problem.Title)
		if apiErr.Problem.Code != "" {
			msg += " (" + apiErr.Problem.Code + ")"
		}
		return msg
	}
	return "the API did not answer"
}

// nodeData is what a node's page shows: the node, the workloads on it, the leases it holds,
// and its latest measurement (Use) from the node's metrics ring.
type nodeData struct {
	Node      *client.Node
	Workloads []client.Workload
	Leases    []client.Lease
	Use       *node.NodeSample
	UseErr    string
}

// loadNode reads node id, its workloads, its leases and its latest sample through the API.
func loadNode(ctx context.Context, c *client.Client, id string) (*nodeData, error) {
	n, err := c.GetNode(ctx, id)
	if err != nil {
		return nil, err
	}
	d := &nodeData{Node: n}
	wls, err := c.ListWorkloads(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, w := range wls {
		if w.NodeID == id {
			d.Workloads = append(d.Workloads, w)
		}
	}
	// Without the lease subsystem the endpoint does not exist: no leases to show.
	if ls, err := c.ListLeases(ctx); err == nil {
		for _, l := range ls {
			if l.Holder == id {
				d.Leases = append(d.Leases, l)
			}
		}
	}
	if m, err := c.NodeMetrics(ctx, id); err == nil {
		if len(m.Node) > 0 {
			d.Use = &m.Node[len(m.Node)-1]
		}
	} else if ctx.Err() == nil {
		d.UseErr = errText(err)
	}
	return d, nil
}

// nodeSeries is the JSON of a node's chart data (GET /ui/nodes/{id}/metrics): uPlot's
// columns, time in Unix seconds, CPU busy in percent of all CPUs, memory used in MiB.
type nodeSeries struct {
	Time      []int64   `json:"time"`
	CPU       []float64 `json:"cpu_percent"`
	MemoryMiB []float64 `json:"memory_mib"`
	TotalMiB  float64   `json:"memory_total_mib"`
}

// nodeMetrics answers the node page's charts with the node's metrics ring, read through the
// API (GET /api/v1/nodes/{id}/metrics), as uPlot's columns.
func (h *Handler) nodeMetrics(w http.ResponseWriter, r *http.Request, v *viewer) {
	c, ctx := h.client(r, v.Bearer)
	m, err := c.NodeMetrics(ctx, r.PathValue("id"))
	if err != nil {
		var apiErr *client.APIError
		code := http.StatusServiceUnavailable
		if errors.As(err, &apiErr) {
			code = apiErr.Status
		}
		http.Error(w, errText(err), code)
		return
	}
	out := nodeSeries{Time: []int64{}, CPU: []float64{}, MemoryMiB: []float64{}}
	for _, s := range m.Node {
		out.Time = append(out.Time, s.Time.Unix())
		out.CPU = append(out.CPU, s.CPUUsage*100)
		out.MemoryMiB = append(out.MemoryMiB, float64(s.MemoryUsedBytes)/(1<<20))
		out.TotalMiB = float64(s.MemoryTotalBytes) / (1 << 20)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

func (h *Handler) workloadsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "workloads", "Workloads", nil)
}

// workloadPage renders a workload's page: its status (the live region, kept current by its
// stream) and its newest output, which the page's live log ([Handler.logStream]) extends.
func (h *Handler) workloadPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	id := r.PathValue("id")
	c, ctx := h.client(r, v.Bearer)
	d, err := loadWorkload(ctx, c, id)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	q := map[string]string{"id": id}
	h.render(w, r, http.StatusOK, "workload", &pageData{Viewer: v, Title: "Workload " + id, Nav: "workload",
		Stream: "/ui/stream/workload?" + url.Values{"id": {id}}.Encode(), Data: d, Query: q})
}

// logStreamURL is where a workload page's live log streams from: the workload's log after seq.
func logStreamURL(id string, after int64) string {
	return "/ui/stream/logs/" + url.PathEscape(id) + "?after=" + strconv.FormatInt(after, 10)
}

func (h *Handler) nodePage(w http.ResponseWriter, r *http.Request, v *viewer) {
	id := r.PathValue("id")
	h.page(w, r, v, "node", "Node "+id, map[string]string{"id": id})
}

// workloadURL and nodeURL are the dashboard pages of a workload and a node.
func workloadURL(id string) string { return "/ui/workloads/" + url.PathEscape(id) }
func nodeURL(id string) string     { return "/ui/nodes/" + url.PathEscape(id) }

// logTime is a log line's time as the page shows it; "" without one.
func logTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("15:04:05.000")
}

// mib shows a byte count in MiB.
func mib(b int64) string { return strconv.FormatInt(b>>20, 10) + " MiB" }

// percent shows a fraction (0 to 1) in percent.
func percent(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + " %" }
