package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
)

// registerClusters adds the cluster routes (docs/api.md section "Clusters and relays").
func (s *Server) registerClusters(v1 *echo.Group) {
	if s.cfg.Clusters == nil {
		return
	}
	v1.GET("/clusters", s.listClusters, s.auth(identity.ScopeNodesRead))
	v1.POST("/clusters", s.createCluster, s.auth(identity.ScopeAdmin))
	v1.GET("/clusters/:cluster", s.clusterStatus, s.auth(identity.ScopeNodesRead))
	v1.POST("/clusters/:cluster/relay-credential", s.ensureRelayCredential, s.auth(identity.ScopeAdmin))
	v1.POST("/clusters/:cluster/relay-credential/rotate", s.rotateRelayCredential, s.auth(identity.ScopeAdmin, reauth))
}

// clusterProblem maps the errors of core/clusters to their codes.
func clusterProblem(err error) error {
	switch {
	case errors.Is(err, clusters.ErrNotFound):
		return problem(abierrors.ClusterNotFound, err.Error())
	case errors.Is(err, clusters.ErrExists):
		return problem(abierrors.AlreadyExists, err.Error())
	case errors.Is(err, clusters.ErrInvalid):
		return problem(abierrors.ValidationFailed, err.Error())
	case errors.Is(err, clusters.ErrNoRelay):
		return problem(abierrors.ClusterNoRelay, err.Error()+"; create it with requires_relay to give it one")
	}
	return err
}

// relayView is the election state of one cluster as the API answers it.
type relayView struct {
	// State is "connected", or the code relay_not_connected or relay_ambiguous; "" for a
	// cluster without a relay.
	State  string                  `json:"state,omitempty"`
	Detail string                  `json:"detail,omitempty"`
	Relay  *clusters.Registration  `json:"relay,omitempty"`
	Live   []clusters.Registration `json:"live,omitempty"`
}

func electionView(c *clusters.Cluster, now time.Time) relayView {
	if !c.RequiresRelay {
		return relayView{}
	}
	var live []clusters.Registration
	for _, r := range c.Relays {
		if r.Live(c, now) {
			live = append(live, r)
		}
	}
	reg, err := clusters.Elect(c, now)
	switch {
	case err == nil:
		return relayView{State: "connected", Relay: &reg, Live: live}
	case errors.Is(err, clusters.ErrAmbiguous):
		return relayView{State: string(abierrors.RelayAmbiguous), Detail: err.Error(), Live: live}
	default:
		return relayView{State: string(abierrors.RelayNotConnected), Detail: err.Error()}
	}
}

type clusterView struct {
	*clusters.Cluster
	Election relayView `json:"election"`
}

func (s *Server) listClusters(c echo.Context) error {
	all, err := s.cfg.Clusters.List(c.Request().Context())
	if err != nil {
		return err
	}
	now := time.Now()
	out := make([]clusterView, len(all))
	for i := range all {
		out[i] = clusterView{Cluster: &all[i], Election: electionView(&all[i], now)}
	}
	return c.JSON(http.StatusOK, map[string]any{"clusters": out})
}

func (s *Server) createCluster(c echo.Context) error {
	var req struct {
		Name          string `json:"name"`
		RequiresRelay bool   `json:"requires_relay"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	cl, err := s.cfg.Clusters.Create(c.Request().Context(), req.Name, req.RequiresRelay)
	if err != nil {
		return clusterProblem(err)
	}
	s.log.Info("cluster created", "cluster", cl.Name, "requires_relay", cl.RequiresRelay)
	return c.JSON(http.StatusCreated, cl)
}

// clusterNode is one node of a cluster in its status.
type clusterNode struct {
	ID           string `json:"id"`
	Hostname     string `json:"hostname"`
	Status       string `json:"status"`
	AgentVersion string `json:"agent_version,omitempty"`
}

func (s *Server) clusterStatus(c echo.Context) error {
	ctx := c.Request().Context()
	cl, err := s.cfg.Clusters.Get(ctx, c.Param("cluster"))
	if err != nil {
		return clusterProblem(err)
	}
	all, err := s.cfg.Nodes.List(ctx)
	if err != nil {
		return err
	}
	members := []clusterNode{}
	for _, n := range all {
		if n.ClusterName() == cl.Name && n.Status != nodes.StatusRemoved {
			members = append(members, clusterNode{ID: n.ID, Hostname: n.Hostname, Status: n.Status, AgentVersion: n.AgentVersion})
		}
	}
	return c.JSON(http.StatusOK, map[string]any{"cluster": cl, "election": electionView(cl, time.Now()), "nodes": members})
}

func (s *Server) ensureRelayCredential(c echo.Context) error {
	name := c.Param("cluster")
	bearer, gen, err := s.cfg.Clusters.EnsureCredential(c.Request().Context(), name)
	if err != nil {
		return clusterProblem(err)
	}
	if bearer == "" {
		return c.JSON(http.StatusOK, map[string]any{"cluster": name, "generation": gen,
			"detail": "the cluster holds a relay credential already and it is never shown again; rotate it for a new one"})
	}
	s.log.Info("relay credential issued", "cluster", name, "generation", gen)
	return c.JSON(http.StatusCreated, map[string]any{"cluster": name, "generation": gen, "credential": bearer})
}

func (s *Server) rotateRelayCredential(c echo.Context) error {
	name := c.Param("cluster")
	bearer, gen, err := s.cfg.Clusters.RotateCredential(c.Request().Context(), name)
	if err != nil {
		return clusterProblem(err)
	}
	s.log.Info("relay credential rotated", "cluster", name, "generation", gen)
	if s.cfg.RelaysRotated != nil {
		s.cfg.RelaysRotated(name)
	}
	return c.JSON(http.StatusCreated, map[string]any{"cluster": name, "generation": gen, "credential": bearer})
}

// joinTokenCluster checks the cluster a join token names: "" is the default cluster.
func (s *Server) joinTokenCluster(ctx context.Context, name string) (string, error) {
	if name == "" || s.cfg.Clusters == nil {
		return name, nil
	}
	if _, err := s.cfg.Clusters.Get(ctx, name); err != nil {
		return "", clusterProblem(err)
	}
	if name == clusters.Default {
		return "", nil
	}
	return name, nil
}

// carrierAdmits refuses a node that came through the relay of another cluster (docs/relay.md
// section 10): nil for a direct connection or a node of the relay's own cluster.
func carrierAdmits(ctx context.Context, n *nodes.Node) error {
	carrier, ok := clusters.CarrierFrom(ctx)
	if !ok || carrier.Cluster == n.ClusterName() {
		return nil
	}
	return problem(abierrors.RelayClusterMismatch, "this node belongs to cluster "+n.ClusterName()+", not to "+carrier.Cluster+" whose relay carried it")
}
