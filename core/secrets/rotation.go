package secrets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
)

// Rotation states.
const (
	RotationRunning = "running"
	RotationDone    = "done"
)

// rotationID is the _id of the one document of RotationCollection.
const rotationID = "current"

// ErrRotationRunning is returned by [Store.StartRotation] while a re-wrap has not finished.
var ErrRotationRunning = errors.New("berth: a keyring rotation is still re-wrapping")

// Rotation is the progress of the latest keyring rotation, the one document of collection
// "secret_rotation" (docs/secrets.md section 4). It is written before the re-wrap starts and
// after every secret it re-wrapped, so a berthd killed at any point resumes after the last
// secret it recorded (re-wrapping one twice is harmless: a version under the target KEK is left
// as it is).
type Rotation struct {
	ID       string `bson:"_id" json:"-"`
	Revision int64  `bson:"revision" json:"-"`
	State    string `bson:"state" json:"state"`
	// TargetKEK is the KEK every data key is being re-wrapped by (the active one).
	TargetKEK string `bson:"target_kek" json:"target_kek"`
	// RetireOld asks that every other KEK be retired once nothing is wrapped by it.
	RetireOld bool `bson:"retire_old" json:"retire_old"`
	// Cursor is the _id of the last secret re-wrapped, in _id order; "" before the first.
	Cursor string `bson:"cursor" json:"-"`
	// Secrets counts the secret documents done, Rewrapped the versions whose data key moved.
	Secrets    int        `bson:"secrets" json:"secrets"`
	Rewrapped  int        `bson:"rewrapped" json:"rewrapped"`
	Retired    []string   `bson:"retired,omitempty" json:"retired,omitempty"`
	StartedAt  time.Time  `bson:"started_at" json:"started_at"`
	FinishedAt *time.Time `bson:"finished_at,omitempty" json:"finished_at,omitempty"`
}

// RotationStatus returns the latest rotation, or nil when there was none.
func (s *Store) RotationStatus(ctx context.Context) (*Rotation, error) {
	var r Rotation
	err := store.FindByID(ctx, s.rotation, rotationID, &r)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: read rotation: %w", err)
	}
	return &r, nil
}

// writeRotation stores r as the rotation record, replacing prev (nil: none stored) with a
// compare-and-set on its revision. Errors: wrapping [ErrRotationRunning] when another writer
// won.
func (s *Store) writeRotation(ctx context.Context, prev *Rotation, r *Rotation) error {
	r.ID = rotationID
	if prev == nil {
		r.Revision = 1
		if _, err := s.rotation.InsertOne(ctx, r); err != nil {
			if store.IsDuplicateKey(err) {
				return fmt.Errorf("%w: the rotation record changed", ErrRotationRunning)
			}
			return fmt.Errorf("secrets: write rotation: %w", err)
		}
		return nil
	}
	set := bson.M{"state": r.State, "target_kek": r.TargetKEK, "retire_old": r.RetireOld, "cursor": r.Cursor, "secrets": r.Secrets,
		"rewrapped": r.Rewrapped, "retired": r.Retired, "started_at": r.StartedAt, "finished_at": r.FinishedAt}
	rev, err := s.st.UpdateIfRevision(ctx, s.rotation, rotationID, prev.Revision, bson.M{"$set": set})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: the rotation record changed", ErrRotationRunning)
	}
	if err != nil {
		return fmt.Errorf("secrets: write rotation: %w", err)
	}
	r.Revision = rev
	return nil
}

// StartRotation adds a KEK to the keyring, makes it active (the file is written first) and
// records a running rotation towards it; [Store.Rewrap] then moves every data key. retireOld
// asks that the other KEKs be retired once nothing is wrapped by them. Errors: wrapping
// [ErrRotationRunning] while a rotation runs; the keyring's write error (nothing changed).
func (s *Store) StartRotation(ctx context.Context, retireOld bool) (*Rotation, error) {
	prev, err := s.RotationStatus(ctx)
	if err != nil {
		return nil, err
	}
	if prev != nil && prev.State == RotationRunning {
		return nil, fmt.Errorf("%w: towards %s, %d secrets done", ErrRotationRunning, prev.TargetKEK, prev.Secrets)
	}
	id, err := s.kr.Rotate()
	if err != nil {
		return nil, err
	}
	// A crash here leaves the keyring rotated without a record: [Store.Rewrap] at the next start
	// sees the record's target differ from the active KEK and starts the re-wrap then.
	r := &Rotation{State: RotationRunning, TargetKEK: id, RetireOld: retireOld, StartedAt: s.now().UTC()}
	if err := s.writeRotation(ctx, prev, r); err != nil {
		return nil, err
	}
	return r, nil
}

