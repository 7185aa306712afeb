package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
)

// KeyRotator replaces the cluster signing key (docs/node-protocol.md section
// 5.21): it persists a new key, hands it to every live node signed by the
// key the node pins, and then signs with it. core/server provides it.
type KeyRotator interface {
	RotateSigningKey(ctx context.Context) (KeyRotation, error)
}

// KeyRotation is the answer of POST /api/v1/cluster/signing-key/rotate:
// the new key's id and public key, and what each live node answered.
type KeyRotation struct {
	KeyID     string           `json:"key_id"`
	PublicKey string           `json:"public_key"`
	Nodes     []NodeKeyRotated `json:"nodes"`
}

// NodeKeyRotated is one live node's answer to signing_key_rotate. A node that
// did not acknowledge (or was not connected) is handed the key at its next
// handshake.
type NodeKeyRotated struct {
	NodeID       string `json:"node_id"`
	Acknowledged bool   `json:"acknowledged"`
	Error        string `json:"error,omitempty"`
}

// rotateSigningKey serves POST /api/v1/cluster/signing-key/rotate (scope admin).
// The body is empty or the empty object {}.
func (s *Server) rotateSigningKey(c echo.Context) error {
	if err := s.bindOptional(c, &struct{}{}); err != nil {
		return err
	}
	out, err := s.cfg.KeyRotator.RotateSigningKey(c.Request().Context())
	if err != nil {
		return err
	}
	if out.Nodes == nil {
		out.Nodes = []NodeKeyRotated{}
	}
	return c.JSON(http.StatusOK, out)
}
