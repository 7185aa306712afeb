package agent

import (
	"context"
	"encoding/json"
	"testing"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
)

// TestLogsQueryWithTimeWindowRefused: output kept without line times cannot
// be cut by since/until, so such a query is answered unimplemented instead of
// with lines outside the window (docs/node-protocol.md section 5.17).
func TestLogsQueryWithTimeWindowRefused(t *testing.T) {
	c := &commands{}
	for _, params := range []string{
		`{"workload_id":"wl_1","since":"2026-11-29T10:00:00Z"}`,
		`{"workload_id":"wl_1","until":"2026-11-29T10:00:00Z"}`,
	} {
		res := c.Command(context.Background(), node.Command{Kind: node.CommandLogsQuery, Params: json.RawMessage(params)})
		if res.Status != "error" || res.Error == nil || res.Error.Code != string(berrors.Unimplemented) {
			t.Errorf("logs_query %s answered %+v, want error unimplemented", params, res)
		}
	}
}
