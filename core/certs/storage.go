package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// StorageCollection holds certmagic's files, one document per key:
// {_id: key, sealed: {kek_id, wrapped_key, ciphertext}, size, modified}
// (docs/certificates.md section 3). Every value, certificates and account
// and private keys alike, is sealed under the secrets keyring and bound to
// its key, so a value copied to another key does not open.
const StorageCollection = "cert_storage"

// sealOwner and sealProject bind sealed storage values apart from secrets.
const (
	sealProject = "berth.certs"
	sealOwner   = "certmagic"
)

// Storage is a [certmagic.Storage] over the store: values in
// [StorageCollection], locks through [Locks]. Safe for concurrent use.
type Storage struct {
	coll *mongo.Collection
	kr   *secrets.Keyring
	log  *slog.Logger
	now  func() time.Time
	*Locks
}

var (
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
	_ secrets.SealedSet          = (*Storage)(nil)
)

type storageDoc struct {
	ID       string         `bson:"_id"`
	Sealed   secrets.Sealed `bson:"sealed"`
	Size     int64          `bson:"size"`
	Modified time.Time      `bson:"modified"`
}

// NewStorage returns a Storage over st whose values are sealed with kr and
// whose locks are taken by locks (nil when only [Storage.RewrapTo] is used,
// as a keyring rotation does). It does no I/O.
func NewStorage(st *store.Store, kr *secrets.Keyring, locks *Locks, log *slog.Logger, now func() time.Time) *Storage {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	return &Storage{coll: st.Collection(StorageCollection), kr: kr, log: log, now: now, Locks: locks}
}

func binding(key string) secrets.Binding {
	return secrets.Binding{ProjectID: sealProject, Owner: sealOwner, Name: key, Version: 1}
}

// Store seals value and writes it at key, replacing what was there (one
// upsert by _id).
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	sealed, err := secrets.Seal(s.kr, binding(key), value)
	if err != nil {
		return fmt.Errorf("certs: seal %s: %w", key, err)
	}
	d := storageDoc{ID: key, Sealed: sealed, Size: int64(len(value)), Modified: s.now().UTC()}
	if _, err := s.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: key}}, d, options.Replace().SetUpsert(true)); err != nil {
		return fmt.Errorf("certs: store %s: %w", key, err)
	}
	return nil
}

// Load returns the value at key. A missing key wraps [fs.ErrNotExist], as
// certmagic expects. A value that does not open under the keyring (sealed
// under a retired key, or changed) is logged and reported missing too, so
// certmagic obtains a new certificate or account instead of using it.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	var d storageDoc
	if err := store.FindByID(ctx, s.coll, key, &d); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("certs: load %s: %w", key, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("certs: load %s: %w", key, err)
	}
	v, err := secrets.Open(s.kr, binding(key), d.Sealed)
	if err != nil {
		s.log.Warn("stored certificate value does not open; treating it as missing", "key", key, "error", err)
		return nil, fmt.Errorf("certs: load %s: %w: %w", key, fs.ErrNotExist, err)
	}
	return v, nil
}

// prefixFilter matches every key under dir ("dir/...").
func prefixFilter(dir string) bson.D {
	return bson.D{{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(strings.TrimSuffix(dir, "/")+"/")}}}}
}

// Delete removes key and every key under it as a directory. A missing key is
// not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	if _, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}}); err != nil {
		return fmt.Errorf("certs: delete %s: %w", key, err)
	}
	if _, err := s.coll.DeleteMany(ctx, prefixFilter(key)); err != nil {
		return fmt.Errorf("certs: delete under %s: %w", key, err)
	}
	return nil
}

// Exists reports whether key is stored as a value or as a directory (a
// prefix of stored keys); a read error counts as absent.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// listAll returns every key under dir (scans the collection: used only by
// certmagic's rare listings, never on a hot path).
func (s *Storage) listAll(ctx context.Context, dir string) ([]string, error) {
	cur, err := s.coll.Find(ctx, prefixFilter(dir), options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("certs: list %s: %w", dir, err)
	}
	var ids []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &ids); err != nil {
		return nil, fmt.Errorf("certs: list %s: %w", dir, err)
	}
	out := make([]string, 0, len(ids))
	for _, d := range ids {
		out = append(out, d.ID)
	}
	sort.Strings(out)
	return out, nil
}

// List returns the keys under dir: all of them when recursive, else only
// its direct children (a child directory listed once). An empty directory
// wraps [fs.ErrNotExist].
func (s *Storage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	all, err := s.listAll(ctx, dir)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("certs: list %s: %w", dir, fs.ErrNotExist)
	}
	if recursive {
		return all, nil
	}
	base := strings.TrimSuffix(dir, "/") + "/"
	seen := map[string]bool{}
	var out []string
	for _, k := range all {
		child, _, _ := strings.Cut(strings.TrimPrefix(k, base), "/")
		if !seen[child] {
			seen[child] = true
			out = append(out, base+child)
		}
	}
	return out, nil
}

