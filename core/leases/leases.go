package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per lease key: {_id: key, owner, epoch, expires_at, revision}.
const Collection = "project_leases"

// DefaultTTL is the lease lifetime when [Config.TTL] is zero.
const DefaultTTL = 30 * time.Second

// Key returns the lease key of a project: "project:<id>".
func Key(projectID string) string { return "project:" + projectID }

// Lease is one holding of a key, returned by [Manager.Acquire].
type Lease struct {
	Key       string
	Owner     string
	Epoch     int64
	ExpiresAt time.Time
}

// Config configures a [Manager]. Owner is required.
type Config struct {
	// Owner identifies this worker (one per berthd process), for example "brd_<ULID>".
	Owner string
	// TTL is how long a holding lasts without renewal; zero means [DefaultTTL].
	TTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives renewal failures of [Manager.Hold]; nil discards.
	Logger *slog.Logger
}

// Manager acquires, renews and releases leases in the store. Every change is one compare-and-set
// on the lease's own document (DESIGN.md section 4). Safe for concurrent use.
type Manager struct {
	st  *store.Store // reads from its view; every change is a compare-and-set
	cfg Config
}

// NewManager returns a Manager over s. It does no I/O.
func NewManager(s *store.Store, cfg Config) *Manager {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{st: s, cfg: cfg}
}

// TTL returns the lifetime of a holding.
func (m *Manager) TTL() time.Duration { return m.cfg.TTL }

type doc struct {
	ID        string    `bson:"_id"`
	Owner     string    `bson:"owner"`
	Epoch     int64     `bson:"epoch"`
	ExpiresAt time.Time `bson:"expires_at"`
	Revision  int64     `bson:"revision"`
}

func (d doc) state() State { return State{Owner: d.Owner, Epoch: d.Epoch, ExpiresAt: d.ExpiresAt} }

// load returns the lease document of key, or ok=false when there is none.
func (m *Manager) load(ctx context.Context, key string) (doc, bool, error) {
	var d doc
	err := m.st.ViewGet(ctx, Collection, key, &d)
	if errors.Is(err, store.ErrNotFound) {
		return doc{ID: key}, false, nil
	}
	return d, err == nil, err
}

// apply runs decide on the current state of key and writes its answer with one compare-and-set,
// re-deciding after a lost race.
func (m *Manager) apply(ctx context.Context, key string, decide func(State, time.Time) (State, error)) (State, error) {
	var out State
	err := store.RetryOnConflictFunc(ctx, raced, func() error {
		cur, exists, err := m.load(ctx, key)
		if err != nil {
			return fmt.Errorf("leases: read %s: %w", key, err)
		}
		next, err := decide(cur.state(), m.cfg.Now().UTC())
		if err != nil {
			return fmt.Errorf("leases: %s: %w", key, err)
		}
		if !exists {
			err = m.st.Insert(ctx, Collection, doc{ID: key, Owner: next.Owner, Epoch: next.Epoch, ExpiresAt: next.ExpiresAt})
		} else {
			_, err = m.st.SetIfRevision(ctx, Collection, key, cur.Revision, store.Fields{
				"owner": next.Owner, "epoch": next.Epoch, "expires_at": next.ExpiresAt,
			})
		}
		if err != nil {
			return fmt.Errorf("leases: write %s: %w", key, errLostRace{err})
		}
		out = next
		return nil
	})
	if err != nil {
		return State{}, err
	}
	return out, nil
}

// errLostRace marks a write of [Manager.apply] that lost to another writer (a duplicate insert,
// a changed or vanished document), so that only the write, never the read or decide, is retried.
type errLostRace struct{ err error }

func (e errLostRace) Error() string { return e.err.Error() }
func (e errLostRace) Unwrap() error { return e.err }

// raced reports whether err is a lost race of [Manager.apply]'s write.
func raced(err error) bool {
	var lost errLostRace
	if !errors.As(err, &lost) {
		return false
	}
	return store.IsDuplicateKey(lost.err) || errors.Is(lost.err, store.ErrConflict) || errors.Is(lost.err, store.ErrNotFound)
}

// Acquire takes the lease on key for this worker. Errors: wrapping [ErrBusy] when another owner
// holds it; a store error otherwise.
func (m *Manager) Acquire(ctx context.Context, key string) (Lease, error) {
	st, err := m.apply(ctx, key, func(cur State, now time.Time) (State, error) {
		return Acquire(cur, m.cfg.Owner, now, m.cfg.TTL)
	})
	if err != nil {
		return Lease{}, err
	}
	return Lease{Key: key, Owner: st.Owner, Epoch: st.Epoch, ExpiresAt: st.ExpiresAt}, nil
}

// Renew extends l by the TTL and returns the renewed holding. Errors: wrapping [ErrLost] when l is
// no longer current.
func (m *Manager) Renew(ctx context.Context, l Lease) (Lease, error) {
	st, err := m.apply(ctx, l.Key, func(cur State, now time.Time) (State, error) {
		return Renew(cur, l.Owner, l.Epoch, now, m.cfg.TTL)
	})
	if err != nil {
		return l, err
	}
	l.ExpiresAt = st.ExpiresAt
	return l, nil
}

// Release frees l at once. Errors: wrapping [ErrLost] when l was no longer current (nothing changes).
func (m *Manager) Release(ctx context.Context, l Lease) error {
	_, err := m.apply(ctx, l.Key, func(cur State, now time.Time) (State, error) {
		return Release(cur, l.Owner, l.Epoch, now)
	})
	return err
}

// Hold runs fn while holding the lease on key:
//
//  1. it acquires the lease (wrapping [ErrBusy] when another worker holds it; fn does not run);
//  2. it renews the lease every TTL/3 while fn runs; when a renewal fails the lease is treated as
//     lost and fn's ctx is cancelled with cause [ErrLost];
//  3. when fn returns it releases the lease.
//
// Hold returns fn's error, or an error wrapping [ErrLost] whenever the lease was lost before fn
// returned or could not be confirmed at release, even if fn itself succeeded: a lost lease is never
// reported as success.
func (m *Manager) Hold(ctx context.Context, key string, fn func(ctx context.Context, l Lease) error) error {
	l, err := m.Acquire(ctx, key)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lost := make(chan error, 1)
	done := make(chan struct{})
	renewed := make(chan Lease, 1)
	go func() {
		cur := l
		t := time.NewTicker(m.cfg.TTL / 3)
		defer t.Stop()
		defer func() { renewed <- cur }()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				next, err := m.Renew(fctx, cur)
				if err != nil {
					if !errors.Is(err, ErrLost) {
						m.cfg.Logger.Warn("project lease renewal failed; treating the lease as lost", "key", key, "err", err)
						err = fmt.Errorf("%w: renewal failed: %w", ErrLost, err)
					}
					lost <- err
					cancel(ErrLost)
					return
				}
				cur = next
			}
		}
	}()
	ferr := fn(fctx, l)
	close(done)
	cur := <-renewed
	select {
	case err := <-lost:
		return fmt.Errorf("leases: hold %s: %w", key, err)
	default:
	}
	if err := m.Release(context.WithoutCancel(ctx), cur); err != nil {
		if errors.Is(err, ErrLost) {
			return err
		}
		if ferr == nil {
			return fmt.Errorf("leases: hold %s: %w: release failed: %w", key, ErrLost, err)
		}
	}
	return ferr
}
