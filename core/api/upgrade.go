package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/releases"
	"github.com/berthhq/berth/core/session"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/client"
)

// Upgrade timings (docs/upgrades.md section 3.1).
const (
	// DefaultUpgradeTimeout bounds the wait for an upgraded node to come back
	// when the request names none.
	DefaultUpgradeTimeout = 120 * time.Second
	// MaxUpgradeTimeout is the largest timeout_s accepted.
	MaxUpgradeTimeout = 10 * time.Minute
	// agentProgram is the release name of the agent binary.
	agentProgram = "berth-agent"
)

func (s *Server) listReleases(c echo.Context) error {
	files, err := s.cfg.Releases.List()
	if err != nil {
		return err
	}
	out := client.List[client.Release]{Items: []client.Release{}}
	for _, f := range files {
		out.Items = append(out.Items, client.Release(f))
	}
	return c.JSON(http.StatusOK, out)
}

// downloadRelease serves GET /releases/{sha256} to nodes and operators.
func (s *Server) downloadRelease(c echo.Context) error {
	sum := c.Param("sha256")
	if !releases.ValidSum(sum) {
		return problem(abierrors.BadRequest, "sha256 must be 64 lower-case hex digits")
	}
	f, rel, err := s.cfg.Releases.Open(sum)
	if errors.Is(err, releases.ErrNotFound) {
		return problem(abierrors.ReleaseNotFound, "no release with sha256 "+sum)
	} else if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(rel.Size, 10))
	h.Set("Cache-Control", "immutable, max-age=31536000")
	http.ServeContent(c.Response(), c.Request(), "", time.Time{}, f)
	return nil
}

// upgradeNode serves POST /nodes/{id}/upgrade (docs/upgrades.md section
// 3.1): it checks the target against the node's version and the skew rule,
// offers the release over the node's session (agent_upgrade), and waits
// until the node has a new session: at the target version (upgraded), or at
// the old one (it rolled back: upgrade_failed). Repeating the request for a
// node already at the target answers unchanged without touching the node.
func (s *Server) upgradeNode(c echo.Context) error {
	var req client.UpgradeRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	timeout := DefaultUpgradeTimeout
	if req.TimeoutS < 0 || time.Duration(req.TimeoutS)*time.Second > MaxUpgradeTimeout {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("timeout_s must be 0 to %d", int(MaxUpgradeTimeout/time.Second)))
	} else if req.TimeoutS > 0 {
		timeout = time.Duration(req.TimeoutS) * time.Second
	}
	ctx := c.Request().Context()
	id := c.Param("id")
	n, err := s.cfg.Nodes.Get(ctx, id)
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", id))
	} else if err != nil {
		return err
	}
	program := req.Program
	if program == "" {
		program = agentProgram
	}
	kind, plugin, err := upgradeProgram(n, program)
	if err != nil {
		return err
	}
	isPlugin := kind != programAgent
	if s.cfg.NodeOps == nil && isPlugin {
		return problem(abierrors.Unavailable, "this core reaches no node sessions")
	}
	target := req.Version
	if target == "" {
		if target, err = s.cfg.Releases.Latest(program); errors.Is(err, releases.ErrNotFound) {
			return problem(abierrors.ReleaseNotFound, "this core serves no "+program+" release (see --release-dir)")
		} else if err != nil {
			return err
		}
	}
	if _, err := version.Parse(target); err != nil {
		return problem(abierrors.ValidationFailed, "version: "+deploy.TrimSentinel(err))
	}
	from := n.AgentVersion
	if isPlugin {
		// berthd learns a plugin's version from the node: ask it.
		if from, err = s.pluginVersion(ctx, id, kind, plugin); err != nil {
			return err
		}
	}
	if cmp, err := version.Compare(target, from); err == nil {
		switch {
		case cmp == 0:
			return c.JSON(http.StatusOK, client.UpgradeResult{NodeID: id, Program: program, From: from, To: target, State: "unchanged"})
		case cmp < 0 && !req.Force:
			return problem(abierrors.AgentDowngrade, fmt.Sprintf("node %s runs %s %s; %s is older (pass force to downgrade)", id, program, from, target))
		}
	}
	if err := version.CheckSkew(s.coreVersion(), target); err != nil && !req.Force {
		return problem(abierrors.AgentVersionSkew, program+" "+deploy.TrimSentinel(err))
	}
	files, err := s.cfg.Releases.Find(program, target)
	if errors.Is(err, releases.ErrNotFound) {
		return problem(abierrors.ReleaseNotFound, fmt.Sprintf("this core serves no %s %s release", program, target))
	} else if err != nil {
		return err
	}
	if s.cfg.NodeOps == nil {
		return problem(abierrors.Unavailable, "this core reaches no node sessions")
	}
	params, err := json.Marshal(node.AgentUpgrade{Program: program, Version: target, Releases: files, Force: req.Force})
	if err != nil {
		return err
	}
	start := time.Now()
	oldSession := n.SessionID
	s.log.Info("upgrading node", "node_id", id, "from", from, "to", target, "force", req.Force)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The answer comes before the restart; the session may still end first
	// (it does not end a pending Command), so the wait for the node's new
	// session runs beside it.
	type answer struct {
		res *node.CommandResult
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := s.cfg.NodeOps.Command(cctx, id, node.Command{Kind: node.CommandAgentUpgrade, Params: params})
		answered <- answer{res, err}
	}()
	backc := make(chan *nodes.Node, 1)
	go func() {
		n, _ := s.awaitNodeBack(cctx, id, oldSession)
		backc <- n
	}()
	var back *nodes.Node
	select {
	case a := <-answered:
		switch {
		case errors.Is(a.err, session.ErrNotConnected):
			return problem(abierrors.Unavailable, fmt.Sprintf("node %s has no live session on this core", id))
		case a.err != nil && ctx.Err() != nil:
			return ctx.Err()
		case a.err != nil:
			s.log.Info("no answer to agent_upgrade; waiting for the node", "node_id", id, "err", a.err)
		case a.res.Status != "ok":
			return nodeRefusal(a.res)
		}
		back = <-backc
	case back = <-backc:
	}
	if back == nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return problem(abierrors.UpgradeFailed, fmt.Sprintf("node %s did not come back within %s; check its agent's log", id, timeout))
	}
	now := back.AgentVersion
	if isPlugin {
		if now, err = s.pluginVersion(ctx, id, kind, plugin); err != nil {
			return err
		}
	}
	out := client.UpgradeResult{NodeID: id, Program: program, From: from, To: now, State: "upgraded", DurationMS: time.Since(start).Milliseconds()}
	if cmp, err := version.Compare(now, target); err != nil || cmp != 0 {
		s.log.Warn("node came back at another version: the upgrade rolled back", "node_id", id, "program", program, "want", target, "got", now)
		return problem(abierrors.UpgradeFailed, fmt.Sprintf("node %s came back with %s %s, not %s: the new version did not start and was rolled back", id, program, now, target))
	}
	s.log.Info("node upgraded", "node_id", id, "from", from, "to", target, "duration_ms", out.DurationMS)
	return c.JSON(http.StatusOK, out)
}

