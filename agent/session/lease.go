package session

import (
	"context"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
)

// onLeaseGrant verifies a lease_grant against the pinned key and hands it
// to the lease manager (docs/node-protocol.md section 5.12). A bad
// signature or a refused grant is answered with a non-fatal error and
// changes nothing. It returns an error only when the session must end.
func (s *conn) onLeaseGrant(ctx context.Context, env node.Envelope) error {
	c := s.c
	if c.cfg.Leases == nil {
		return s.sendError(ctx, env.ID, berrors.Unimplemented, "this agent does not hold leases", false)
	}
	g, err := node.VerifyLeaseGrant(env.Body, c.clusterKey())
	if err != nil {
		c.log.Warn("refused lease_grant with a bad signature", "error", err)
		return s.sendError(ctx, env.ID, berrors.BadSignature, "lease_grant signature does not verify against the cluster signing key", false)
	}
	if refused := c.cfg.Leases.Grant(ctx, env.Re, g); refused != nil {
		return s.sendError(ctx, env.ID, berrors.Code(refused.Code), refused.Message, false)
	}
	return nil
}

// onLeaseRevoke verifies a lease_revoke, fences the lease and answers
// command_result, all before the read loop takes the next message
// (docs/node-protocol.md sections 4.2 and 5.13). It returns an error only
// when the session must end.
func (s *conn) onLeaseRevoke(ctx context.Context, env node.Envelope) error {
	c := s.c
	if c.cfg.Leases == nil {
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{Status: "error",
			Error: &node.ErrorBody{Code: string(berrors.Unimplemented), Message: "this agent does not hold leases"}})
	}
	r, err := node.VerifyLeaseRevoke(env.Body, c.clusterKey())
	if err != nil {
		c.log.Warn("refused lease_revoke with a bad signature", "error", err)
		return s.sendError(ctx, env.ID, berrors.BadSignature, "lease_revoke signature does not verify against the cluster signing key", false)
	}
	res, refused := c.cfg.Leases.Revoke(ctx, r)
	if refused != nil {
		return s.sendError(ctx, env.ID, berrors.Code(refused.Code), refused.Message, false)
	}
	return s.send(ctx, node.TypeCommandResult, env.ID, res)
}
