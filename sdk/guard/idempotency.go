package guard

import (
	"bytes"
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
	"strings"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// IdempotencyStore records the result of each idempotency key, durably when
// it has a directory, so that a repeated key returns the recorded result.
// Safe for concurrent use; concurrent calls with one key run fn once.
//
// A record identifies its request by an HMAC-SHA256 of the request's JSON
// form under a 32-byte key of the store's own ([RequestKeyFile], 0600), never
// by a plain digest: requests carry secret values (a runtime driver's Start
// holds the workload's secret environment), and a plain digest of a request
// whose only unknown is a short secret can be reversed by trying values.
type IdempotencyStore struct {
	dir string // "" keeps records in memory only
	mac []byte // the HMAC key of request digests

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

// RequestKeyFile is the file under an [IdempotencyStore]'s directory that
// holds the key of its request digests: 64 hex characters and a newline,
// owner-only (0600).
const RequestKeyFile = "request-key"

// macPrefix marks a request digest made with the store's key; a record
// without it holds the plain SHA-256 hex of earlier versions.
const macPrefix = "hmac-sha256:"

// ErrInsecureKeyFile is wrapped by [OpenIdempotencyStore] (and [Open]) when
// [RequestKeyFile] is a symbolic link, not a regular file, readable or
// writable by group or others, or not a key.
var ErrInsecureKeyFile = errors.New("berth: idempotency request key file is not a private regular file holding a key")

// OpenIdempotencyStore returns a store keeping one file per key under dir
// (created 0700); an empty dir keeps records in memory, with a request key
// that lasts as long as the process. Records are kept until
// [IdempotencyStore.Prune] removes them. The request key is read from
// dir/[RequestKeyFile], or made (32 bytes from crypto/rand) and written there
// exclusively (temp file, fsync, hard link, so two processes opening one new
// directory agree on one key) when the file is missing. Errors: the directory
// or the key file cannot be made or read; wrapping [ErrInsecureKeyFile].
func OpenIdempotencyStore(dir string) (*IdempotencyStore, error) {
	var mac []byte
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("idempotency store: %w", err)
		}
		k, err := loadOrCreateRequestKey(filepath.Join(dir, RequestKeyFile))
		if err != nil {
			return nil, fmt.Errorf("idempotency store: %w", err)
		}
		mac = k
	} else {
		mac = make([]byte, 32)
		if _, err := rand.Read(mac); err != nil {
			return nil, fmt.Errorf("idempotency store: request key: %w", err)
		}
	}
	return &IdempotencyStore{dir: dir, mac: mac, records: map[string]*idemRecord{}, inflight: map[string]chan struct{}{}}, nil
}

// loadOrCreateRequestKey returns the key in path, making it first when the
// file does not exist.
func loadOrCreateRequestKey(path string) ([]byte, error) {
	for range 3 {
		k, err := readRequestKey(path)
		if !errors.Is(err, os.ErrNotExist) {
			return k, err
		}
		k = make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("request key: %w", err)
		}
		err = createExclusive(path, []byte(hex.EncodeToString(k)+"\n"))
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("request key: %w", err)
		}
		// Another process made it first: read its key.
	}
	return nil, fmt.Errorf("request key %s: it keeps appearing and disappearing", path)
}

// readRequestKey reads the key in path, refusing a file that is not private.
func readRequestKey(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("request key %s (mode %v): %w", path, fi.Mode(), ErrInsecureKeyFile)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("request key: %w", err)
	}
	k, err := hex.DecodeString(string(bytes.TrimSuffix(raw, []byte("\n"))))
	if err != nil || len(k) != 32 {
		return nil, fmt.Errorf("request key %s: %w", path, ErrInsecureKeyFile)
	}
	return k, nil
}

// createExclusive writes raw to path (0600) unless path exists (an error
// wrapping os.ErrExist): temp file, fsync, hard link, fsync of the directory.
func createExclusive(path string, raw []byte) error { return writeDurable(path, raw, os.Link) }

// requestDigest is what a record stores to recognise the request whose JSON
// form is raw: "hmac-sha256:" and the hex HMAC-SHA256 of raw under the
// store's key.
func (s *IdempotencyStore) requestDigest(raw []byte) string {
	m := hmac.New(sha256.New, s.mac)
	m.Write(raw)
	return macPrefix + hex.EncodeToString(m.Sum(nil))
}

// sameRequest reports whether rec was recorded for the request whose JSON
// form is raw, and whether rec is of the older form that holds the plain
// SHA-256 of the request (still recognised, and to be rewritten).
func (s *IdempotencyStore) sameRequest(rec *idemRecord, raw []byte) (same, legacy bool) {
	if strings.HasPrefix(rec.RequestDigest, macPrefix) {
		return hmac.Equal([]byte(rec.RequestDigest), []byte(s.requestDigest(raw))), false
	}
	sum := sha256.Sum256(raw)
	return hmac.Equal([]byte(rec.RequestDigest), []byte(hex.EncodeToString(sum[:]))), true
}

// Do returns the result recorded for key, with replayed true, or runs fn and
// records its result when fn succeeds (a failed fn records nothing, so the
// key can be retried). The same key with a request whose JSON form differs
// returns an error of code idempotency_key_reused. A concurrent call with the
// same key waits for the first (or for ctx). T must survive a JSON round trip.
//
// A record written by an earlier version, holding the plain SHA-256 of its
// request, is still recognised; when its request comes again it is rewritten
// in the keyed form (a failed rewrite is retried at the next replay). A
// record made under another request key (the key file was deleted) matches no
// request and is refused as reused, never replayed for the wrong request.
func Do[T any](ctx context.Context, s *IdempotencyStore, key string, request any, fn func() (T, error)) (result T, replayed bool, err error) {
	var zero T
	reqRaw, err := json.Marshal(request)
	if err != nil {
		return zero, false, fmt.Errorf("idempotency store: encode request: %w", err)
	}
	digest := s.requestDigest(reqRaw)
	for {
		s.mu.Lock()
		rec, err := s.loadLocked(key)
		if err != nil {
			s.mu.Unlock()
			return zero, false, err
		}
		if rec != nil {
			same, legacy := s.sameRequest(rec, reqRaw)
			if same && legacy {
				s.upgradeLocked(rec, digest)
			}
			s.mu.Unlock()
			if !same {
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

// upgradeLocked rewrites rec, of the plain-digest form, with digest, the keyed
// digest of the same request; on a failed write the file keeps the old form
// and the next replay tries again. mu must be held.
func (s *IdempotencyStore) upgradeLocked(rec *idemRecord, digest string) {
	next := *rec
	next.RequestDigest = digest
	if s.dir != "" {
		body, _ := json.Marshal(&next) // plain struct: cannot fail
		if writeFileAtomic(filepath.Join(s.dir, fileName(rec.Key)), body) != nil {
			return
		}
	}
	s.records[rec.Key] = &next
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
		if !strings.HasSuffix(e.Name(), ".json") {
			continue // the request key, temp files
		}
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