// programKind says what an upgraded program is on its node.
type programKind string

// Program kinds (docs/upgrades.md sections 3 and 3.5).
const (
	programAgent   programKind = "agent"
	programDriver  programKind = "runtime driver"
	programNetwork programKind = "network"
)

// upgradeProgram decides whether program may be upgraded on node n
// (docs/upgrades.md section 3.5): berth-agent always; berth-plugin-<name>
// only when <name> is a runtime driver (drivers) or a network plugin
// (network_versions) of the node's last hello. It returns the kind and the
// plugin's name ("" for the agent), or a validation_failed problem.
func upgradeProgram(n *nodes.Node, program string) (programKind, string, error) {
	if program == agentProgram {
		return programAgent, "", nil
	}
	name, ok := strings.CutPrefix(program, "berth-plugin-")
	switch {
	case ok && slices.Contains(n.Drivers, name):
		return programDriver, name, nil
	case ok && slices.Contains(n.Networks, name):
		return programNetwork, name, nil
	}
	return "", "", problem(abierrors.ValidationFailed, fmt.Sprintf("program %q: want berth-agent, the driver plugin or the network plugin of node %s (drivers %v, network plugins %v)", program, n.ID, n.Drivers, n.Networks))
}

// pluginVersion asks the node for its plugins' Describe answers (command
// probe) and returns the version of the plugin name of kind.
func (s *Server) pluginVersion(ctx context.Context, id string, kind programKind, name string) (string, error) {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := s.cfg.NodeOps.Command(pctx, id, node.Command{Kind: node.CommandProbe})
	if err != nil {
		return "", nodeOpError(err)
	}
	if res.Status != "ok" || res.Probe == nil {
		return "", nodeRefusal(res)
	}
	probes := res.Probe.Drivers
	if kind == programNetwork {
		probes = res.Probe.Networks
	}
	for _, d := range probes {
		if d.Name == name {
			return d.Version, nil
		}
	}
	return "", problem(abierrors.Unavailable, fmt.Sprintf("node %s does not report a %s plugin %s", id, kind, name))
}

// awaitNodeBack polls the node's document (by id) every 200 ms until it is
// connected on a session other than oldSession, or ctx ends.
func (s *Server) awaitNodeBack(ctx context.Context, id, oldSession string) (*nodes.Node, error) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		n, err := s.cfg.Nodes.Get(ctx, id)
		if err == nil && n.Status == nodes.StatusConnected && n.SessionID != "" && n.SessionID != oldSession {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (s *Server) coreVersion() string {
	if s.cfg.CoreVersion != "" {
		return s.cfg.CoreVersion
	}
	return version.Version
}
