package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// extensions are the WebAssembly parts of berthd: the route compiler (the
// module bound to routes.compile, else the embedded default) and the policy
// engine, each on a runtime of its own (one compilation cache under
// DATA/wasm-cache).
type extensions struct {
	rt       *hostwasm.Runtime // route compiler
	prt      *hostwasm.Runtime // policies (default deadline: 1 s per call)
	policy   *policy.Engine
	compiler routes.Compiler
}

// startExtensions loads the embedded default route compiler and wires the
// policy engine over the store, the blob store and the change log.
func startExtensions(ctx context.Context, dataDir string, st *store.Store, blobs *bundles.Store, clog *changelog.Log, metrics prometheus.Registerer, log *slog.Logger) (*extensions, error) {
	// Route compilation reads every service and workload; it gets a longer
	// deadline than an admission decision.
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: filepath.Join(dataDir, "wasm-cache"), Logger: log, Timeout: RouteCompileTimeout, Fuel: RouteCompileFuel})
	if err != nil {
		return nil, fmt.Errorf("start WebAssembly runtime: %w", err)
	}
	start := time.Now()
	m, err := rt.Load(ctx, routes.DefaultModule())
	if err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("load the default route compiler: %w", err)
	}
	log.Info("route compiler loaded", "module", m.Metadata().Name, "digest", m.Digest(), "load_ms", time.Since(start).Milliseconds())
	prt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: filepath.Join(dataDir, "wasm-cache"), Logger: log})
	if err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("start WebAssembly runtime: %w", err)
	}
	eng := policy.New(policy.Config{Store: st, Blobs: blobs, Runtime: prt, Changelog: clog, Logger: log, Metrics: metrics})
	if err := eng.EnsureIndexes(ctx); err != nil {
		_ = rt.Close(ctx)
		_ = prt.Close(ctx)
		return nil, err
	}
	compiler := routes.NewBindable(routes.BindableConfig{Default: routes.Wasm{Module: m}, Source: routeBindings{eng}, Runtime: rt, Logger: log})
	return &extensions{rt: rt, prt: prt, policy: eng, compiler: compiler}, nil
}

// routeBindings is the policy engine as the route compiler's routes.Source.
type routeBindings struct{ e *policy.Engine }

// BoundRouteCompiler returns the routes.compile binding in force, or nil.
func (s routeBindings) BoundRouteCompiler(ctx context.Context) (*routes.Binding, error) {
	b, err := s.e.RouteCompiler(ctx)
	if err != nil || b == nil {
		return nil, err
	}
	return &routes.Binding{ID: b.ID, ModuleDigest: b.ModuleDigest, Module: b.Module}, nil
}

// ModuleBytes reads a module from the blob store.
func (s routeBindings) ModuleBytes(digest string) ([]byte, error) { return s.e.ModuleBytes(digest) }

func (e *extensions) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.rt.Close(ctx)
	_ = e.prt.Close(ctx)
}

// RouteCompileTimeout bounds one run of the route compiler.
const RouteCompileTimeout = 30 * time.Second

// RouteCompileFuel bounds the work of one run of the route compiler, in the
// units of hostwasm.Config.Fuel: 64 times a policy's, for tables of
// thousands of services.
const RouteCompileFuel = 64 * hostwasm.DefaultFuel
