package policy

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/berthhq/berth/abi/node"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// ServiceObject is s as policies see it (abiwasm.Service): every field the
// API accepts, with defaults spelled out ("portable", "process", "local"), so
// a policy never has to guess what an absent field means (docs/wasm-abi.md
// section 5.2).
func ServiceObject(s *services.Service) abiwasm.Service {
	o := abiwasm.Service{Project: s.Project, Name: s.Name, Revision: s.Revision, Bundle: s.Bundle, BundleDigest: s.BundleDigest,
		Image: s.Image, Command: s.Command, Env: s.Env, Port: s.Port, Domains: s.Domains, Replicas: s.Replicas,
		CapacityUnits: s.CapacityUnits, Labels: s.Labels,
		HealthCheck:   healthCheckObject(s.HealthCheck),
		PlacementMode: services.PlacementPortable, Runtime: "process",
		User: s.User, MemoryMB: s.MemoryMB, CPUMillis: s.CPUMillis}
	if s.Runtime != "" {
		o.Runtime = s.Runtime
	}
	if s.Stateful() {
		o.PlacementMode = services.PlacementStateful
		o.Lease = &abiwasm.Lease{Mode: "local", DurationMS: s.LeaseDurationMS}
		if s.LeaseMode != "" {
			o.Lease.Mode = s.LeaseMode
		}
	}
	if o.Command == nil {
		o.Command = []string{}
	}
	if o.Env == nil {
		o.Env = map[string]string{}
	}
	if o.Domains == nil {
		o.Domains = []string{}
	}
	if o.Labels == nil {
		o.Labels = map[string]string{}
	}
	return o
}

// healthCheckObject is h as policies see it: the timings the node probes with, its defaults
// written out (node.HealthCheck.WithDefaults, docs/node-protocol.md section 6.3), and the path
// as declared ("" when the service declares none).
func healthCheckObject(h services.HealthCheck) abiwasm.HealthCheck {
	run := node.HealthCheck{Path: h.Path, IntervalS: h.IntervalS, TimeoutS: h.TimeoutS, Failures: h.Failures}.WithDefaults()
	return abiwasm.HealthCheck{Path: h.Path, IntervalS: run.IntervalS, TimeoutS: run.TimeoutS, Failures: run.Failures}
}

// NodeObject is n as policies see it (abiwasm.Node).
func NodeObject(n *nodes.Node) abiwasm.Node {
	o := abiwasm.Node{ID: n.ID, Hostname: n.Hostname, Region: n.Region, Labels: n.Labels, Address: n.Address, CPUs: n.CPUs, MemoryMB: n.MemoryMB}
	if o.Labels == nil {
		o.Labels = map[string]string{}
	}
	return o
}

// Raw encodes v as an input object; nil gives JSON null.
func Raw(v any) json.RawMessage {
	if v == nil {
		return json.RawMessage("null")
	}
	b, err := json.Marshal(v)
	if err != nil { // plain structs: cannot fail
		return json.RawMessage("null")
	}
	return b
}

// Usage sums what a project's services other than name use.
func Usage(project string, svcs []services.Service, name string) *abiwasm.Project {
	p := &abiwasm.Project{Name: project}
	for i := range svcs {
		if svcs[i].Name == name {
			continue
		}
		p.Services++
		p.Replicas += svcs[i].Replicas
		p.CapacityUnits += svcs[i].Replicas * svcs[i].CapacityUnits
	}
	return p
}

// Deploy implements the reconciler's deploy hook over an Engine.
type Deploy struct{ Engine *Engine }

// AdmitDeploy asks the deploy bindings about slot of s on n.
func (d Deploy) AdmitDeploy(ctx context.Context, s *services.Service, slot int, n *nodes.Node) (bool, []string, error) {
	in := abiwasm.PolicyInput{
		Hook:      abiwasm.HookDeploy,
		Actor:     abiwasm.Actor{Kind: "system"},
		Project:   &abiwasm.Project{Name: s.Project},
		Object:    Raw(abiwasm.Placement{Service: ServiceObject(s), Slot: slot, Node: NodeObject(n)}),
		OldObject: Raw(nil),
	}
	v, err := d.Engine.Admit(ctx, s.Project, in)
	if err != nil {
		return false, nil, fmt.Errorf("deploy admission: %w", err)
	}
	return v.Allowed, v.UniqueReasons(), nil
}
