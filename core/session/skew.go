package session

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/coder/websocket"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/version"
)

// refuseSkew applies the skew rule (docs/upgrades.md section 2) to a
// session's hello: an agent, a runtime driver plugin of its driver_versions
// or a network plugin of its network_versions, whose version berthd does not accept gets a fatal
// agent_version_skew error naming both versions, then the close, and nothing
// about it is recorded as connected. It returns the end reason, or "" to go on.
// A version that is not a semantic version (test harnesses) and development
// builds are not judged; such a hello is logged.
func (s *Server) refuseSkew(ctx context.Context, c *conn, re string, hello *node.Hello) string {
	core := s.cfg.CoreVersion
	msg := ""
	check := func(what, v string) {
		err := version.CheckSkew(core, v)
		switch {
		case err == nil || msg != "":
		case errors.Is(err, version.ErrInvalid):
			s.log.Debug("version is not a semantic version; skew not checked", "node_id", c.nodeID, "component", what, "version", v)
		default:
			msg = what + " " + err.Error()
		}
	}
	check("agent", hello.AgentVersion)
	for _, name := range sortedKeys(hello.DriverVersions) {
		check("runtime driver plugin "+name, hello.DriverVersions[name])
	}
	for _, name := range sortedKeys(hello.NetworkVersions) {
		check("network plugin "+name, hello.NetworkVersions[name])
	}
	if msg == "" {
		return ""
	}
	s.sendError(ctx, c, re, abierrors.AgentVersionSkew, msg, true)
	s.log.Warn("refused an agent outside the version skew", "node_id", c.nodeID, "agent_version", hello.AgentVersion, "core_version", core)
	_ = c.ws.Close(websocket.StatusPolicyViolation, "agent version outside the supported skew")
	return "version_skew"
}

// sortedKeys returns m's keys in order; nil for an empty m.
func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
