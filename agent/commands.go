package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/metrics"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/agent/session"
	"github.com/berthhq/berth/agent/upgrade"
)

// answerBudget is how many bytes of log lines a logs_query answer carries at
// most, leaving room for the envelope within the 1 MiB message limit.
const answerBudget = node.MaxMessageBytes - 64<<10

// commands serves the core's commands and streams from the runtime driver
// and the metrics ring (docs/node-protocol.md sections 5.15 to 5.17).
type commands struct {
	driver runtime.Driver
	ring   *metrics.Ring
	now    func() time.Time
	leases *lease.Manager // nil refuses fence_ack
	// upgrade serves agent_upgrade of the agent binary, plugin that of the
	// runtime driver plugin and netPlugin that of the network plugin
	// (docs/upgrades.md sections 3 and 3.5); nil refuses it.
	upgrade, plugin, netPlugin *upgrade.Manager
	pluginName                 string // "berth-plugin-<driver>"
	// network is the node-network plugin's Describe answer, reported in
	// probe; nil when the node runs none.
	network *network.DescribeResponse
	// dataDir is the agent's data directory: it holds the node's secret key (empty refuses
	// secret_key_rotate) and the output of removed workloads ([reconcile.PreviousLogPath]).
	dataDir string
}

var _ session.Commands = (*commands)(nil)

func errorResult(code berrors.Code, msg string) node.CommandResult {
	return node.CommandResult{Status: "error", Detail: msg, Error: &node.ErrorBody{Code: string(code), Message: msg}}
}

// Command answers logs_query, probe, metrics_query, fence_ack and
// agent_upgrade; any other kind with bad_message.
func (c *commands) Command(ctx context.Context, cmd node.Command) node.CommandResult {
	switch cmd.Kind {
	case node.CommandProbe:
		d, err := c.driver.Describe(ctx)
		if err != nil {
			return errorResult(berrors.Unavailable, "runtime driver did not answer Describe: "+err.Error())
		}
		p := node.DriverProbe{Name: d.Name, Version: d.Version, APIVersions: d.APIVersions}
		if d.Capabilities.OutlivesDriver {
			p.Capabilities = append(p.Capabilities, "outlives_driver")
		}
		if d.Capabilities.Logs {
			p.Capabilities = append(p.Capabilities, "logs")
		}
		if d.Capabilities.Stats {
			p.Capabilities = append(p.Capabilities, "stats")
		}
		probe := &node.Probe{Drivers: []node.DriverProbe{p}}
		detail := fmt.Sprintf("driver %s %s", d.Name, d.Version)
		if n := c.network; n != nil {
			probe.Networks = []node.DriverProbe{{Name: n.Name, Version: n.Version, APIVersions: n.APIVersions}}
			detail += fmt.Sprintf(", network %s %s", n.Name, n.Version)
		}
		return node.CommandResult{Status: "ok", Detail: detail, Probe: probe}
	case node.CommandMetricsQuery:
		var q node.MetricsQuery
		if err := json.Unmarshal(cmd.Params, &q); err != nil || (!q.Node && len(q.WorkloadIDs) == 0) {
			return errorResult(berrors.BadMessage, "metrics_query needs node or workload_ids")
		}
		m := c.ring.Query(q)
		return node.CommandResult{Status: "ok", Metrics: &m}
	case node.CommandLogsQuery:
		var q node.LogsQuery
		if err := json.Unmarshal(cmd.Params, &q); err != nil || q.WorkloadID == "" {
			return errorResult(berrors.BadMessage, "logs_query needs workload_id")
		}
		stamped, hasRecords := c.recordsOf(q.WorkloadID)
		if (q.Since != nil || q.Until != nil) && !hasRecords {
			// Output kept without line times cannot be cut by time; saying so
			// beats answering lines outside the asked window.
			return errorResult(berrors.Unimplemented, "this node's runtime driver keeps output without line times, so since and until cannot apply; ask with tail instead")
		}
		var lines []node.LogLine
		var dropped, more bool
		var err error
		if hasRecords && q.AfterSeq > 0 {
			lines, more, err = afterRecords(stamped, q)
		} else if hasRecords {
			lines, dropped, err = queryRecords(stamped, q)
		} else {
			lines, dropped, err = c.queryLogs(ctx, q)
		}
		if err != nil {
			if errors.Is(err, runtime.ErrNotFound) {
				return errorResult(berrors.NotFound, "no workload "+q.WorkloadID+" on this node")
			}
			return errorResult(berrors.Unavailable, err.Error())
		}
		res := node.CommandResult{Status: "ok", Lines: lines, More: more}
		if dropped {
			res.Detail = "older lines were left out to fit the message limit"
			if q.Tail > 0 && len(lines) == q.Tail {
				res.Detail = fmt.Sprintf("the newest %d lines, as asked", q.Tail)
			}
		}
		if hasRecords {
			if lost := stamped.dropped(); lost != "" {
				res.Detail = strings.TrimPrefix(res.Detail+"; "+lost, "; ")
			}
		}
		return res
	case node.CommandFenceAck:
		var p node.FenceAckParams
		if err := json.Unmarshal(cmd.Params, &p); err != nil || len(p.LeaseIDs) == 0 {
			return errorResult(berrors.BadMessage, "fence_ack needs lease_ids")
		}
		if c.leases == nil {
			return errorResult(berrors.Unimplemented, "this agent holds no leases")
		}
		return c.leases.Ack(ctx, p.LeaseIDs)
	case node.CommandAgentUpgrade:
		var p node.AgentUpgrade
		if err := json.Unmarshal(cmd.Params, &p); err != nil || p.Version == "" {
			return errorResult(berrors.BadMessage, "agent_upgrade needs version and releases")
		}
		switch {
		case p.Program == "" || p.Program == "berth-agent":
			if c.upgrade == nil {
				return errorResult(berrors.Unimplemented, "this agent was started without self-upgrade")
			}
			return c.upgrade.Upgrade(ctx, p)
		case p.Program == c.pluginName && c.plugin != nil:
			return c.plugin.Upgrade(ctx, p)
		case p.Program == c.netPluginName() && c.netPlugin != nil:
			return c.netPlugin.Upgrade(ctx, p)
		case p.Program == c.pluginName || p.Program == c.netPluginName():
			return errorResult(berrors.Unimplemented, p.Program+" is pinned by a plugin catalog on this node; update the catalog and restart the agent instead")
		default:
			runs := c.pluginName
			if n := c.netPluginName(); n != "" {
				runs += " and " + n
			}
			return errorResult(berrors.ReleaseNotFound, fmt.Sprintf("this node runs no %s to upgrade (it runs %s)", p.Program, runs))
		}
	case node.CommandSecretKeyRotate:
		if c.dataDir == "" {
			return errorResult(berrors.Unimplemented, "this agent keeps no secret key")
		}
		pub, err := reconcile.RotateSecretKey(c.dataDir)
		if err != nil {
			return errorResult(berrors.Internal, "rotate the node secret key: "+err.Error())
		}
		return node.CommandResult{Status: "ok", Detail: "new secret key", SecretKey: base64.StdEncoding.EncodeToString(pub[:])}
	default:
		return errorResult(berrors.BadMessage, fmt.Sprintf("unknown command kind %q", cmd.Kind))
	}
}

