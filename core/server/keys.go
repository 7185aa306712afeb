package server

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/session"
)

// keyRotator rotates berthd's cluster signing key (docs/node-protocol.md
// section 5.21): the new key is persisted first (the old one kept among the
// retired keys), then every live node is handed it signed by the key it
// pins, then the sessions sign with it. A node away during the rotation
// names its old key in its next hello and is handed the new one then.
type keyRotator struct {
	dataDir  string
	sessions *session.Server
}

var _ api.KeyRotator = keyRotator{}

// RotateSigningKey implements api.KeyRotator. It waits up to 30 s for the
// live nodes' answers.
func (k keyRotator) RotateSigningKey(ctx context.Context) (api.KeyRotation, error) {
	_, next, err := identity.RotateSigningKey(k.dataDir)
	if err != nil {
		return api.KeyRotation{}, fmt.Errorf("rotate the cluster signing key: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pub := next.Public().(ed25519.PublicKey)
	out := api.KeyRotation{KeyID: node.KeyID(pub), PublicKey: base64.StdEncoding.EncodeToString(pub)}
	for _, r := range k.sessions.RotateSigningKey(wctx, next) {
		n := api.NodeKeyRotated{NodeID: r.NodeID, Acknowledged: r.Acknowledged}
		if r.Err != nil {
			n.Error = r.Err.Error()
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out, nil
}
