package services

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// MarkUnreportedIDs sets observed_status and health to "unknown" for each of
// ids (workloads a full status report of nodeID left out) that is placed on
// nodeID and neither "creating", "unknown" nor "deleted". A workload the core
// knows and the node does not report is unknown, never assumed gone
// (docs/node-protocol.md section 5.3): only the node's explicit "deleted", or
// the core removing the record, ends it. Workloads still "creating" (the node
// may not have received them yet) are left alone. Every read and write is by
// _id (one compare-and-set per workload on its node and status), so a status
// report never makes the store scan the workloads of the whole cluster. It
// reports whether any workload changed.
func (c *Catalog) MarkUnreportedIDs(ctx context.Context, nodeID string, ids []string) (bool, error) {
	changed := false
	now := c.now().UTC()
	for _, id := range ids {
		var w Workload
		err := c.st.View().Get(ctx, c.workloads, id, &w)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return changed, fmt.Errorf("mark unreported workload %s unknown: %w", id, err)
		}
		if w.NodeID != nodeID || w.ObservedStatus == "creating" || w.ObservedStatus == "unknown" || w.ObservedStatus == "deleted" {
			continue
		}
		ok, err := c.st.UpdateIf(ctx, c.workloads, id, bson.D{{Key: "node_id", Value: nodeID}, {Key: "observed_status", Value: w.ObservedStatus}},
			bson.M{"$set": bson.M{"observed_status": "unknown", "health": "unknown", "observed_at": now}})
		if err != nil {
			return changed, fmt.Errorf("mark unreported workload %s unknown: %w", id, err)
		}
		changed = changed || ok
	}
	return changed, nil
}
