// Package guard holds the helpers that make a correct plugin the easy path:
// a durable fencing guard and an idempotency store (docs/plugins.md section 1.5).
//
// A plugin opens one [Guards] on its state directory and wraps every mutating
// call in [Mutate]:
//
//	func (p *P) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
//		return guard.Mutate(ctx, p.guards, req.Planned.Type+"/"+req.Planned.ID, req.Mutation, req,
//			func() (*provider.ApplyResponse, error) { ... the real work ... })
//	}
package guard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
)

// Guards is a fencing guard and an idempotency store over one state
// directory, plus a lock per resource so that the fencing check and the
// mutation it admits are atomic. Safe for concurrent use.
type Guards struct {
	Fence       *FenceGuard
	Idempotency *IdempotencyStore

	mu    sync.Mutex
	locks map[string]*resourceLock // mu must be held
}

type resourceLock struct {
	mu   sync.Mutex
	refs int
}

// Open returns Guards keeping their records under stateDir/fence and
// stateDir/idempotency (created 0700). An empty stateDir keeps them in memory
// only: they then last as long as the process, which suits a plugin whose
// state does not survive it either.
func Open(stateDir string) (*Guards, error) {
	fenceDir, idemDir := "", ""
	if stateDir != "" {
		fenceDir, idemDir = filepath.Join(stateDir, "fence"), filepath.Join(stateDir, "idempotency")
	}
	f, err := OpenFenceGuard(fenceDir)
	if err != nil {
		return nil, err
	}
	s, err := OpenIdempotencyStore(idemDir)
	if err != nil {
		return nil, err
	}
	return &Guards{Fence: f, Idempotency: s, locks: map[string]*resourceLock{}}, nil
}

// OpenPruned is [Open] for a provider plugin's state directory: it creates stateDir (0700) when
// it is not empty, opens the guards there, and drops idempotency records older than keep, as a
// plugin does once at start. An empty stateDir keeps the guards in memory, with nothing to prune.
func OpenPruned(stateDir string, keep time.Duration) (*Guards, error) {
	if stateDir != "" {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, err
		}
	}
	g, err := Open(stateDir)
	if err != nil {
		return nil, err
	}
	if stateDir != "" {
		if _, err := g.Idempotency.Prune(time.Now().Add(-keep)); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// Lock takes the lock of resource and returns its release function.
func (g *Guards) Lock(resource string) (unlock func()) {
	g.mu.Lock()
	l := g.locks[resource]
	if l == nil {
		l = &resourceLock{}
		g.locks[resource] = l
	}
	l.refs++
	g.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		g.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(g.locks, resource)
		}
		g.mu.Unlock()
	}
}

// Mutate runs fn as the mutation m of resource, under the resource's lock:
//
//  1. m.FencingToken is admitted by the fencing guard; a stale token returns
//     an error matching [pluginapi.ErrStaleFencingToken] and fn does not run.
//  2. A non-empty m.IdempotencyKey seen before returns the recorded result
//     (and fn does not run); the same key with another request returns an
//     error of code idempotency_key_reused.
//  3. Otherwise fn runs; a successful result is recorded under the key.
//
// request is what identifies the call for step 2 (JSON-encoded and hashed);
// pass the whole request. T must survive a JSON round trip.
func Mutate[T any](ctx context.Context, g *Guards, resource string, m pluginapi.Mutation, request any, fn func() (T, error)) (T, error) {
	return MutateFenced(ctx, g, resource, "", m, request, fn)
}

