package services

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// MarkUnreported sets observed_status and health to "unknown" for every
// workload placed on nodeID that a full status report did not mention
// (reported holds the ids it did). A workload the core knows and the node does
// not report is unknown, never assumed gone (docs/node-protocol.md section
// 5.3): only the node's explicit "deleted", or the core removing the record,
// ends it. Workloads still "creating" (the node may not have received them yet)
// and those already unknown or deleted are left alone. It reports whether any
// workload changed.
func (c *Catalog) MarkUnreported(ctx context.Context, nodeID string, reported []string) (bool, error) {
	if reported == nil {
		reported = []string{}
	}
	res, err := c.workloads.UpdateMany(ctx, bson.M{
		"node_id":         nodeID,
		"_id":             bson.M{"$nin": reported},
		"observed_status": bson.M{"$nin": bson.A{"creating", "unknown", "deleted"}},
	}, bson.M{"$set": bson.M{"observed_status": "unknown", "health": "unknown", "observed_at": c.now().UTC()}})
	if err != nil {
		return false, fmt.Errorf("mark unreported workloads of %s unknown: %w", nodeID, err)
	}
	return res.ModifiedCount > 0, nil
}
