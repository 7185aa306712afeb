package certs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/berthhq/berth/core/leases"
)

// lockKeyPrefix names certmagic's locks among the store's leases.
const lockKeyPrefix = "cert:"

// lockPoll bounds the wait between two tries of a lock another owner holds.
const (
	lockPollMin = 100 * time.Millisecond
	lockPollMax = 2 * time.Second
)

// Locks are certmagic's named locks as store leases (core/leases): one
// document per name taken by compare-and-set with an expiry, renewed every
// TTL/3 while held, so two berthd replicas never order the same certificate
// at once and a holder that dies frees its lock within one TTL
// (docs/certificates.md section 4). Safe for concurrent use.
type Locks struct {
	m   *leases.Manager
	log *slog.Logger

	mu   sync.Mutex
	held map[string]*heldLock
}

type heldLock struct {
	mu    sync.Mutex
	lease leases.Lease
	stop  context.CancelFunc
	done  chan struct{}
}

// NewLocks returns Locks over m. It does no I/O.
func NewLocks(m *leases.Manager, log *slog.Logger) *Locks {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Locks{m: m, log: log, held: map[string]*heldLock{}}
}

// Lock takes the lock name, waiting (100 ms growing to 2 s between tries)
// while another owner holds it, until ctx ends. Errors: ctx's, or a store
// error.
func (l *Locks) Lock(ctx context.Context, name string) error {
	wait := lockPollMin
	for {
		ok, err := l.TryLock(ctx, name)
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("certs: lock %s: %w", name, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, lockPollMax)
	}
}

// TryLock takes the lock name if no other owner holds it and reports
// whether it did. A name this process holds already counts as held by
// another (certmagic's locks are not reentrant).
func (l *Locks) TryLock(ctx context.Context, name string) (bool, error) {
	l.mu.Lock()
	_, mine := l.held[name]
	l.mu.Unlock()
	if mine {
		return false, nil
	}
	lease, err := l.m.Acquire(ctx, lockKeyPrefix+name)
	if errors.Is(err, leases.ErrBusy) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("certs: lock %s: %w", name, err)
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h := &heldLock{lease: lease, stop: stop, done: make(chan struct{})}
	l.mu.Lock()
	if _, raced := l.held[name]; raced {
		l.mu.Unlock()
		stop()
		_ = l.m.Release(context.WithoutCancel(ctx), lease)
		return false, nil
	}
	l.held[name] = h
	l.mu.Unlock()
	go l.renew(rctx, name, h)
	return true, nil
}

// renew keeps h's lease alive every TTL/3 until stopped; a renewal that
// fails is logged and the loop ends (the lease then expires, and a later
// RenewLockLease reports the loss).
func (l *Locks) renew(ctx context.Context, name string, h *heldLock) {
	defer close(h.done)
	t := time.NewTicker(l.m.TTL() / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.mu.Lock()
			next, err := l.m.Renew(ctx, h.lease)
			if err == nil {
				h.lease = next
			}
			h.mu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					l.log.Warn("certificate lock renewal failed", "lock", name, "error", err)
				}
				return
			}
		}
	}
}

// RenewLockLease renews the lock name now; certmagic calls it before each
// retry of an order. Errors: wrapping [leases.ErrLost] when the lock is no
// longer this process's. The duration is the lease TTL, not d.
func (l *Locks) RenewLockLease(ctx context.Context, name string, _ time.Duration) error {
	l.mu.Lock()
	h, ok := l.held[name]
	l.mu.Unlock()
	if !ok {
		return fmt.Errorf("certs: renew lock %s: not held: %w", name, leases.ErrLost)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	next, err := l.m.Renew(ctx, h.lease)
	if err != nil {
		return fmt.Errorf("certs: renew lock %s: %w", name, err)
	}
	h.lease = next
	return nil
}

// Unlock releases the lock name. A lock that was lost meanwhile (expired and
// taken) is not an error: nothing of another owner changes.
func (l *Locks) Unlock(ctx context.Context, name string) error {
	l.mu.Lock()
	h, ok := l.held[name]
	delete(l.held, name)
	l.mu.Unlock()
	if !ok {
		return nil
	}
	h.stop()
	<-h.done
	err := l.m.Release(ctx, h.lease)
	if err != nil && !errors.Is(err, leases.ErrLost) {
		return fmt.Errorf("certs: unlock %s: %w", name, err)
	}
	return nil
}