// Stat describes key: a stored value (terminal, with size and modification
// time) or a directory of stored keys. Neither wraps [fs.ErrNotExist].
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	var d storageDoc
	err := store.FindByID(ctx, s.coll, key, &d)
	if err == nil {
		return certmagic.KeyInfo{Key: key, Modified: d.Modified, Size: d.Size, IsTerminal: true}, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return certmagic.KeyInfo{}, fmt.Errorf("certs: stat %s: %w", key, err)
	}
	n, err := s.coll.CountDocuments(ctx, prefixFilter(key), options.Count().SetLimit(1))
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("certs: stat %s: %w", key, err)
	}
	if n == 0 {
		return certmagic.KeyInfo{}, fmt.Errorf("certs: stat %s: %w", key, fs.ErrNotExist)
	}
	return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
}

// Name names the storage in a keyring rotation's logs ([secrets.SealedSet]).
func (s *Storage) Name() string { return "certificates" }

// RewrapTo moves every stored value whose data key is not wrapped by kekID to
// the keyring's active KEK, for a keyring rotation ([secrets.SealedSet],
// docs/certificates.md section 3, docs/secrets.md section 4). It lists the
// keys to move (a scan of [StorageCollection]: an administrative path), then
// for each one re-reads it by _id and writes the re-wrapped data key with one
// compare-and-set on the sealed value it read, calling pace before each write;
// the ciphertext is not touched, so the value is the same. A value certmagic
// replaced meanwhile (sealed under the active KEK already) or deleted is left
// alone. Values that do not open under the keyring (changed, or sealed under a
// key retired before certificates were re-wrapped) are not written and are
// returned by key: [Storage.Load] reports them missing already, and certmagic
// obtains them again. Idempotent; a run that stopped part-way is finished by
// the next. Errors: the store failed, or pace returned an error.
func (s *Storage) RewrapTo(ctx context.Context, kekID string, pace func(context.Context) error) (moved int, unopenable []string, err error) {
	cur, err := s.coll.Find(ctx, bson.D{{Key: "sealed.kek_id", Value: bson.D{{Key: "$ne", Value: kekID}}}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return 0, nil, fmt.Errorf("certs: re-wrap: list: %w", err)
	}
	var ids []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &ids); err != nil {
		return 0, nil, fmt.Errorf("certs: re-wrap: list: %w", err)
	}
	for _, x := range ids {
		ok, err := s.rewrapOne(ctx, x.ID, kekID, pace)
		switch {
		case errors.Is(err, secrets.ErrOpenFailed), errors.Is(err, secrets.ErrUnknownKEK):
			unopenable = append(unopenable, x.ID)
		case err != nil:
			return moved, unopenable, err
		case ok:
			moved++
		}
	}
	return moved, unopenable, nil
}

// rewrapOne re-wraps the value at key unless it is under kekID already, with
// one compare-and-set on the sealed value read (re-read and retried when it
// changed meanwhile, as [store.RetryOnConflict] says). It reports whether it wrote. Errors:
// wrapping [secrets.ErrOpenFailed] or [secrets.ErrUnknownKEK] when the value
// does not open (changed, or under a key retired before); the store's.
func (s *Storage) rewrapOne(ctx context.Context, key, kekID string, pace func(context.Context) error) (bool, error) {
	wrote := false
	err := store.RetryOnConflict(ctx, func() error {
		var d storageDoc
		err := store.FindByID(ctx, s.coll, key, &d)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("certs: re-wrap %s: %w", key, err)
		}
		if d.Sealed.KEKID == kekID {
			return nil
		}
		w, err := secrets.Rewrap(s.kr, binding(key), d.Sealed)
		if err != nil {
			return fmt.Errorf("certs: re-wrap %s: %w", key, err)
		}
		if w.KEKID != kekID {
			return fmt.Errorf("certs: re-wrap %s: the keyring's active key is %s, not %s", key, w.KEKID, kekID)
		}
		if pace != nil {
			if err := pace(ctx); err != nil {
				return err
			}
		}
		res, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: key},
			{Key: "sealed.kek_id", Value: d.Sealed.KEKID}, {Key: "sealed.wrapped_key", Value: d.Sealed.WrappedKey}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "sealed", Value: w}}}})
		if err != nil {
			return fmt.Errorf("certs: re-wrap %s: %w", key, err)
		}
		if res.MatchedCount != 1 {
			return fmt.Errorf("certs: re-wrap %s: changed meanwhile: %w", key, store.ErrConflict)
		}
		wrote = true
		return nil
	})
	return wrote, err
}

// String names the storage in certmagic's logs.
func (s *Storage) String() string { return "berth-store:" + StorageCollection }
