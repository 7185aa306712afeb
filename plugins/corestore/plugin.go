package corestore

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/plugins/corestore/backup"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// connectTimeout bounds one connection attempt to a managed server.
const connectTimeout = 10 * time.Second

// idempotencyKeep is how long records of applied mutations are kept.
const idempotencyKeep = 7 * 24 * time.Hour

// Plugin is the Corestore provider (docs/bindings.md section 2). Made by
// [Open] on a state directory, its fencing and idempotency records, its
// binding records and its credential key survive a restart (DurableState
// true). Safe for concurrent use.
//
// Apply makes the database (or bucket) and its user exist with a password
// derived from the credential key, the binding id and the grant, so a
// repeated or replayed Apply hands back the same credentials without the
// plugin ever writing them down; a new grant (a new generation) sets a new
// password. Delete without Purge only releases a binding: the data stays.
type Plugin struct {
	guards   *guard.Guards
	stateDir string // "" keeps everything in memory

	mu       sync.Mutex
	key      []byte             // credential key; mu must be held
	backends map[string]backend // by resource type; mu must be held
	records  map[string]*record // by type/id; mu must be held
	cfg      Config             // the last configuration; mu must be held

	worker     *backup.Worker     // the backup executor, once configured; mu must be held
	stopWorker context.CancelFunc // ends the executor's lifetime; mu must be held
	workerDone chan struct{}      // closed when the executor has stopped; mu must be held
}

var _ provider.Provider = (*Plugin)(nil)
var _ provider.Configurer = (*Plugin)(nil)

// record is what the plugin keeps of one binding it applied.
type record struct {
	Type     string          `json:"type"`
	ID       string          `json:"id"`
	Database string          `json:"database"`
	State    json.RawMessage `json:"state"`
	Released bool            `json:"released,omitempty"` // deleted without purge: data kept
}

const (
	keyFile    = "credential.key"
	recordsDir = "bindings"
)

// Open returns the plugin with its state under stateDir (created 0700;
// empty keeps it in memory). It fails when the directory cannot be made or
// a stored record or key does not read.
func Open(stateDir string) (*Plugin, error) {
	g, err := guard.Open(stateDir)
	if err != nil {
		return nil, fmt.Errorf("corestore state directory: %w", err)
	}
	p := &Plugin{guards: g, stateDir: stateDir, backends: map[string]backend{}, records: map[string]*record{}}
	if stateDir == "" {
		return p, nil
	}
	if _, err := g.Idempotency.Prune(time.Now().Add(-idempotencyKeep)); err != nil {
		return nil, fmt.Errorf("corestore state directory: %w", err)
	}
	dir := filepath.Join(stateDir, recordsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("corestore state directory: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("corestore state directory: %w", err)
	}
	for _, e := range ents {
		raw, err := securefile.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("corestore binding record %s: %w", e.Name(), err)
		}
		var r record
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("corestore binding record %s: %w", e.Name(), err)
		}
		p.records[r.Type+"/"+r.ID] = &r
	}
	return p, nil
}

// Describe implements provider.Provider: name "corestore", the three binding
// types and the inventory type.
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name: "corestore", Version: version.Version, APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			DurableState: p.stateDir != "",
			ResourceTypes: []provider.ResourceType{
				{Name: bindings.TypePostgres}, {Name: bindings.TypeMongoDB}, {Name: bindings.TypeS3},
				{Name: bindings.TypeInventory, Variants: []string{"postgres", "mongodb", "s3"}},
			},
		},
	}, nil
}

// ValidateConfig implements provider.Provider: a [Config] object.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	c, err := decodeConfig(req.Config)
	if err != nil {
		return &provider.ValidateConfigResponse{Problems: []string{"config: " + err.Error()}}, nil
	}
	return &provider.ValidateConfigResponse{Problems: c.problems()}, nil
}

