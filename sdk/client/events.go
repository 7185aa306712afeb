package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// EventRecord is one stored event as GET /api/v1/events answers it: its seq, when the core
// received it, and the event (docs/node-protocol.md section 5.4) as raw fields.
type EventRecord struct {
	Seq        int64     `json:"seq"`
	ReceivedAt time.Time `json:"received_at"`
	Event      struct {
		ID        string    `json:"id"`
		Type      string    `json:"type"`
		Time      time.Time `json:"time"`
		ProjectID string    `json:"project_id,omitempty"`
		Subject   struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		} `json:"subject"`
		Data map[string]json.RawMessage `json:"data,omitempty"`
	} `json:"event"`
}

// Events lists up to 100 events after seq afterSeq, oldest first; typ, when not empty, keeps
// only that type (GET /events, scope nodes:read).
func (c *Client) Events(ctx context.Context, afterSeq int64, typ string) ([]EventRecord, error) {
	q := url.Values{"after_seq": {strconv.FormatInt(afterSeq, 10)}}
	if typ != "" {
		q.Set("type", typ)
	}
	var out List[EventRecord]
	if err := c.do(ctx, http.MethodGet, "/events", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}
