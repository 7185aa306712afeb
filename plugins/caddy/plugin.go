package caddy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/gateway"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// Config is the adapter's wiring (flags of cmd/berth-plugin-caddy).
type Config struct {
	// Admin is the address of Caddy's admin API, "host:port" on loopback
	// (Caddy's own default is "localhost:2019"). Required. Every config the
	// adapter loads keeps Caddy's admin API on it.
	Admin string
	// Listen is the address Caddy serves the routes on, "host:port".
	// Required.
	Listen string
	// StateDir keeps the applied table and the fencing and idempotency
	// records across restarts of the adapter; "" keeps them in memory.
	StateDir string
	// Timeout bounds one call of the admin API; zero means 30 s.
	Timeout time.Duration
	// Logger receives what the adapter does on its own (the push of the
	// stored table at start); nil discards it.
	Logger *slog.Logger
}

// Plugin is the Caddy adapter as a gateway provider (docs/plugins.md section
// 5.7): it manages the route table resource (routes.ResourceType /
// routes.ResourceID) like the built-in gateway, fenced and idempotent through
// sdk/guard, and puts each applied table in force by loading the whole Caddy
// config rendered by [Render] through POST /load, which Caddy applies
// atomically (the old config keeps serving if the new one fails). Read asks
// Caddy for its config: the applied table while Caddy runs exactly its
// rendering, not_found when Caddy serves no table of Berth's, and otherwise
// the table read back from Caddy's routes, so the host sees the drift and
// applies again. Safe for concurrent use.
type Plugin struct {
	cfg    Config
	log    *slog.Logger
	guards *guard.Guards
	http   *http.Client

	mu    sync.Mutex
	state *provider.Resource // the applied table; nil before the first Apply and after Delete
	table routes.Table
}

var _ provider.Provider = (*Plugin)(nil)

// tableFile is the applied route table in the state directory.
const tableFile = "routes.json"

// idempotencyKeep is how long the records of applied mutations are kept.
const idempotencyKeep = 24 * time.Hour

// Open returns the adapter over cfg. With a state directory holding an
// applied table it pushes that table to Caddy at once when Caddy does not
// already run it (Caddy restarted without its saved config, say), so Caddy
// serves the last table before any host speaks to the adapter. Without one,
// a Caddy that serves no table of Berth's on Listen is given the empty table,
// so every host answers 404 there, while one that does keeps serving it
// until the host's first Apply. A Caddy that cannot be reached then is
// logged, not fatal (the host's first Apply loads the table). Errors: a missing Admin or Listen, a state directory that cannot
// be made, a stored table that does not decode or validate.
func Open(ctx context.Context, cfg Config) (*Plugin, error) {
	if cfg.Admin == "" || cfg.Listen == "" {
		return nil, errors.New("caddy adapter: the admin API address and the listen address are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StateDir != "" {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("caddy adapter state directory: %w", err)
		}
	}
	g, err := guard.Open(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("caddy adapter state directory: %w", err)
	}
	if cfg.StateDir != "" {
		if _, err := g.Idempotency.Prune(time.Now().Add(-idempotencyKeep)); err != nil {
			return nil, fmt.Errorf("caddy adapter state directory: %w", err)
		}
	}
	p := &Plugin{cfg: cfg, log: cfg.Logger, guards: g, http: &http.Client{Timeout: cfg.Timeout}}
	var raw []byte
	if cfg.StateDir != "" {
		raw, err = securefile.ReadFile(filepath.Join(cfg.StateDir, tableFile))
	} else {
		err = os.ErrNotExist
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		p.serveListen(ctx)
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("read the stored route table: %w", err)
	}
	state, t, err := gateway.Canonical(provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}, "the caddy adapter")
	if err != nil {
		return nil, fmt.Errorf("stored route table %s: %w", filepath.Join(cfg.StateDir, tableFile), err)
	}
	p.state, p.table = &state, t
	if same, err := p.caddyRuns(ctx, t); err != nil || !same {
		if err := p.load(ctx, t); err != nil {
			p.log.Warn("caddy does not run the stored route table and could not be given it; the next apply will", "revision", t.Revision, "err", err)
		} else {
			p.log.Info("stored route table loaded into caddy", "revision", t.Revision, "routes", len(t.Routes))
		}
	}
	return p, nil
}

