package node

import "time"

// Shipping sealed log segments to the core (docs/node-protocol.md section 5.24, docs/logs.md
// section 6).
const (
	TypeLogSegment    Type = "log_segment"     // node to core: one piece of a sealed segment
	TypeLogSegmentAck Type = "log_segment_ack" // core to node; answers a log_segment
)

// LogSegmentChunkBytes is the most segment bytes one log_segment carries (before base64), so a
// message stays well under [MaxMessageBytes].
const LogSegmentChunkBytes = 512 << 10

// LogSegmentMaxBytes bounds a whole segment the core accepts.
const LogSegmentMaxBytes = 16 << 20

// LogSegmentInfo describes one sealed segment of a workload's log directory, as its index says.
type LogSegmentInfo struct {
	WorkloadID string    `json:"workload_id"`
	Name       string    `json:"name"`       // the file name on the node, for logs only
	FirstSeq   int64     `json:"first_seq"`  // sequence of its first record
	LastSeq    int64     `json:"last_seq"`   // sequence of its last record
	FirstTime  time.Time `json:"first_time"` // write stamp of its first record
	LastTime   time.Time `json:"last_time"`  // write stamp of its last record
	Records    int64     `json:"records"`
	RawBytes   int64     `json:"raw_bytes"` // bytes before compression
	Bytes      int64     `json:"bytes"`     // bytes of the compressed file
	SHA256     string    `json:"sha256"`    // hex SHA-256 of the file: its content address
}

// LogSegment carries the bytes Data of Segment from byte Offset on. The node sends a segment's
// pieces in order, each after the answer to the one before; a piece at Offset 0 starts the
// segment afresh (a session that ended mid-segment leaves nothing behind). Last reports whether
// Data ends the file. A first piece may carry no data: it only asks whether the core has the
// segment.
type LogSegment struct {
	Segment LogSegmentInfo `json:"segment"`
	Offset  int64          `json:"offset"`
	Data    []byte         `json:"data,omitempty"` // base64 in JSON, at most LogSegmentChunkBytes
	Last    bool           `json:"last,omitempty"`
}

// LogSegmentAck answers a LogSegment (re = its id). Stored reports that the core holds the whole
// segment and its index record (the node may mark it shipped); Have is Stored for a segment the
// core held already, by its content address. Otherwise NextOffset is the offset of the piece the
// core expects next. A refusal carries Code (from abi/errors) and Message; the node starts the
// segment over later.
type LogSegmentAck struct {
	Stored     bool   `json:"stored,omitempty"`
	Have       bool   `json:"have,omitempty"`
	NextOffset int64  `json:"next_offset,omitempty"`
	Code       string `json:"code,omitempty"`
	Message    string `json:"message,omitempty"`
}
