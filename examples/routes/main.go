//go:build wasip1

// Command routes is Berth's default route compiler, embedded in berthd: every
// domain of every service goes to the service's workloads that have an address,
// and an upstream is healthy when it runs with its health check passing.
//
// It sets no match conditions: each domain has one route, which takes every
// path and header, since the services of its input say nothing of paths or
// headers. A compiler of its own may give a hostname several routes by path
// prefix and request headers through wasm.Route's PathPrefix, StripPrefix
// and Headers (docs/routes.md section 3).
//
// Build it with make generate; docs/wasm-abi.md section 6 describes its input
// and output.
package main

import (
	"net"
	"slices"
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
	// Each service's upstreams are one stretch of a single slice: count
	// them per service, then fill, so a compilation allocates a few slices
	// rather than one per workload and route.
	index := make(map[string]int, len(in.Services))
	first := make([]int, len(in.Services)) // the first service of each one's id
	for i, s := range in.Services {
		if j, dup := index[s.ID]; dup {
			first[i] = j
		} else {
			index[s.ID], first[i] = i, i
		}
	}
	count := make([]int, len(in.Services)+1)
	addrs := make([]string, len(in.Workloads))
	owner := make([]int, len(in.Workloads)) // index of the workload's service, -1 for none
	for k, w := range in.Workloads {
		addr := w.Address
		if addr == "" && w.NodeAddress != "" && w.Port > 0 {
			addr = net.JoinHostPort(w.NodeAddress, strconv.Itoa(w.Port))
		}
		addrs[k], owner[k] = addr, -1
		if i, ok := index[w.ServiceID]; ok && addr != "" {
			owner[k] = i
			count[i+1]++
		}
	}
	for i := 1; i < len(count); i++ {
		count[i] += count[i-1] // count[i] is where service i's upstreams start
	}
	flat := make([]wasm.Upstream, count[len(count)-1])
	next := append([]int(nil), count...)
	for k, w := range in.Workloads {
		if i := owner[k]; i >= 0 {
			flat[next[i]] = wasm.Upstream{WorkloadID: w.ID, Address: addrs[k], Healthy: w.ObservedStatus == "running" && w.Health == "passing"}
			next[i]++
		}
	}
	// Services in project/name order; the key is built once per service.
	type keyed struct {
		key string
		i   int
	}
	order := make([]keyed, len(in.Services))
	domains := 0
	for i, s := range in.Services {
		order[i] = keyed{s.Project + "/" + s.Name, i}
		domains += len(s.Domains)
	}
	slices.SortFunc(order, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	seen := make(map[string]bool, domains)
	out := make([]wasm.Route, 0, domains)
	for _, o := range order {
		s := &in.Services[o.i]
		tls := s.TLSMode
		if tls == "" {
			tls = "none"
		}
		// Every service of one id gets that id's upstreams, as they are
		// indexed by the id's first service.
		f := first[o.i]
		ups := flat[count[f]:next[f]:next[f]]
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
				// Routes of one service share its upstreams (read only).
				AllowSources: s.AllowSources, Upstreams: ups,
			})
		}
	}
	return out, nil
}

func main() {}
