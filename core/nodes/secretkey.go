package nodes

import (
	"context"
	"encoding/base64"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// SetBoxKey records key (base64, 32 bytes) as node id's X25519 key that workload secrets are
// sealed to (docs/node-protocol.md section 6.6), replacing prev with one conditional write
// carrying its change-log entry; the next desired state reseals every value to it. Errors: a
// malformed key; an error when the key stored is no longer prev (a concurrent rotation).
func (r *Registry) SetBoxKey(ctx context.Context, id, prev, key string) (*Node, error) {
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("box_public_key: %w", errBadKey)
	}
	update := bson.M{"$set": bson.M{"box_public_key": key}}
	pend, logged, err := logChange(ctx, id, node.OpUpdate, map[string]any{"id": id, "box_public_key": key})
	if err != nil {
		return nil, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
	}
	var cond bson.D
	if prev == "" {
		cond = bson.D{{Key: "box_public_key", Value: nil}}
	} else {
		cond = bson.D{{Key: "box_public_key", Value: prev}}
	}
	ok, err := r.st.UpdateIf(ctx, r.nodes, id, cond, update)
	if err != nil {
		return nil, fmt.Errorf("set secret key of %s: %w", id, err)
	}
	if !ok {
		return nil, fmt.Errorf("set secret key of %s: %w", id, ErrConflict)
	}
	n, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	n.LogOutbox = nil
	if logged {
		n.LogOutbox = []changelog.Pending{pend}
	}
	return n, nil
}