// SealedSet is a collection other than secrets whose values are sealed under the keyring (the
// certificates and keys of core/certs), which a rotation re-wraps together with the secrets, so
// that retiring the old KEKs leaves none of them unopenable (docs/secrets.md section 4).
type SealedSet interface {
	// Name names the set in logs ("certificates").
	Name() string
	// RewrapTo moves every stored value whose data key is not wrapped by kekID (the keyring's
	// active KEK) to it, each document with one compare-and-set of its own, calling pace before
	// each write (it returns ctx's error to stop). It returns how many values moved and the
	// keys of values that do not open under the keyring (left as they are: retiring a KEK
	// changes nothing for them). Idempotent: a run stopped at any point is finished by the
	// next, and a value already under kekID is not written. Errors: the store failed, or pace
	// stopped it.
	RewrapTo(ctx context.Context, kekID string, pace func(context.Context) error) (moved int, unopenable []string, err error)
}

// RewrapConfig paces [Store.Rewrap].
type RewrapConfig struct {
	// PerSecond bounds the secret documents re-wrapped per second, leaving the store's
	// compare-and-set capacity to other writers; zero means 100, negative means no bound. The
	// documents of Also share the bound.
	PerSecond int
	Logger    *slog.Logger
	// Also lists the other collections sealed under the keyring; each is re-wrapped after the
	// secrets in every pass, before any KEK is retired. Nil: secrets only.
	Also []SealedSet
}