// serveListen makes a Caddy that serves no route table of Berth's on the
// listen address answer there (every host 404) by loading the empty table.
// A Caddy that serves Berth's server on that address is left as it is: it
// keeps serving its last table until the host's first Apply. Failures are
// logged; the host's first Apply loads a table anyway.
func (p *Plugin) serveListen(ctx context.Context) {
	live, err := p.caddyConfig(ctx)
	if err != nil {
		p.log.Warn("caddy's admin API cannot be reached; the first apply will load the route table", "admin", p.cfg.Admin, "err", err)
		return
	}
	if ls, ok := dig(live, "apps", "http", "servers", ServerName, "listen").([]any); ok && len(ls) == 1 && ls[0] == p.cfg.Listen {
		return
	}
	if err := p.load(ctx, routes.Table{}); err != nil {
		p.log.Warn("caddy could not be given the empty route table", "err", err)
	}
}

// Describe implements provider.Provider: name "caddy", the route table.
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:        "caddy",
		Version:     version.Version,
		APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			DurableState:  p.cfg.StateDir != "",
			ResourceTypes: []provider.ResourceType{gateway.ResourceType()},
		},
	}, nil
}

// ValidateConfig implements provider.Provider: the adapter takes its
// addresses as flags, so its configuration must be an empty JSON object.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	return gateway.ValidateNoConfig(req, "the adapter takes --admin and --listen as flags"), nil
}

// Plan implements provider.Provider: the planned state is the desired table
// in canonical form; Changes compares it with Current.
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	planned, _, err := gateway.Canonical(req.Desired, "the caddy adapter")
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Apply implements provider.Provider: the planned table is stored (with a
// state directory) and loaded into Caddy; the answer comes once Caddy runs
// it. A Caddy that refuses or cannot be reached fails the Apply with
// code unavailable (Caddy keeps the config it ran). Fenced and idempotent
// through sdk/guard.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return guard.Mutate(ctx, p.guards, routes.ResourceType+"/"+routes.ResourceID, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		state, t, err := gateway.Canonical(req.Planned, "the caddy adapter")
		if err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cfg.StateDir != "" {
			if err := securefile.WriteFile(filepath.Join(p.cfg.StateDir, tableFile), state.Attributes); err != nil {
				return nil, fmt.Errorf("apply: store the route table: %w", err)
			}
			if _, err := p.guards.Idempotency.Prune(time.Now().Add(-idempotencyKeep)); err != nil {
				return nil, fmt.Errorf("apply: %w", err)
			}
		}
		if err := p.load(ctx, t); err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
		p.state, p.table = &state, t
		return &provider.ApplyResponse{State: state}, nil
	})
}

