package routes

import (
	"context"
	_ "embed"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// defaultModule is examples/routes built for wasip1 by make modules
// (scripts/build-wasm.sh), which rebuilds it whenever its sources change.
//
//go:embed default_routes.wasm
var defaultModule []byte

// DefaultModule returns the default route compiler, a WebAssembly module
// built from examples/routes. The caller must not modify the bytes.
func DefaultModule() []byte { return defaultModule }

// Wasm is a Compiler that runs a route-compiler module (docs/wasm-abi.md
// section 6). The module's table must hash to the SHA-256 it reports.
type Wasm struct {
	Module *hostwasm.Module
}

var _ Compiler = Wasm{}

// Compile converts in to the ABI's input, sorted by id, and asks the module.
// Errors wrap the host/wasm errors; the caller keeps its last good table.
func (w Wasm) Compile(ctx context.Context, in Input) (abiroutes.Table, error) {
	t, err := w.Module.CompileRoutes(ctx, ToABI(in))
	if err != nil {
		return abiroutes.Table{}, fmt.Errorf("compile routes: %w", err)
	}
	return t, nil
}

// Describe names the module: "name version (sha256:...)".
func (w Wasm) Describe() string {
	m := w.Module.Metadata()
	return fmt.Sprintf("%s %s (%s)", m.Name, m.Version, w.Module.Digest())
}

// Describe names the native compiler.
func (Native) Describe() string { return "native" }

// ToABI converts a compiler input to the WebAssembly ABI's, sorted by id.
// The result shares in's domain slices (a nil list becomes an empty one);
// the caller must not change them while it uses the result. Inputs that
// arrive sorted, as the reconciler's do, are not sorted again.
func ToABI(in Input) abiwasm.RoutesInput {
	out := abiwasm.RoutesInput{Services: make([]abiwasm.RouteService, 0, len(in.Services)), Workloads: make([]abiwasm.RouteWorkload, 0, len(in.Workloads))}
	for _, s := range in.Services {
		domains := s.Domains
		if domains == nil {
			domains = []string{}
		}
		out.Services = append(out.Services, abiwasm.RouteService{ID: s.ID, Project: s.Project, Name: s.Name, Domains: domains, TLSMode: s.TLSMode})
	}
	for _, w := range in.Workloads {
		out.Workloads = append(out.Workloads, routeWorkload(w))
	}
	byService := func(a, b abiwasm.RouteService) int { return strings.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(out.Services, byService) {
		slices.SortFunc(out.Services, byService)
	}
	byWorkload := func(a, b abiwasm.RouteWorkload) int { return strings.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(out.Workloads, byWorkload) {
		slices.SortFunc(out.Workloads, byWorkload)
	}
	return out
}

// routeWorkload is w as a compiler sees it: the node address defaults to the
// host of w's address, and the port is its port (0 without one).
func routeWorkload(w Workload) abiwasm.RouteWorkload {
	rw := abiwasm.RouteWorkload{ID: w.ID, ServiceID: w.ServiceID, NodeID: w.NodeID, NodeAddress: w.NodeAddress,
		Address: w.Address, ObservedStatus: w.ObservedStatus, Health: w.Health}
	if host, port, err := net.SplitHostPort(w.Address); err == nil {
		if rw.NodeAddress == "" {
			rw.NodeAddress = host
		}
		rw.Port, _ = strconv.Atoi(port)
	}
	return rw
}

// upstreamAddresses returns the addresses a compiler may route w at: its
// address, and its node's address with its port (docs/wasm-abi.md section
// 6.1); none while w has no address.
func upstreamAddresses(w Workload) []string {
	rw := routeWorkload(w)
	if rw.Address == "" {
		return nil
	}
	out := []string{rw.Address}
	if rw.NodeAddress != "" && rw.Port > 0 {
		if a := net.JoinHostPort(rw.NodeAddress, strconv.Itoa(rw.Port)); a != rw.Address {
			out = append(out, a)
		}
	}
	return out
}

// Status is what GET /api/v1/routes shows (docs/wasm-abi.md section 6.3):
// the table in force with its SHA-256 and the compiler that made it, and,
// when the newest compilation failed, the failure and the compiler that
// failed (the table in force is then the last good one).
type Status struct {
	Table           abiroutes.Table `json:"table"`
	SHA256          string          `json:"sha256"`
	Compiler        string          `json:"compiler"`
	CompiledAt      time.Time       `json:"compiled_at"`
	LastError       string          `json:"last_error,omitempty"`
	LastErrorAt     *time.Time      `json:"last_error_at,omitempty"`
	FailingCompiler string          `json:"failing_compiler,omitempty"`
}
