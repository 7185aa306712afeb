// Package routes computes the gateway route table from services and their
// workloads, behind the Compiler interface that operators may replace.
package routes

import (
	"context"
	"fmt"
	"sort"
	"strings"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

// Input is everything a route compiler sees.
type Input struct {
	Services  []Service
	Workloads []Workload
}

// Service is a service with the domains it is routed at.
type Service struct {
	ID      string
	Project string
	Name    string
	Domains []string
	// TLSMode is the service's tls mode (none, acme, manual, passthrough;
	// empty means none), carried onto its routes.
	TLSMode string
}

// Workload is a workload as last observed. Address is "host:port", empty until
// the node reports one.
type Workload struct {
	ID        string
	ServiceID string
	// NodeID and NodeAddress name the node the workload was placed on;
	// NodeAddress may be empty, Address carries the port.
	NodeID         string
	NodeAddress    string
	Address        string
	ObservedStatus string // node observed status, e.g. "running"
	Health         string // "passing", "failing" or "unknown"
}

// Compiler turns services and workloads into the complete route table.
// Compile must be deterministic (same input, same table) and must not keep
// references to in. An error leaves the caller on its last good table.
type Compiler interface {
	Compile(ctx context.Context, in Input) (abiroutes.Table, error)
}

// Native is the built-in Compiler. A domain given for two services is routed
// to the one whose project/name sorts first; berthd never gives it one, as
// route claims decide contested hostnames first ([ResolveClaims]).
type Native struct{}

var _ Compiler = Native{}

// Compile routes every domain of every service to the service's workloads that
// have an address; an upstream is healthy when it is running with health passing.
func (Native) Compile(ctx context.Context, in Input) (abiroutes.Table, error) {
	if err := ctx.Err(); err != nil {
		return abiroutes.Table{}, fmt.Errorf("compile routes: %w", err)
	}
	byService := map[string][]abiroutes.Upstream{}
	for _, w := range in.Workloads {
		if w.Address == "" {
			continue
		}
		byService[w.ServiceID] = append(byService[w.ServiceID], abiroutes.Upstream{
			WorkloadID: w.ID,
			Address:    w.Address,
			Healthy:    w.ObservedStatus == "running" && w.Health == "passing",
		})
	}
	seen := map[string]bool{}
	var t abiroutes.Table
	for _, s := range sortedServices(in.Services) {
		for _, d := range s.Domains {
			host := strings.ToLower(strings.TrimSuffix(d, "."))
			if host == "" || seen[host] {
				continue
			}
			seen[host] = true
			t.Routes = append(t.Routes, abiroutes.Route{
				Hostname:  host,
				Project:   s.Project,
				Service:   s.Name,
				Upstreams: append([]abiroutes.Upstream(nil), byService[s.ID]...),
				TLSMode:   s.TLSMode,
				// acme routes redirect plain HTTP to https (docs/certificates.md section 1).
				HTTPSRedirect: s.TLSMode == abiroutes.TLSACME,
			})
		}
	}
	t.Normalize()
	return t, nil
}

func sortedServices(in []Service) []Service {
	out := append([]Service(nil), in...)
	sort.Slice(out, func(i, j int) bool {
		return out[i].Project+"/"+out[i].Name < out[j].Project+"/"+out[j].Name
	})
	return out
}
