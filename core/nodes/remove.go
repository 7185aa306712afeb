package nodes

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Remove marks node id removed (docs/node-protocol.md section 10) and returns
// it as it is now, with whether this call removed it (false when it already
// was). A removed node never authenticates for the API again and is never
// placed on; its session, if any, is ended by the caller with node_removed.
// Its workloads are not touched here: the reconciler moves them. ErrNotFound
// when no such node exists. Idempotent.
func (r *Registry) Remove(ctx context.Context, id string) (*Node, bool, error) {
	update := bson.M{"$set": bson.M{"status": StatusRemoved, "session_id": ""}}
	pend, logged, err := logChange(ctx, id, node.OpDelete, nil)
	if err != nil {
		return nil, false, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
	}
	res, err := r.nodes.UpdateOne(ctx, bson.M{"_id": id, "status": bson.M{"$ne": StatusRemoved}}, update)
	if err != nil {
		return nil, false, fmt.Errorf("remove node %s: %w", id, err)
	}
	n, err := r.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	// Only this call's change is the caller's to hand to the log.
	n.LogOutbox = nil
	if res.ModifiedCount > 0 && logged {
		n.LogOutbox = []changelog.Pending{pend}
	}
	return n, res.ModifiedCount > 0, nil
}

// Credential returns the node whose credential is cred, removed or not. It
// returns exactly ErrUnauthenticated when cred matches no node's current
// credential, and a wrapped store error when the store could not answer (the
// session endpoint answers that 503, so a node is never told a good
// credential is bad). Only the session endpoint uses it, to tell a removed
// node that it was removed (fatal node_removed) instead of refusing it with a
// generic 401 it would keep retrying.
func (r *Registry) Credential(ctx context.Context, cred string) (*Node, error) {
	if cred == "" {
		return nil, ErrUnauthenticated
	}
	return r.byCredential(ctx, identity.Digest(cred))
}

// credentialDoc maps a node credential's digest to its node, so a session
// finds its node with reads by _id only (the embedded store scans a whole
// collection for any other filter).
type credentialDoc struct {
	Digest string `bson:"_id"`
	NodeID string `bson:"node_id"`
}

// byCredential returns the node whose credential digest is digest, removed or
// not, exactly ErrUnauthenticated when there is none, or a wrapped store
// error. A node enrolled before the credential index existed is found by its
// digest once and indexed then.
func (r *Registry) byCredential(ctx context.Context, digest string) (*Node, error) {
	var cd credentialDoc
	// From the read view too: a dialling fleet's credential checks cost map lookups, not store
	// round trips (a re-read by _id after the entry was written).
	err := r.st.View().Get(ctx, r.creds, digest, &cd)
	if errors.Is(err, store.ErrNotFound) {
		// From the read view: an unknown credential must not make the store scan the nodes.
		var found []Node
		if err := r.st.View().Find(ctx, r.nodes, bson.D{{Key: "credential_digest", Value: digest}}, &found); err != nil {
			return nil, fmt.Errorf("authenticate node: %w", err)
		}
		if len(found) == 0 {
			return nil, ErrUnauthenticated
		}
		n := found[0]
		if _, err := r.creds.InsertOne(ctx, credentialDoc{Digest: digest, NodeID: n.ID}); err != nil && !store.IsDuplicateKey(err) {
			return nil, fmt.Errorf("index node credential: %w", err)
		}
		return &n, nil
	}
	if err != nil {
		return nil, fmt.Errorf("authenticate node: %w", err)
	}
	n, err := r.Get(ctx, cd.NodeID)
	if errors.Is(err, ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("authenticate node: %w", err)
	}
	if !identity.Equal(n.CredentialDigest, digest) {
		return nil, ErrUnauthenticated // an index entry left from a credential the node no longer has
	}
	return n, nil
}