// Read implements provider.Provider: what Caddy runs (see [Plugin]).
func (p *Plugin) Read(ctx context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	if req.Type != routes.ResourceType || req.ID != routes.ResourceID {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	live, err := p.caddyConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	same, err := sameConfig(live, p.table, p.cfg) // the empty table after a Delete
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	switch {
	case same && p.state != nil:
		return &provider.ReadResponse{State: *p.state}, nil
	case same:
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	back, ok := readBack(live)
	if !ok {
		return nil, fmt.Errorf("read %s/%s: caddy serves no route table of Berth's: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	raw, _ := json.Marshal(back) // plain structs: cannot fail
	return &provider.ReadResponse{State: provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}}, nil
}

// Delete implements provider.Provider: Caddy gets the config of the empty
// table, so every host answers 404 no_route; the stored table is removed.
func (p *Plugin) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Type+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if req.Type != routes.ResourceType || req.ID != routes.ResourceID {
			return &provider.DeleteResponse{}, nil // not ours: nothing to remove
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if err := p.load(ctx, routes.Table{}); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
		if p.cfg.StateDir != "" {
			if err := os.Remove(filepath.Join(p.cfg.StateDir, tableFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("delete the stored route table: %w", err)
			}
		}
		p.state, p.table = nil, routes.Table{}
		return &provider.DeleteResponse{}, nil
	})
}

// load renders t and loads it into Caddy (POST /load).
func (p *Plugin) load(ctx context.Context, t routes.Table) error {
	body, err := Render(t, p.cfg.Listen, p.cfg.Admin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.cfg.Admin+"/load", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("load the route table into caddy: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Do(req)
	if err != nil {
		return abierrors.Wrap(abierrors.Unavailable, "caddy's admin API at "+p.cfg.Admin+" cannot be reached", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return abierrors.New(abierrors.Unavailable, fmt.Sprintf("caddy refused the route table (revision %d): %d %s", t.Revision, resp.StatusCode, strings.TrimSpace(string(msg))))
	}
	return nil
}

// caddyConfig returns Caddy's whole config as decoded JSON (nil when Caddy
// runs none).
func (p *Plugin) caddyConfig(ctx context.Context) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.cfg.Admin+"/config/", nil)
	if err != nil {
		return nil, fmt.Errorf("read caddy's config: %w", err)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, abierrors.Wrap(abierrors.Unavailable, "caddy's admin API at "+p.cfg.Admin+" cannot be reached", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, abierrors.Wrap(abierrors.Unavailable, "read caddy's config", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, abierrors.New(abierrors.Unavailable, fmt.Sprintf("caddy's admin API answered GET /config/ with %d %s", resp.StatusCode, strings.TrimSpace(string(raw))))
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, abierrors.Wrap(abierrors.Unavailable, "caddy's config does not decode", err)
	}
	return out, nil
}

// caddyRuns reports whether Caddy runs exactly the rendering of t.
func (p *Plugin) caddyRuns(ctx context.Context, t routes.Table) (bool, error) {
	live, err := p.caddyConfig(ctx)
	if err != nil {
		return false, err
	}
	return sameConfig(live, t, p.cfg)
}

func sameConfig(live any, t routes.Table, cfg Config) (bool, error) {
	raw, err := Render(t, cfg.Listen, cfg.Admin)
	if err != nil {
		return false, err
	}
	var want any
	if err := json.Unmarshal(raw, &want); err != nil {
		return false, fmt.Errorf("decode the rendered config: %w", err)
	}
	return reflect.DeepEqual(live, want), nil
}

// readBack rebuilds, as far as Caddy's config tells, the route table Caddy
// serves: each proxied hostname with its match conditions (path prefix,
// strip_prefix, headers, read back from the matchers [Render] writes) and
// its upstreams (all healthy; project, service and workload ids are not in
// Caddy's config). It reports false when Caddy has no server of Berth's.
func readBack(live any) (routes.Table, bool) {
	srv, ok := dig(live, "apps", "http", "servers", ServerName).(map[string]any)
	if !ok {
		return routes.Table{}, false
	}
	t := routes.Table{Routes: []routes.Route{}}
	seen := map[string]bool{}
	rs, _ := srv["routes"].([]any)
	for _, r := range rs {
		host, _ := dig(r, "match", 0, "host", 0).(string)
		rt := routes.Route{Hostname: host, Upstreams: []routes.Upstream{}}
		handlers, _ := dig(r, "handle").([]any)
		var handler map[string]any
		for _, h := range handlers {
			m, _ := h.(map[string]any)
			switch {
			case m == nil:
			case m["handler"] == "rewrite":
				rt.StripPrefix = m["strip_path_prefix"] != nil
			case m["handler"] == "reverse_proxy":
				handler = m
			}
		}
		if pat, ok := dig(r, "match", 0, "path_regexp", "pattern").(string); ok {
			rt.PathPrefix = unquoteMeta(strings.TrimSuffix(strings.TrimPrefix(pat, "^"), "(/|$)"))
		}
		if hs, ok := dig(r, "match", 0, "header_regexp").(map[string]any); ok {
			for name := range hs {
				pat, _ := dig(hs, name, "pattern").(string)
				rt.Headers = append(rt.Headers, routes.HeaderMatch{Name: name, Value: unquoteMeta(strings.TrimSuffix(strings.TrimPrefix(pat, "^"), "$"))})
			}
			slices.SortFunc(rt.Headers, routes.CompareHeaders)
		}
		key := host + "\x00" + rt.MatchKey()
		if host == "" || seen[key] || handler == nil {
			continue
		}
		seen[key] = true
		ups, _ := handler["upstreams"].([]any)
		for _, u := range ups {
			if d, ok := dig(u, "dial").(string); ok {
				rt.Upstreams = append(rt.Upstreams, routes.Upstream{WorkloadID: "caddy:" + d, Address: d, Healthy: true})
			}
		}
		t.Routes = append(t.Routes, rt)
	}
	t.Normalize()
	return t, true
}

// unquoteMeta undoes regexp.QuoteMeta: each backslash escapes the byte
// after it.
func unquoteMeta(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b = append(b, s[i])
	}
	return string(b)
}

// dig walks decoded JSON by object keys (string) and array indexes (int).
func dig(v any, path ...any) any {
	for _, step := range path {
		switch k := step.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}