// Configure implements provider.Configurer: it takes the servers and the
// credential key. It reaches no server, so a server that is down does not
// stop the plugin; calls that need it fail with binding_unavailable.
func (p *Plugin) Configure(ctx context.Context, req *provider.ConfigRequest) error {
	c, err := decodeConfig(req.Config)
	if err != nil {
		return fmt.Errorf("configure: %w", err)
	}
	if probs := c.problems(); len(probs) > 0 {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("configure: %q", probs))
	}
	key, err := p.loadKey(c.CredentialKey)
	if err != nil {
		return err
	}
	backends := map[string]backend{}
	if c.Postgres != nil {
		backends[bindings.TypePostgres] = postgres{cfg: c.Postgres}
	}
	if c.MongoDB != nil {
		backends[bindings.TypeMongoDB] = &mongoDB{cfg: c.MongoDB}
	}
	if c.S3 != nil {
		s, err := newS3(c.S3)
		if err != nil {
			return abierrors.Wrap(abierrors.ValidationFailed, "configure", err)
		}
		backends[bindings.TypeS3] = s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.backends {
		if m, ok := b.(*mongoDB); ok {
			m.close(ctx)
		}
	}
	p.key, p.backends, p.cfg = key, backends, c
	return p.startExecutorLocked(c.Executor)
}

// Close disconnects from the servers.
func (p *Plugin) Close() error {
	p.stopExecutor()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.backends {
		if m, ok := b.(*mongoDB); ok {
			m.close(context.Background())
		}
	}
	return nil
}

// loadKey returns the configured key, or the state directory's (made on
// first use), or a fresh one in memory.
func (p *Plugin) loadKey(configured string) ([]byte, error) {
	if configured != "" {
		return hex.DecodeString(configured) // checked by problems
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.key != nil {
		return p.key, nil
	}
	if p.stateDir == "" {
		k := make([]byte, 32)
		_, _ = rand.Read(k) // never fails
		return k, nil
	}
	path := filepath.Join(p.stateDir, keyFile)
	raw, err := securefile.ReadFile(path)
	switch {
	case err == nil && len(raw) == 32:
		return raw, nil
	case err == nil:
		return nil, fmt.Errorf("corestore credential key %s: %d bytes, want 32", path, len(raw))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("corestore credential key: %w", err)
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	if err := securefile.WriteFile(path, k); err != nil {
		return nil, fmt.Errorf("corestore credential key: %w", err)
	}
	return k, nil
}

// backend returns the backend of typ, or an error naming what is missing.
func (p *Plugin) backend(typ string) (backend, []byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := map[string]bool{bindings.TypePostgres: true, bindings.TypeMongoDB: true, bindings.TypeS3: true}[typ]; !ok {
		return nil, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("corestore manages %s, %s and %s, not %q", bindings.TypePostgres, bindings.TypeMongoDB, bindings.TypeS3, typ))
	}
	b := p.backends[typ]
	if b == nil {
		return nil, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("no server is configured for %s", typ))
	}
	return b, p.key, nil
}

// namesOf are the server names of a binding id of type typ.
func namesOf(typ, id string) names {
	if typ == bindings.TypeS3 {
		n := serverName(id, '-', bucketMaxName)
		return names{ID: id, Database: n, User: n}
	}
	max := pgMaxName
	if typ == bindings.TypeMongoDB {
		max = mongoMaxName
	}
	n := serverName(id, '_', max)
	return names{ID: id, Database: n, User: n}
}

// planned returns the planned state of a granted request.
func (p *Plugin) planned(ctx context.Context, r provider.Resource) (provider.Resource, bindings.State, backend, []byte, error) {
	b, key, err := p.backend(r.Type)
	if err != nil {
		return provider.Resource{}, bindings.State{}, nil, nil, err
	}
	d, err := decodeDesired(r.Type, r.ID, r.Attributes)
	if err != nil {
		return provider.Resource{}, bindings.State{}, nil, nil, err
	}
	st, err := b.plan(ctx, namesOf(r.Type, r.ID))
	if err != nil {
		return provider.Resource{}, bindings.State{}, nil, nil, err
	}
	st.Desired = d
	raw, err := json.Marshal(st)
	if err != nil {
		return provider.Resource{}, bindings.State{}, nil, nil, fmt.Errorf("encode state: %w", err)
	}
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}, st, b, key, nil
}

