package placement

import (
	"maps"
	"slices"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// ServiceKey names a service in [Usage] and in anti-affinity: "<project>/<name>" (anti-affinity
// names services of the same project).
func ServiceKey(project, name string) string { return project + "/" + name }

// ReplicaResources returns what one replica of svc reserves ([services.Service.ReplicaResources]).
func ReplicaResources(svc *services.Service) Resources {
	r := svc.ReplicaResources()
	return Resources{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Extended: r.Extended}
}

// ServiceRequest returns the request for replicas of svc: its resources, requirements, spread
// and preferences; the caller fills Existing and Place.
func ServiceRequest(svc *services.Service) Request {
	sc := svc.Scheduling
	req := Request{
		Service:   ServiceKey(svc.Project, svc.Name),
		Resources: ReplicaResources(svc),
		Constraints: Constraints{
			NodeSelector: sc.NodeSelector,
			Region:       sc.Region,
			MaxPerNode:   sc.MaxPerNode,
		},
		SpreadBy:    Spread(sc.SpreadBy),
		Preferences: sc.Preferences,
	}
	for _, a := range sc.AntiAffinity {
		req.AntiAffinity = append(req.AntiAffinity, ServiceKey(svc.Project, a))
	}
	return req
}

// Usage is what stands on each node: the resources its workloads reserve and how many replicas
// of each service ([ServiceKey]) it holds. The zero value is empty and ready; a nil *Usage reads
// as empty.
type Usage struct {
	used     map[string]Resources
	services map[string]map[string]int
}

// Add records one replica of service (a [ServiceKey]) reserving r on node.
func (u *Usage) Add(node, service string, r Resources) {
	if u.used == nil {
		u.used, u.services = map[string]Resources{}, map[string]map[string]int{}
	}
	u.used[node] = u.used[node].Add(r)
	if u.services[node] == nil {
		u.services[node] = map[string]int{}
	}
	u.services[node][service]++
}

// Used returns what the workloads on node reserve.
func (u *Usage) Used(node string) Resources {
	if u == nil {
		return Resources{}
	}
	return u.used[node]
}

// Services returns the replicas per service on node; the map is u's own: read it, do not change
// it.
func (u *Usage) Services(node string) map[string]int {
	if u == nil {
		return nil
	}
	return u.services[node]
}

// UsageOf sums what the workloads wls reserve on their nodes: each workload not desired removed
// counts one replica of its service in svcs (a workload of a service svcs lacks counts one
// default replica).
func UsageOf(svcs []services.Service, wls []services.Workload) *Usage {
	byID := make(map[string]*services.Service, len(svcs))
	for i := range svcs {
		byID[svcs[i].ID] = &svcs[i]
	}
	u := &Usage{}
	for i := range wls {
		w := &wls[i]
		if w.DesiredStatus == services.DesiredRemoved || w.NodeID == "" {
			continue
		}
		s := byID[w.ServiceID]
		if s == nil {
			s = &services.Service{Project: w.Project, Name: w.Service}
		}
		u.Add(w.NodeID, ServiceKey(w.Project, w.Service), ReplicaResources(s))
	}
	return u
}

// NodeOf returns n as the decider sees it, with what u says stands on it; unavailable, when not
// empty, says why n takes nothing new (offline, lacks the runtime driver, ...).
func NodeOf(n *nodes.Node, unavailable string, u *Usage) Node {
	c := n.Capacity()
	return Node{ID: n.ID, Region: n.Region, Labels: n.Labels, Capacity: Resources{CPUMilli: c.CPUMilli, MemoryMiB: c.MemoryMiB, Extended: c.Extended},
		Used: u.Used(n.ID), Cordoned: n.Cordoned, Unavailable: unavailable, Services: u.Services(n.ID)}
}

// Satisfied returns why a replica of req standing on n no longer may ([ReasonRegion],
// [ReasonSelector] or [ReasonEndpoint], with its text), "" when n still meets the request's
// region, selector and endpoint. A standing replica is not moved for capacity, cordon,
// anti-affinity or max_per_node: those decide new placements only.
func Satisfied(req Request, n Node) (Code, string) {
	if req.Region != "" && n.Region != req.Region {
		return ReasonRegion, "region is " + quote(n.Region) + ", wants " + quote(req.Region)
	}
	for k, v := range req.NodeSelector {
		if got, ok := n.Labels[k]; !ok || got != v {
			// The first failing key in key order names the reason, so the text is stable.
			for _, k := range slices.Sorted(maps.Keys(req.NodeSelector)) {
				if got, ok := n.Labels[k]; !ok || got != req.NodeSelector[k] {
					return ReasonSelector, "label " + k + " is not " + req.NodeSelector[k]
				}
			}
		}
	}
	if req.Endpoint && !n.Endpoint {
		return ReasonEndpoint, "no endpoint registered"
	}
	return "", ""
}

func quote(s string) string { return `"` + s + `"` }

// Candidates returns the nodes ns as the decider sees them for a service of runtime ("" or
// "process" for the default driver), with what u says stands on each. Removed nodes are left
// out; a retiring node, a node that is not connected and a node that did not announce runtime's
// driver are unavailable, saying so (nodes that announced no driver take the default one).
func Candidates(ns []nodes.Node, u *Usage, runtime string) []Node {
	out := make([]Node, 0, len(ns))
	for i := range ns {
		n := &ns[i]
		if n.Status == nodes.StatusRemoved {
			continue
		}
		why := ""
		switch {
		case !n.Member():
			why = "retiring"
		case n.Draining():
			why = "draining"
		case n.Status != nodes.StatusConnected:
			why = "not connected (" + n.Status + ")"
		case runtime != "" && runtime != "process" && !slices.Contains(n.Drivers, runtime):
			why = "lacks the " + runtime + " driver"
		}
		out = append(out, NodeOf(n, why, u))
	}
	return out
}
