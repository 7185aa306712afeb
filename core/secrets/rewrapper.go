package secrets

import (
	"context"
	"log/slog"
	"sync"
)

// Rewrapper runs [Store.Rewrap] in the background, one run at a time: a Kick during a run makes
// it run once more after, so a rotation started meanwhile is not missed (docs/secrets.md).
type Rewrapper struct {
	ctx   context.Context
	store *Store
	cfg   RewrapConfig

	mu     sync.Mutex
	active bool // a run is going; mu must be held
	again  bool // run once more after this one; mu must be held
}

// NewRewrapper returns a Rewrapper of s whose runs last at most as long as ctx, each with cfg
// (rate, logger, the sealed sets re-wrapped along: stored certificates). It runs nothing until
// [Rewrapper.Kick].
func NewRewrapper(ctx context.Context, s *Store, cfg RewrapConfig) *Rewrapper {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Rewrapper{ctx: ctx, store: s, cfg: cfg}
}

// Kick starts a run unless one is running, in which case that run goes once more; it returns
// at once. A run that fails is logged; the rotation resumes at the next Kick or start.
func (r *Rewrapper) Kick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active {
		r.again = true
		return
	}
	r.active = true
	go r.loop()
}

func (r *Rewrapper) loop() {
	for {
		err := r.store.Rewrap(r.ctx, r.cfg)
		if err != nil && r.ctx.Err() == nil {
			r.cfg.Logger.Error("keyring rotation stopped; it resumes at the next start or rotation", "err", err)
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