// Plan implements provider.Provider. The grant is checked here already, so
// an ungranted request fails before anything is asked of Apply.
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	planned, _, _, _, err := p.planned(ctx, req.Desired)
	if err != nil {
		return nil, fmt.Errorf("plan %s/%s: %w", req.Desired.Type, req.Desired.ID, err)
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// derivePassword is the binding's password under grant: 32 hex characters
// of HMAC-SHA256(key, id, grant).
func derivePassword(key []byte, id, grant string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write([]byte(grant))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

// Apply implements provider.Provider: under a matching grant it makes the
// database (or bucket) and its user exist with the binding's password,
// records the binding, and returns the planned state and the credentials
// (ApplyResponse.Credentials: a JSON object of the workload's values, keys
// as in docs/bindings.md section 4). Fenced and idempotent through
// sdk/guard; a replay returns the same credentials. Errors: validation_failed
// (bad request, unconfigured kind), binding_not_granted, binding_unavailable
// (the server did not answer), stale_fencing_token.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	r := req.Planned
	var st bindings.State
	var b backend
	var key []byte
	resp, err := guard.Mutate(ctx, p.guards, r.Type+"/"+r.ID, req.Mutation, req.Planned, func() (*provider.ApplyResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		planned, s, bk, k, err := p.planned(ctx, r)
		if err != nil {
			return nil, err
		}
		if !planned.Equal(r) {
			return nil, abierrors.New(abierrors.ValidationFailed, "the planned state is not the one Plan gives for this request")
		}
		n := namesOf(r.Type, r.ID)
		if err := bk.ensure(ctx, n, derivePassword(k, r.ID, s.Grant)); err != nil {
			return nil, err
		}
		if err := p.putRecord(&record{Type: r.Type, ID: r.ID, Database: n.Database, State: planned.Attributes}); err != nil {
			return nil, err
		}
		return &provider.ApplyResponse{State: planned}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("apply %s/%s: %w", r.Type, r.ID, err)
	}
	// The credentials are derived again, on a replay too, and never recorded.
	if err := json.Unmarshal(resp.State.Attributes, &st); err != nil {
		return nil, fmt.Errorf("apply %s/%s: recorded state: %w", r.Type, r.ID, err)
	}
	if b, key, err = p.backend(r.Type); err != nil {
		return nil, fmt.Errorf("apply %s/%s: %w", r.Type, r.ID, err)
	}
	creds, err := json.Marshal(b.credentials(st, derivePassword(key, r.ID, st.Grant)))
	if err != nil {
		return nil, fmt.Errorf("apply %s/%s: %w", r.Type, r.ID, err)
	}
	return &provider.ApplyResponse{State: resp.State, Credentials: creds}, nil
}

// putRecord stores r (temp file, fsync, rename) and keeps it in memory.
func (p *Plugin) putRecord(r *record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stateDir != "" {
		raw, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode binding record: %w", err)
		}
		if err := securefile.WriteFile(p.recordPath(r.Type, r.ID), raw); err != nil {
			return fmt.Errorf("store binding record: %w", err)
		}
	}
	p.records[r.Type+"/"+r.ID] = r
	return nil
}

// dropRecord removes the record of type/id; an absent one is success.
func (p *Plugin) dropRecord(typ, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stateDir != "" {
		if err := os.Remove(p.recordPath(typ, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove binding record: %w", err)
		}
	}
	delete(p.records, typ+"/"+id)
	return nil
}

// recordPath is the record file of type/id. mu must be held.
func (p *Plugin) recordPath(typ, id string) string {
	sum := sha256.Sum256([]byte(typ + "/" + id))
	return filepath.Join(p.stateDir, recordsDir, hex.EncodeToString(sum[:16])+".json")
}

func (p *Plugin) record(typ, id string) *record {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.records[typ+"/"+id]; r != nil {
		c := *r
		return &c
	}
	return nil
}

// Read implements provider.Provider. For a binding: its applied state once
// the server confirms the database exists; not_found when it was never
// applied, was deleted, or its database is gone from the server;
// binding_unavailable with the reason when the server does not answer. For
// bindings.TypeInventory (id "postgres", "mongodb" or "s3"): an [bindings.Inventory], which
// for an unreachable server is Reachable false with the reason.
func (p *Plugin) Read(ctx context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.Type == bindings.TypeInventory {
		inv, err := p.inventory(ctx, req.ID)
		if err != nil {
			return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, err)
		}
		raw, err := json.Marshal(inv)
		if err != nil {
			return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, err)
		}
		return &provider.ReadResponse{State: provider.Resource{Type: req.Type, ID: req.ID, Attributes: raw}}, nil
	}
	b, _, err := p.backend(req.Type)
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, err)
	}
	rec := p.record(req.Type, req.ID)
	if rec == nil || rec.Released {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	ok, err := b.exists(ctx, namesOf(req.Type, req.ID))
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("read %s/%s: its database %s is gone from the server: %w", req.Type, req.ID, rec.Database, provider.ErrNotFound)
	}
	return &provider.ReadResponse{State: provider.Resource{Type: req.Type, ID: req.ID, Attributes: rec.State}}, nil
}

