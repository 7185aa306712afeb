package nodes

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/identity"
)

// Remove marks node id removed (docs/node-protocol.md section 10) and returns
// it as it is now, with whether this call removed it (false when it already
// was). A removed node never authenticates for the API again and is never
// placed on; its session, if any, is ended by the caller with node_removed.
// Its workloads are not touched here: the reconciler moves them. ErrNotFound
// when no such node exists. Idempotent.
func (r *Registry) Remove(ctx context.Context, id string) (*Node, bool, error) {
	res, err := r.nodes.UpdateOne(ctx, bson.M{"_id": id, "status": bson.M{"$ne": StatusRemoved}},
		bson.M{"$set": bson.M{"status": StatusRemoved, "session_id": ""}})
	if err != nil {
		return nil, false, fmt.Errorf("remove node %s: %w", id, err)
	}
	n, err := r.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	return n, res.ModifiedCount > 0, nil
}

// Credential returns the node whose credential is cred, removed or not, or
// ErrUnauthenticated. Only the session endpoint uses it, to tell a removed
// node that it was removed (fatal node_removed) instead of refusing it with a
// generic 401 it would keep retrying.
func (r *Registry) Credential(ctx context.Context, cred string) (*Node, error) {
	if cred == "" {
		return nil, ErrUnauthenticated
	}
	var n Node
	err := r.nodes.FindOne(ctx, bson.M{"credential_digest": identity.Digest(cred)}).Decode(&n)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("authenticate node: %w", err)
	}
	return &n, nil
}
