package node

import (
	"encoding/json"
	"time"
)

// Command, stream and key-rotation message types (docs/node-protocol.md
// sections 5.7, 5.8, 5.15 to 5.17 and 5.21).
const (
	TypeCommand          Type = "command"            // core to node
	TypeStreamOpen       Type = "stream_open"        // core to node
	TypeStreamClose      Type = "stream_close"       // core to node
	TypeStreamData       Type = "stream_data"        // node to core
	TypeStreamEnd        Type = "stream_end"         // node to core
	TypeSigningKeyRotate Type = "signing_key_rotate" // core to node
)

// Command kinds (section 5.17).
const (
	CommandLogsQuery    = "logs_query"
	CommandProbe        = "probe"
	CommandMetricsQuery = "metrics_query"
	// CommandSecretKeyRotate asks the node for a new X25519 key for workload secrets
	// (section 6.6); the answer's SecretKey is its public key.
	CommandSecretKeyRotate = "secret_key_rotate"
)

// Stream kinds (section 5.15). v1 serves app_logs only.
const StreamAppLogs = "app_logs"

// MaxStreamsPerSession is how many streams may be open at once on one
// session; the next stream_open is refused with stream_limit (section 5.15).
const MaxStreamsPerSession = 32

// Stream end reasons (section 5.8).
const (
	StreamCompleted = "completed" // the source ended
	StreamCancelled = "cancelled" // the answer to stream_close
	StreamError     = "error"     // the source failed; Detail says how
)

// Command asks the node for a one-off answer (section 5.17); the node
// answers with one [CommandResult] whose re is the command's id.
type Command struct {
	Kind   string          `json:"kind"`
	Params json.RawMessage `json:"params,omitempty"`
}

// LogsQuery is the params of logs_query: WorkloadID (required), Since and
// Until bound the lines by their time, Tail keeps only the newest Tail lines
// (0: as many as fit the 1 MiB message).
type LogsQuery struct {
	WorkloadID string     `json:"workload_id"`
	Since      *time.Time `json:"since,omitempty"`
	Until      *time.Time `json:"until,omitempty"`
	Tail       int        `json:"tail,omitempty"`
	// AfterSeq, when above zero, asks for the records after this sequence number, oldest
	// first, as many as fit one answer; [CommandResult.More] reports that more follow.
	// The core reads the live tail after what it holds shipped this way (docs/logs.md
	// section 6). Nodes that do not know the field answer as without it.
	AfterSeq int64 `json:"after_seq,omitempty"`
}

// LogLine is one line of workload output (section 5.7). For output a log
// writer stamped (docs/logs.md), Time is when the workload wrote it, Stream
// "stdout" or "stderr", Seq the record's sequence number and Partial reports
// whether the line goes on in a later line of the same stream (a line split
// at 16 KiB, or text without its newline). For other output Time is when the
// node read it, zero when unknown (lines already in the file when the agent
// started), Seq is 0, and Stream is "output" when the runtime driver merges
// both streams into one file.
type LogLine struct {
	Time       *time.Time `json:"time,omitempty"`
	Stream     string     `json:"stream"`
	Line       string     `json:"line"`
	WorkloadID string     `json:"workload_id,omitempty"`
	Seq        int64      `json:"seq,omitempty"`
	Partial    bool       `json:"partial,omitempty"`
}

// MetricsQuery is the params of metrics_query: Node asks for the node's
// samples, WorkloadIDs for those workloads'; at least one is set.
type MetricsQuery struct {
	Node        bool     `json:"node,omitempty"`
	WorkloadIDs []string `json:"workload_ids,omitempty"`
}

// Metrics is the answer to metrics_query (section 5.17): the in-memory
// samples of the last 10 minutes, oldest first.
type Metrics struct {
	IntervalS float64           `json:"interval_s"`
	Node      []NodeSample      `json:"node,omitempty"`
	Workloads []WorkloadSamples `json:"workloads,omitempty"`
}

// NodeSample is one node measurement: CPUUsage is the busy fraction of all
// CPUs over the interval (0 to 1, /proc/stat); MemoryUsedBytes is MemTotal
// minus MemAvailable (/proc/meminfo).
type NodeSample struct {
	Time             time.Time `json:"time"`
	CPUUsage         float64   `json:"cpu_usage"`
	CPUCount         int       `json:"cpu_count"`
	MemoryTotalBytes int64     `json:"memory_total_bytes"`
	MemoryUsedBytes  int64     `json:"memory_used_bytes"`
}

// WorkloadSamples are one workload's samples.
type WorkloadSamples struct {
	WorkloadID string           `json:"workload_id"`
	Samples    []WorkloadSample `json:"samples"`
}

// WorkloadSample is one workload measurement from the runtime driver's
// Stats: CPUUsage is CPU seconds used over the interval divided by the
// interval (1 = one CPU busy); MemoryRSSBytes its resident memory.
type WorkloadSample struct {
	Time           time.Time `json:"time"`
	CPUUsage       float64   `json:"cpu_usage"`
	MemoryRSSBytes int64     `json:"memory_rss_bytes"`
}

// Probe is the answer of the probe command in CommandResult.Probe: each
// runtime driver's Describe answer, and each node-network plugin's (absent
// when the node runs none).
type Probe struct {
	Drivers  []DriverProbe `json:"drivers"`
	Networks []DriverProbe `json:"networks,omitempty"`
}

// DriverProbe is one runtime driver's, or one network plugin's, Describe
// answer (a network plugin reports no capabilities).
type DriverProbe struct {
	Name         string   `json:"name"`
	Version      string   `json:"version"`
	APIVersions  []int    `json:"api_versions,omitempty"`
	Capabilities []string `json:"capabilities,omitempty"`
}

// StreamOpen opens a stream (section 5.15). StreamID is chosen by the core
// and names the stream in every later message. For app_logs, Params is a
// [LogsQuery] with Tail the number of existing lines sent first; the stream
// then follows new output.
type StreamOpen struct {
	StreamID string          `json:"stream_id"`
	Kind     string          `json:"kind"`
	Params   json.RawMessage `json:"params,omitempty"`
}

// StreamClose asks the node to stop a stream; it answers stream_end
// cancelled. An unknown id is ignored (section 5.16).
type StreamClose struct {
	StreamID string `json:"stream_id"`
}

// StreamData carries output of a stream; Seq counts from 1 per stream (section 5.7).
type StreamData struct {
	StreamID string    `json:"stream_id"`
	Seq      int64     `json:"seq"`
	Lines    []LogLine `json:"lines"`
}

// StreamEnd says a stream finished (section 5.8).
type StreamEnd struct {
	StreamID string `json:"stream_id"`
	Reason   string `json:"reason"`
	Detail   string `json:"detail,omitempty"`
}

// SigningKeyRotate hands the node a new cluster signing key (section 5.21):
// PublicKey is base64 (std) Ed25519, KeyID the hex SHA-256 of its bytes, and
// Signature the signature by the key the node currently pins over the RFC
// 8785 form of the body without signature ([SignRotate], [VerifyRotate]).
type SigningKeyRotate struct {
	KeyID     string `json:"key_id"`
	PublicKey string `json:"public_key"`
	Signature string `json:"signature,omitempty"`
}
