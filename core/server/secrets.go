package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// openSecrets loads the keyring (cfg.Keyring, or the data directory's) and returns the secret
// store over it. The keyring is generated only while the store holds no secret document: a
// keyring missing once secrets exist stops berthd (there is no keyless mode), as does an unsafe
// or malformed one, and one that does not hold a KEK some stored version is wrapped by.
func openSecrets(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) (*secrets.Store, error) {
	path := cfg.Keyring
	if path == "" {
		path = filepath.Join(cfg.DataDir, secrets.KeyringFile)
	}
	exist, err := secrets.Any(ctx, st)
	if err != nil {
		return nil, err
	}
	kr, created, err := secrets.LoadOrCreateKeyring(path, !exist)
	if errors.Is(err, secrets.ErrKeyringMissing) {
		return nil, fmt.Errorf("berthd: the store holds secrets but the keyring %s is missing; restore it (or pass --keyring): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("berthd: %w", err)
	}
	if created {
		log.Info("secrets keyring created", "path", path, "kek_id", kr.ActiveKEK())
	}
	s := secrets.NewStore(st, kr, nil)
	counts, err := s.WrappedBy(ctx)
	if err != nil {
		return nil, err
	}
	for id, n := range counts {
		if !kr.Has(id) {
			return nil, fmt.Errorf("berthd: %d secret versions are wrapped by %s, which the keyring %s does not hold: %w", n, id, path, secrets.ErrKeyringInvalid)
		}
	}
	return s, nil
}

// rewrapper runs [secrets.Store.Rewrap] in the background, one run at a time: a Kick during a
// run makes it run once more after, so a rotation started meanwhile is not missed.
type rewrapper struct {
	ctx    context.Context
	store  *secrets.Store
	rate   int
	also   []secrets.SealedSet // re-wrapped with the secrets: stored certificates
	log    *slog.Logger
	mu     sync.Mutex
	active bool
	again  bool
}

func newRewrapper(ctx context.Context, s *secrets.Store, rate int, log *slog.Logger, also ...secrets.SealedSet) *rewrapper {
	return &rewrapper{ctx: ctx, store: s, rate: rate, log: log, also: also}
}

// Kick starts a run unless one is running, in which case that run goes once more; it returns
// at once.
func (r *rewrapper) Kick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active {
		r.again = true
		return
	}
	r.active = true
	go r.loop()
}

func (r *rewrapper) loop() {
	for {
		err := r.store.Rewrap(r.ctx, secrets.RewrapConfig{PerSecond: r.rate, Logger: r.log, Also: r.also})
		if err != nil && r.ctx.Err() == nil {
			r.log.Error("keyring rotation stopped; it resumes at the next start or rotation", "err", err)
		}
		r.mu.Lock()
		if !r.again || r.ctx.Err() != nil {
			r.active = false
			r.mu.Unlock()
			return
		}
		r.again = false
		r.mu.Unlock()
	}
}
