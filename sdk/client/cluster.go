package client

import (
	"context"
	"net/http"
)

// KeyRotation is the answer of [Client.RotateSigningKey]: the new cluster
// signing key and what each live node answered (docs/node-protocol.md
// section 5.21).
type KeyRotation struct {
	KeyID     string           `json:"key_id"`
	PublicKey string           `json:"public_key"`
	Nodes     []NodeKeyRotated `json:"nodes"`
}

// NodeKeyRotated is one live node's answer. A node that did not acknowledge,
// or was not connected, is handed the key at its next session.
type NodeKeyRotated struct {
	NodeID       string `json:"node_id"`
	Acknowledged bool   `json:"acknowledged"`
	Error        string `json:"error,omitempty"`
}

// RotateSigningKey replaces the cluster signing key (scope admin): berthd
// hands every node the new key signed by the one it pins, then signs with
// the new key.
func (c *Client) RotateSigningKey(ctx context.Context) (*KeyRotation, error) {
	var out KeyRotation
	if err := c.doJSON(ctx, http.MethodPost, "/cluster/signing-key/rotate", struct{}{}, true, &out); err != nil {
		return nil, err
	}
	out.Nodes = nonNil(out.Nodes)
	return &out, nil
}