// netPluginName returns "berth-plugin-<network>" for the node's network
// plugin, or "" when it runs none.
func (c *commands) netPluginName() string {
	if c.network == nil {
		return ""
	}
	return "berth-plugin-" + c.network.Name
}

// queryLogs reads the newest output of a workload and keeps the newest lines
// that fit answerBudget (and q.Tail); dropped reports that older lines were
// left out. The process driver keeps stdout and stderr in one file without
// times, so its lines carry stream "output" and no time, and since/until
// cannot apply to them.
func (c *commands) queryLogs(ctx context.Context, q node.LogsQuery) ([]node.LogLine, bool, error) {
	ls, ok := c.driver.(runtime.LogStreamer)
	if !ok {
		return nil, false, errors.New("the runtime driver serves no logs")
	}
	var buf bytes.Buffer
	if err := ls.Logs(ctx, &runtime.LogsRequest{WorkloadID: q.WorkloadID, TailBytes: answerBudget}, &buf); err != nil {
		// A removed workload's output may be kept: the attempt a slot ran before its current one.
		kept, kerr := c.previousLog(q.WorkloadID)
		if !errors.Is(err, runtime.ErrNotFound) || kerr != nil {
			return nil, false, fmt.Errorf("read logs of %s: %w", q.WorkloadID, err)
		}
		buf.Write(kept)
	}
	text := strings.TrimSuffix(buf.String(), "\n")
	if text == "" {
		return []node.LogLine{}, false, nil
	}
	all := strings.Split(text, "\n")
	dropped := len(buf.Bytes()) >= answerBudget && len(all) > 0
	if dropped {
		all = all[1:] // the first line may be cut
	}
	if q.Tail > 0 && len(all) > q.Tail {
		all, dropped = all[len(all)-q.Tail:], true
	}
	out := make([]node.LogLine, 0, len(all))
	size := 0
	for i := len(all) - 1; i >= 0; i-- {
		size += len(all[i]) + 64 // the JSON around a line
		if size > answerBudget {
			dropped = true
			break
		}
		out = append(out, node.LogLine{Stream: "output", Line: all[i], WorkloadID: q.WorkloadID})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, dropped, nil
}

// previousLog returns the kept output of removed workload id; an error wrapping
// fs.ErrNotExist when none is kept.
func (c *commands) previousLog(id string) ([]byte, error) {
	if c.dataDir == "" || !strings.HasPrefix(id, "wl_") || strings.ContainsAny(id, "/\\.") {
		return nil, fs.ErrNotExist
	}
	return os.ReadFile(reconcile.PreviousLogPath(c.dataDir, id))
}

// Stream serves app_logs: the newest params.tail lines (default 100), then
// new output as it comes, in batches, until ctx ends.
func (c *commands) Stream(ctx context.Context, open node.StreamOpen, send func([]node.LogLine) error) error {
	var q node.LogsQuery
	if err := json.Unmarshal(open.Params, &q); err != nil || q.WorkloadID == "" {
		return berrors.New(berrors.BadMessage, "app_logs needs params.workload_id")
	}
	tail := q.Tail
	if tail <= 0 {
		tail = 100
	}
	if src, ok := c.recordsOf(q.WorkloadID); ok {
		if q.AfterSeq > 0 {
			return followRecordsFrom(ctx, src, q.WorkloadID, q.AfterSeq+1, send)
		}
		return followRecords(ctx, src, q.WorkloadID, tail, send)
	}
	ls, ok := c.driver.(runtime.LogStreamer)
	if !ok {
		return berrors.New(berrors.Unimplemented, "the runtime driver serves no logs")
	}
	// The driver writes the kept output (up to 64 KiB) first, then follows;
	// the writer keeps only the newest tail lines of that first write.
	w := &lineWriter{id: q.WorkloadID, now: c.now, send: send, skip: -1, tail: tail}
	err := ls.Logs(ctx, &runtime.LogsRequest{WorkloadID: q.WorkloadID, Follow: true, TailBytes: 64 << 10}, w)
	if errors.Is(err, runtime.ErrNotFound) {
		return berrors.New(berrors.NotFound, "no workload "+q.WorkloadID+" on this node")
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// lineWriter turns driver output into batches of log lines; it keeps a
// partial last line until its newline arrives.
type lineWriter struct {
	mu      sync.Mutex
	id      string
	now     func() time.Time
	send    func([]node.LogLine) error
	partial []byte
	tail    int
	skip    int // lines of the first write to drop to honour tail; -1 until the first write
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	data := append(w.partial, p...)
	i := bytes.LastIndexByte(data, '\n')
	if i < 0 {
		w.partial = data
		return len(p), nil
	}
	w.partial = append([]byte(nil), data[i+1:]...)
	parts := strings.Split(string(data[:i]), "\n")
	// The first write is the kept output, written at times the node did not record: its
	// lines go without a time rather than with the time they were read.
	var stamp *time.Time
	if w.skip < 0 {
		w.skip = max(0, len(parts)-w.tail)
		parts = parts[w.skip:]
	} else {
		now := w.now().UTC()
		stamp = &now
	}
	for len(parts) > 0 {
		batch := make([]node.LogLine, 0, min(len(parts), 500))
		size := 0
		for len(parts) > 0 && len(batch) < 500 && size < answerBudget/2 {
			size += len(parts[0]) + 64
			batch = append(batch, node.LogLine{Time: stamp, Stream: "output", Line: parts[0], WorkloadID: w.id})
			parts = parts[1:]
		}
		if err := w.send(batch); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// workloadStats reads the runtime driver's counters of its running
// workloads for the metrics ring; nil when the driver measures nothing.
func workloadStats(d runtime.Driver) func(ctx context.Context) ([]metrics.WorkloadStat, error) {
	sr, ok := d.(runtime.StatsReporter)
	if !ok {
		return nil
	}
	return func(ctx context.Context) ([]metrics.WorkloadStat, error) {
		ws, err := d.List(ctx)
		if err != nil {
			return nil, err
		}
		var out []metrics.WorkloadStat
		for _, w := range ws {
			if w == nil || w.State != runtime.StateRunning {
				continue
			}
			st, err := sr.Stats(ctx, &runtime.StatsRequest{WorkloadID: w.WorkloadID})
			if err != nil {
				continue
			}
			out = append(out, metrics.WorkloadStat{WorkloadID: w.WorkloadID, CPUSeconds: st.CPUSeconds, RSSBytes: st.MemoryBytes})
		}
		return out, nil
	}
}