// Rewrap runs the rotation the record names to its end: it re-wraps, in _id order from the
// record's cursor, every version whose data key is not wrapped by the target KEK, one
// compare-and-set per secret, recording progress after each; then checks that nothing is
// wrapped by another KEK, retires the others when the rotation asked to, and marks it done.
// berthd runs it in the background at start (resuming a rotation a crash interrupted) and after
// each [Store.StartRotation]. It returns when done, when ctx ends (the record keeps the
// progress), or on an error. A keyring whose active KEK is not the record's target (rotated,
// then killed before the record was written) starts a rotation towards the active KEK. A version
// that does not open is an error naming the secret and version, and the rotation stays running.
// Every pass also re-wraps each of cfg.Also ([SealedSet]) after the secrets; an error there
// stops the run with the rotation running (the next run re-wraps what is left).
func (s *Store) Rewrap(ctx context.Context, cfg RewrapConfig) error {
	if cfg.PerSecond == 0 {
		cfg.PerSecond = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := s.RotationStatus(ctx)
	if err != nil {
		return err
	}
	active := s.kr.ActiveKEK()
	if r == nil || r.TargetKEK != active {
		if r == nil && len(s.kr.KEKs()) == 1 {
			return nil // never rotated: every data key is under the only KEK
		}
		next := &Rotation{State: RotationRunning, TargetKEK: active, StartedAt: s.now().UTC()}
		if err := s.writeRotation(ctx, r, next); err != nil {
			return err
		}
		r = next
	}
	if r.State == RotationDone {
		return nil
	}
	var pace <-chan time.Time
	if cfg.PerSecond > 0 {
		t := time.NewTicker(time.Second / time.Duration(cfg.PerSecond))
		defer t.Stop()
		pace = t.C
	}
	for pass := 0; ; pass++ {
		if err := s.rewrapPass(ctx, r, pace); err != nil {
			return err
		}
		for _, set := range cfg.Also {
			moved, lost, err := set.RewrapTo(ctx, r.TargetKEK, func(ctx context.Context) error {
				if pace == nil {
					return ctx.Err()
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-pace:
					return nil
				}
			})
			if err != nil {
				return fmt.Errorf("secrets: rotation: re-wrap %s: %w", set.Name(), err)
			}
			if len(lost) > 0 {
				cfg.Logger.Warn("keyring rotation: stored values that do not open were left as they are", "set", set.Name(), "keys", lost)
			}
			cfg.Logger.Info("keyring rotation: re-wrapped", "set", set.Name(), "kek_id", r.TargetKEK, "moved", moved)
		}
		left, err := s.WrappedBy(ctx)
		if err != nil {
			return err
		}
		others := 0
		for id, n := range left {
			if id != r.TargetKEK {
				others += n
			}
		}
		if others == 0 {
			break
		}
		if pass >= 2 {
			return fmt.Errorf("secrets: %d versions are still wrapped by older KEKs after %d passes", others, pass+1)
		}
		prev := *r
		r.Cursor = "" // something was missed (a secret written behind the cursor): go again
		if err := s.writeRotation(ctx, &prev, r); err != nil {
			return err
		}
	}
	prev := *r
	if r.RetireOld {
		for _, k := range s.kr.KEKs() {
			if k.ID == r.TargetKEK {
				continue
			}
			if err := s.kr.Retire(k.ID); err != nil {
				return err
			}
			r.Retired = append(r.Retired, k.ID)
			cfg.Logger.Info("key-encryption key retired", "kek_id", k.ID)
		}
	}
	done := s.now().UTC()
	r.State, r.FinishedAt = RotationDone, &done
	if err := s.writeRotation(ctx, &prev, r); err != nil {
		return err
	}
	cfg.Logger.Info("keyring rotation finished", "kek_id", r.TargetKEK, "secrets", r.Secrets, "rewrapped", r.Rewrapped)
	return nil
}

// rewrapPass re-wraps every secret after r.Cursor, updating r and its record as it goes.
func (s *Store) rewrapPass(ctx context.Context, r *Rotation, pace <-chan time.Time) error {
	for range 1 << 20 { // bounded: each round advances the cursor or ends
		cur, err := s.secrets.Find(ctx, bson.M{"_id": bson.M{"$gt": r.Cursor}},
			options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(16).SetProjection(bson.M{"_id": 1}))
		if err != nil {
			return fmt.Errorf("secrets: rotation: list: %w", err)
		}
		var ids []struct {
			ID string `bson:"_id"`
		}
		if err := cur.All(ctx, &ids); err != nil {
			return fmt.Errorf("secrets: rotation: list: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		for _, x := range ids {
			if pace != nil {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-pace:
				}
			}
			n, err := s.rewrapDoc(ctx, x.ID, r.TargetKEK)
			if err != nil {
				return err
			}
			prev := *r
			r.Cursor, r.Secrets, r.Rewrapped = x.ID, r.Secrets+1, r.Rewrapped+n
			if err := s.writeRotation(ctx, &prev, r); err != nil {
				return err
			}
		}
	}
	return errors.New("secrets: rotation: too many rounds")
}

// rewrapDoc re-wraps the versions of secret id not wrapped by target, with one compare-and-set
// (retried on a concurrent write as [store.RetryOnConflict] says), and returns how many it moved.
func (s *Store) rewrapDoc(ctx context.Context, id, target string) (int, error) {
	moved := 0
	err := store.RetryOnConflict(ctx, func() error {
		var sec Secret
		moved = 0
		err := store.FindByID(ctx, s.secrets, id, &sec)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("secrets: rotation: read %s: %w", id, err)
		}
		for i := range sec.Versions {
			v := &sec.Versions[i]
			if v.Sealed.KEKID == target {
				continue
			}
			w, err := Rewrap(s.kr, sec.binding(v.Version), v.Sealed)
			if err != nil {
				return fmt.Errorf("secrets: rotation: %s/%s: %w", sec.Project, sec.Name, err)
			}
			v.Sealed = w
			moved++
		}
		if moved == 0 {
			return nil
		}
		if _, err = s.st.UpdateIfRevision(ctx, s.secrets, id, sec.Revision, bson.M{"$set": bson.M{"versions": sec.Versions}}); err != nil {
			moved = 0
			return fmt.Errorf("secrets: rotation: write %s: %w", id, err)
		}
		return nil
	})
	if errors.Is(err, store.ErrRetriesExhausted) {
		return 0, fmt.Errorf("%w: %s kept changing during the re-wrap: %w", ErrConflict, id, err)
	}
	if err != nil {
		return 0, err
	}
	return moved, nil
}

// WrappedBy counts the stored versions by the KEK their data key is wrapped by (a scan of
// every secret document: for rotation checks and the keyring status, not hot paths).
func (s *Store) WrappedBy(ctx context.Context) (map[string]int, error) {
	cur, err := s.secrets.Find(ctx, bson.D{}, options.Find().SetProjection(bson.M{"versions.sealed.kek_id": 1}))
	if err != nil {
		return nil, fmt.Errorf("secrets: count wrapped keys: %w", err)
	}
	var docs []struct {
		Versions []struct {
			Sealed struct {
				KEKID string `bson:"kek_id"`
			} `bson:"sealed"`
		} `bson:"versions"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("secrets: count wrapped keys: %w", err)
	}
	out := map[string]int{}
	for _, d := range docs {
		for _, v := range d.Versions {
			out[v.Sealed.KEKID]++
		}
	}
	return out, nil
}
