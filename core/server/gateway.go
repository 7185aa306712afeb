package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/securefile"
)

// Files of the gateway under the data directory (docs/plugins.md section 5.3).
const (
	// gatewayReattachFile is the reattach record of the running gateway.
	gatewayReattachFile = "gateway.reattach.json"
	// gatewayGenerationFile holds the number of berthd starts that drove the
	// gateway, the high half of every route table's fencing token.
	gatewayGenerationFile = "gateway.generation"
	// gatewayStateDir is the gateway's own state directory: its applied
	// route table and its fencing and idempotency records.
	gatewayStateDir = "gateway"
	// gatewayAccessLog and gatewayMetricsSocket live in the state directory:
	// the access log (rotated at 100 MiB, 5 kept) and the unix socket the
	// gateway serves its metrics on (docs/plugins.md section 5.5).
	gatewayAccessLog     = "access.log"
	gatewayMetricsSocket = "metrics.sock"
	// gatewayLog is the gateway's own log, also sent to berthd over stderr
	// while berthd is there to read it.
	gatewayLog = "gateway.log"
)

// gatewaySink adapts the gateway provider to the reconciler: each route
// table is applied as the resource gateway.route_table/default
// (docs/plugins.md section 5). The gateway outlives berthd and keeps its
// fencing state on disk, while the reconciler numbers its tables from 1 in
// every life; so the fencing token is gen<<32 | revision, with gen counted
// up (durably) at every berthd start, and the idempotency key names gen,
// revision and digest.
type gatewaySink struct {
	p   *plugin.Provider
	gen uint64
	// metricsSocket is where the gateway serves its metrics.
	metricsSocket string
}

// startGateway reattaches to the gateway left running by the previous berthd
// or launches a new one (host/plugin Config.ReattachPath), after counting up
// the generation.
func startGateway(ctx context.Context, cfg Config, ps *providers, log *slog.Logger) (gatewaySink, error) {
	entry, err := plugin.ResolveProvider(cfg.PluginDir, "gateway")
	if err != nil {
		return gatewaySink{}, fmt.Errorf("gateway plugin: %w", err)
	}
	if err := takeOverGatewayAddrs(ctx, cfg, log); err != nil {
		return gatewaySink{}, err
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	gen, err := nextGatewayGeneration(filepath.Join(pdir, gatewayGenerationFile))
	if err != nil {
		return gatewaySink{}, err
	}
	state := filepath.Join(pdir, gatewayStateDir)
	socket := filepath.Join(state, gatewayMetricsSocket)
	args := []string{"--listen", cfg.GatewayListen, "--state-dir", state,
		"--access-log", filepath.Join(state, gatewayAccessLog), "--metrics-socket", socket,
		"--log-file", filepath.Join(state, gatewayLog)}
	if cfg.GatewayTLSListen != "" && cfg.GatewayTLSListen != "off" {
		// Appended only when set, so that a gateway launched without it
		// is still reattached to (the recorded arguments match).
		args = append(args, "--tls-listen", cfg.GatewayTLSListen)
	}
	h, err := ps.launch(ctx, "gateway", entry.Apply(plugin.Config{
		Args:         args,
		PidDir:       pdir,
		ReattachPath: filepath.Join(pdir, gatewayReattachFile),
		Logger:       log,
	}))
	if err != nil {
		return gatewaySink{}, fmt.Errorf("start gateway plugin: %w", err)
	}
	st := h.Status()
	log.Info("gateway plugin running", "listen", cfg.GatewayListen, "tls_listen", cfg.GatewayTLSListen, "pid", st.PID, "launches", st.Launches, "generation", gen)
	return gatewaySink{p: h, gen: gen, metricsSocket: socket}, nil
}

// nextGatewayGeneration reads the generation at path, adds one and stores it
// (0600, atomically) before returning it. A missing file counts as 0.
func nextGatewayGeneration(path string) (uint64, error) {
	var gen uint64
	raw, err := securefile.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return 0, fmt.Errorf("gateway generation: %w", err)
	default:
		gen, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("gateway generation %s: %w", path, err)
		}
	}
	gen++
	if err := securefile.WriteFile(path, []byte(strconv.FormatUint(gen, 10)+"\n")); err != nil {
		return 0, fmt.Errorf("gateway generation: %w", err)
	}
	return gen, nil
}

// SetRoutes plans and applies t.
func (s gatewaySink) SetRoutes(ctx context.Context, t abiroutes.Table) error {
	raw, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode route table: %w", err)
	}
	if t.Revision < 0 || t.Revision >= 1<<32 {
		return fmt.Errorf("route table revision %d is outside the fencing token's range", t.Revision)
	}
	desired := abiprovider.Resource{Type: abiroutes.ResourceType, ID: abiroutes.ResourceID, Attributes: raw}
	m := pluginapi.Mutation{
		IdempotencyKey: "routes/" + strconv.FormatUint(s.gen, 10) + "/" + strconv.FormatInt(t.Revision, 10) + "/" + t.Digest(),
		FencingToken:   s.gen<<32 | uint64(t.Revision),
	}
	if _, err := s.p.PlanAndApply(ctx, desired, m); err != nil {
		return fmt.Errorf("apply route table revision %d: %w", t.Revision, err)
	}
	return nil
}