// MutateFenced is [Mutate] for a call whose fencing token is about another
// resource than the one it changes, e.g. a runtime driver's Start of a
// stateful workload, fenced by the workload's lease (docs/plugins.md section
// 3.4). fence names that resource; empty means resource itself. The lock of
// fence is taken before the lock of resource, so that the fencing check and
// every mutation it admits are atomic across all resources under one fence.
func MutateFenced[T any](ctx context.Context, g *Guards, resource, fence string, m pluginapi.Mutation, request any, fn func() (T, error)) (T, error) {
	if fence == "" || fence == resource {
		fence = resource
	} else {
		unlockFence := g.Lock(fence)
		defer unlockFence()
	}
	unlock := g.Lock(resource)
	defer unlock()
	var zero T
	if err := g.Fence.Admit(fence, m.FencingToken); err != nil {
		return zero, err
	}
	if m.IdempotencyKey == "" {
		return fn()
	}
	r, _, err := Do(ctx, g.Idempotency, m.IdempotencyKey, request, fn)
	return r, err
}

// FenceGuard keeps the highest fencing token seen per resource, durably when
// it has a directory. Safe for concurrent use.
type FenceGuard struct {
	dir string // "" keeps tokens in memory only

	mu      sync.Mutex
	highest map[string]uint64 // loaded entries; mu must be held
}

// OpenFenceGuard returns a guard keeping one small file per resource under
// dir (created 0700); an empty dir keeps tokens in memory.
func OpenFenceGuard(dir string) (*FenceGuard, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("fence guard: %w", err)
		}
	}
	return &FenceGuard{dir: dir, highest: map[string]uint64{}}, nil
}

type fenceRecord struct {
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
}

// Admit checks token against the highest seen for resource. A lower token
// returns an error matching [pluginapi.ErrStaleFencingToken] (code
// stale_fencing_token) that names both tokens; an equal one is admitted; a
// higher one becomes the new highest, written to disk (temp file, fsync,
// rename) before Admit returns. Cost: a map lookup, plus one small durable
// write when the token rises.
func (g *FenceGuard) Admit(resource string, token uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	h, err := g.highestLocked(resource)
	if err != nil {
		return err
	}
	if token < h {
		return fmt.Errorf("resource %s: fencing token %d is lower than %d: %w", resource, token, h, pluginapi.ErrStaleFencingToken)
	}
	if token == h {
		return nil
	}
	if g.dir != "" {
		raw, _ := json.Marshal(fenceRecord{Resource: resource, Token: token}) // plain struct: cannot fail
		if err := writeFileAtomic(g.path(resource), raw); err != nil {
			return fmt.Errorf("fence guard: record token of %s: %w", resource, err)
		}
	}
	g.highest[resource] = token
	return nil
}

// Highest returns the highest token admitted for resource; zero when none.
func (g *FenceGuard) Highest(resource string) (uint64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highestLocked(resource)
}

// highestLocked loads resource's record on first use. mu must be held.
func (g *FenceGuard) highestLocked(resource string) (uint64, error) {
	if h, ok := g.highest[resource]; ok || g.dir == "" {
		return h, nil
	}
	raw, err := os.ReadFile(g.path(resource))
	if errors.Is(err, os.ErrNotExist) {
		g.highest[resource] = 0
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fence guard: read token of %s: %w", resource, err)
	}
	var r fenceRecord
	if err := json.Unmarshal(raw, &r); err != nil || r.Resource != resource {
		return 0, fmt.Errorf("fence guard: corrupt record of %s", resource)
	}
	g.highest[resource] = r.Token
	return r.Token, nil
}

func (g *FenceGuard) path(resource string) string { return filepath.Join(g.dir, fileName(resource)) }

// fileName is a safe, fixed-length file name for an arbitrary key.
func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16]) + ".json"
}

// writeFileAtomic writes raw to path: temp file, fsync, rename (0600),
// fsync of the directory.
func writeFileAtomic(path string, raw []byte) error { return writeDurable(path, raw, os.Rename) }

// writeDurable writes raw to a temp file (0600) beside path, fsyncs it, puts
// it in place with place (os.Rename to replace, os.Link to create only),
// then fsyncs the directory: the new name is durable only once the
// directory is synced, so a token that rose must not fall back after a crash.
func writeDurable(path string, raw []byte, place func(tmp, path string) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a rename
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := place(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