// inventory lists what the server of kind holds.
func (p *Plugin) inventory(ctx context.Context, kind string) (*bindings.Inventory, error) {
	typ, ok := bindings.Kinds[kind]
	if !ok {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("inventory of %q: want postgres, mongodb or s3", kind))
	}
	b, _, err := p.backend(typ)
	if err != nil {
		return nil, err
	}
	inv := &bindings.Inventory{Kind: kind, Resources: []bindings.InventoryItem{}}
	all, err := b.list(ctx)
	if err != nil {
		if !errors.Is(err, errUnreachable) {
			return nil, err
		}
		inv.Reason = err.Error()
		return inv, nil
	}
	inv.Reachable = true
	byName := map[string]*record{}
	p.mu.Lock()
	for _, r := range p.records {
		if r.Type == typ {
			byName[r.Database] = r
		}
	}
	p.mu.Unlock()
	for _, name := range all {
		it := bindings.InventoryItem{Name: name, State: "unknown"}
		if r := byName[name]; r != nil {
			it.ID, it.State = r.ID, "bound"
			if r.Released {
				it.State = "released"
			}
		}
		inv.Resources = append(inv.Resources, it)
	}
	sort.Slice(inv.Resources, func(i, j int) bool { return inv.Resources[i].Name < inv.Resources[j].Name })
	return inv, nil
}

// Delete implements provider.Provider. Without Purge the binding is
// released: Read answers not_found, the inventory lists its data as
// "released", and nothing on the server changes. With Purge (which needs a
// fencing token: the project's fence) the database or bucket and its user
// are dropped. An absent binding is success. Fenced and idempotent.
func (p *Plugin) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	b, _, err := p.backend(req.Type)
	if err != nil {
		return nil, fmt.Errorf("delete %s/%s: %w", req.Type, req.ID, err)
	}
	if req.Purge && req.FencingToken == 0 {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("delete %s/%s: a purge needs the project's fencing token", req.Type, req.ID))
	}
	_, err = guard.Mutate(ctx, p.guards, req.Type+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if req.Purge {
			if err := b.purge(ctx, namesOf(req.Type, req.ID)); err != nil {
				return nil, err
			}
			return &provider.DeleteResponse{}, p.dropRecord(req.Type, req.ID)
		}
		if rec := p.record(req.Type, req.ID); rec != nil && !rec.Released {
			rec.Released = true
			if err := p.putRecord(rec); err != nil {
				return nil, err
			}
		}
		return &provider.DeleteResponse{}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete %s/%s: %w", req.Type, req.ID, err)
	}
	return &provider.DeleteResponse{}, nil
}
