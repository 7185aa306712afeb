//go:build wasip1

// Command routes is Berth's default route compiler, embedded in berthd: every
// domain of every service goes to the service's workloads that have an address,
// and an upstream is healthy when it runs with its health check passing.
//
// Build it with make generate; docs/wasm-abi.md section 6 describes its input
// and output.
package main

import (
	"net"
	"sort"
	"strconv"
	"strings"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindRoutes, "default-routes", "1.0.0") }

//go:wasmexport routes_compile
func compile(ptr, size uint32) uint64 { return wasm.Routes(ptr, size, routes) }

func routes(in abiwasm.RoutesInput) ([]wasm.Route, error) {
	bySvc := map[string][]wasm.Upstream{}
	for _, w := range in.Workloads {
		addr := w.Address
		if addr == "" && w.NodeAddress != "" && w.Port > 0 {
			addr = net.JoinHostPort(w.NodeAddress, strconv.Itoa(w.Port))
		}
		if addr == "" {
			continue
		}
		bySvc[w.ServiceID] = append(bySvc[w.ServiceID], wasm.Upstream{
			WorkloadID: w.ID, Address: addr, Healthy: w.ObservedStatus == "running" && w.Health == "passing",
		})
	}
	svcs := append([]abiwasm.RouteService(nil), in.Services...)
	sort.Slice(svcs, func(i, j int) bool {
		return svcs[i].Project+"/"+svcs[i].Name < svcs[j].Project+"/"+svcs[j].Name
	})
	seen := map[string]bool{}
	out := []wasm.Route{}
	for _, s := range svcs {
		tls := s.TLSMode
		if tls == "" {
			tls = "none"
		}
		for _, d := range s.Domains {
			host := strings.ToLower(strings.TrimSuffix(d, "."))
			if host == "" || seen[host] {
				continue // a domain claimed twice goes to the service sorting first
			}
			seen[host] = true
			out = append(out, wasm.Route{
				Hostname: host, Project: s.Project, Service: s.Name, TLSMode: tls,
				// acme routes redirect plain HTTP to https (docs/certificates.md section 1).
				HTTPSRedirect: tls == "acme",
				AllowSources:  s.AllowSources, Upstreams: append([]wasm.Upstream{}, bySvc[s.ID]...),
			})
		}
	}
	return out, nil
}

func main() {}
