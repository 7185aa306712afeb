//go:build wasip1

// Command routes-internal is an example route compiler for operators to bind
// in place of the default (berth module bind DIGEST --hook routes.compile):
// it routes as the default does, and serves every domain under .internal
// only to clients on private networks (RFC 1918 and unique local IPv6
// addresses), through the route's allow_sources. docs/wasm-abi.md section 6
// describes its input and output.
//
// Build it with scripts/build-wasm.sh examples/routes-internal OUT.wasm.
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
func metadata() uint64 { return wasm.Metadata(abiwasm.KindRoutes, "internal-routes", "1.0.0") }

//go:wasmexport routes_compile
func compile(ptr, size uint32) uint64 { return wasm.Routes(ptr, size, routes) }

func routes(in abiwasm.RoutesInput) ([]wasm.Route, error) {
	// The networks that may reach .internal domains.
	private := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"}
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
		for _, d := range s.Domains {
			host := strings.ToLower(strings.TrimSuffix(d, "."))
			if host == "" || seen[host] {
				continue // a domain claimed twice goes to the service sorting first
			}
			seen[host] = true
			tls := s.TLSMode
			if tls == "" {
				tls = "none"
			}
			r := wasm.Route{Hostname: host, Project: s.Project, Service: s.Name, TLSMode: tls,
				HTTPSRedirect: tls == "acme", // as the default compiler: acme routes redirect plain HTTP
				AllowSources:  s.AllowSources, Upstreams: append([]wasm.Upstream{}, bySvc[s.ID]...)}
			if strings.HasSuffix(host, ".internal") {
				r.AllowSources = private
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func main() {}
