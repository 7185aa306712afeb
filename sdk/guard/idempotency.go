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

	abierrors "github.com/berthhq/berth/abi/errors"
)

// IdempotencyStore records the result of each idempotency key, durably when
// it has a directory, so that a repeated key returns the recorded result.
// Safe for concurrent use; concurrent calls with one key run fn once.
type IdempotencyStore struct {
	dir string // "" keeps records in memory only

	mu       sync.Mutex
	records  map[string]*idemRecord   // loaded records; mu must be held
	inflight map[string]chan struct{} // keys whose fn runs; mu must be held
}

type idemRecord struct {
	Key           string          `json:"key"`
	RequestDigest string          `json:"request_digest"`
	Result        json.RawMessage `json:"result"`
	At            time.Time       `json:"at"`
}

// OpenIdempotencyStore returns a store keeping one file per key under dir
// (created 0700); an empty dir keeps records in memory. Records are kept
// until [IdempotencyStore.Prune] removes them.
func OpenIdempotencyStore(dir string) (*IdempotencyStore, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("idempotency store: %w", err)
		}
	}
	return &IdempotencyStore{dir: dir, records: map[string]*idemRecord{}, inflight: map[string]chan struct{}{}}, nil
}

// Do returns the result recorded for key, with replayed true, or runs fn and
// records its result when fn succeeds (a failed fn records nothing, so the
// key can be retried). The same key with a request whose JSON form differs
// returns an error of code idempotency_key_reused. A concurrent call with the
// same key waits for the first (or for ctx). T must survive a JSON round trip.
func Do[T any](ctx context.Context, s *IdempotencyStore, key string, request any, fn func() (T, error)) (result T, replayed bool, err error) {
	var zero T
	reqRaw, err := json.Marshal(request)
	if err != nil {
		return zero, false, fmt.Errorf("idempotency store: encode request: %w", err)
	}
	sum := sha256.Sum256(reqRaw)
	digest := hex.EncodeToString(sum[:])
	for {
		s.mu.Lock()
		rec, err := s.loadLocked(key)
		if err != nil {
			s.mu.Unlock()
			return zero, false, err
		}
		if rec != nil {
			s.mu.Unlock()
			if rec.RequestDigest != digest {
				return zero, false, abierrors.New(abierrors.IdempotencyKeyReused, fmt.Sprintf("idempotency key %q was used with another request", key))
			}
			var out T
			if err := json.Unmarshal(rec.Result, &out); err != nil {
				return zero, false, fmt.Errorf("idempotency store: decode recorded result of %q: %w", key, err)
			}
			return out, true, nil
		}
		wait, busy := s.inflight[key]
		if !busy {
			s.inflight[key] = make(chan struct{})
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return zero, false, fmt.Errorf("idempotency key %q: %w", key, ctx.Err())
		}
	}
	defer func() {
		s.mu.Lock()
		close(s.inflight[key])
		delete(s.inflight, key)
		s.mu.Unlock()
	}()
	out, err := fn()
	if err != nil {
		return zero, false, err
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return zero, false, fmt.Errorf("idempotency store: encode result: %w", err)
	}
	rec := &idemRecord{Key: key, RequestDigest: digest, Result: raw, At: time.Now().UTC()}
	if s.dir != "" {
		body, _ := json.Marshal(rec) // plain struct: cannot fail
		if err := writeFileAtomic(filepath.Join(s.dir, fileName(key)), body); err != nil {
			return zero, false, fmt.Errorf("idempotency store: record %q: %w", key, err)
		}
	}
	s.mu.Lock()
	s.records[key] = rec
	s.mu.Unlock()
	return out, false, nil
}

// loadLocked returns key's record, reading it from disk on first use; nil
// when there is none. mu must be held.
func (s *IdempotencyStore) loadLocked(key string) (*idemRecord, error) {
	if r, ok := s.records[key]; ok || s.dir == "" {
		return r, nil
	}
	raw, err := os.ReadFile(filepath.Join(s.dir, fileName(key)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency store: read %q: %w", key, err)
	}
	var r idemRecord
	if err := json.Unmarshal(raw, &r); err != nil || r.Key != key {
		return nil, fmt.Errorf("idempotency store: corrupt record of %q", key)
	}
	s.records[key] = &r
	return &r, nil
}

// Prune forgets records made before cutoff (in memory and on disk) and
// reports how many files it removed. Call it now and then, e.g. at start with
// a cutoff of a day ago.
func (s *IdempotencyStore) Prune(cutoff time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.records {
		if r.At.Before(cutoff) {
			delete(s.records, k)
		}
	}
	if s.dir == "" {
		return 0, nil
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("idempotency store: prune: %w", err)
	}
	n := 0
	for _, e := range entries {
		p := filepath.Join(s.dir, e.Name())
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var r idemRecord
		if json.Unmarshal(raw, &r) == nil && r.At.Before(cutoff) {
			if os.Remove(p) == nil {
				n++
			}
		}
	}
	return n, nil
}
