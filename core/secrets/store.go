package secrets

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// Collections of this package. Documents are read by _id only on hot paths: a secret's _id is
// [DocID] of its project id and name, a set's likewise.
const (
	Collection         = "secrets"
	SetsCollection     = "secret_sets"
	RotationCollection = "secret_rotation"
)

// MaxVersions bounds the versions one secret keeps in its document (every version is immutable
// and stays until the secret is deleted): with [MaxValueBytes] values the document stays far
// below MongoDB's 16 MiB.
const MaxVersions = 64

// MaxSetEntries bounds the references of one secret set.
const MaxSetEntries = 64

// Errors of [Store] methods.
var (
	ErrNotFound = errors.New("berth: secret not found")
	// ErrVersionNotFound is returned for a version a secret does not have.
	ErrVersionNotFound = errors.New("berth: secret version not found")
	ErrSetNotFound     = errors.New("berth: secret set not found")
	// ErrConflict is returned when a concurrent writer won the compare-and-set, or an
	// expected revision is stale.
	ErrConflict = errors.New("berth: secret changed concurrently")
	// ErrTooManyVersions is returned by [Store.Put] for a secret that holds MaxVersions.
	ErrTooManyVersions = errors.New("berth: secret has too many versions")
	// ErrInvalid is returned for a name, value or reference that is refused.
	ErrInvalid = errors.New("berth: invalid secret")
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName reports whether s is a valid secret or secret-set name: a DNS label.
func ValidName(s string) bool { return nameRE.MatchString(s) }

var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidKey reports whether s may name the environment variable (or file) a secret is mapped to:
// a shell identifier of at most 128 characters that does not start with BERTH_.
func ValidKey(s string) bool {
	return envRE.MatchString(s) && !(len(s) >= 6 && s[:6] == "BERTH_")
}

// DocID is the _id of the secret (or set) name of project projectID.
func DocID(projectID, name string) string { return projectID + "/" + name }

// Version is one immutable version of a secret, as stored. Sealed never leaves the store but
// to be opened for a workload (docs/secrets.md section 3).
type Version struct {
	Version   int       `bson:"version"`
	CreatedAt time.Time `bson:"created_at"`
	// Author names who wrote it: the principal's kind and id ("machine:tok_...").
	Author string `bson:"author"`
	// Digest is the keyed digest of the value ([Keyring.Digest]).
	Digest string `bson:"digest"`
	Sealed Sealed `bson:"sealed"`
}

// Secret is a document of collection "secrets". Revision increases on every write, the
// compare-and-set guard. A deleted secret stays as a tombstone without versions, so that its
// deletion is one write carrying its change-log entry and a secret made again under the name
// keeps counting versions from Latest.
type Secret struct {
	ID        string    `bson:"_id"`
	ProjectID string    `bson:"project_id"`
	Project   string    `bson:"project"`
	Name      string    `bson:"name"`
	Revision  int64     `bson:"revision"`
	Latest    int       `bson:"latest"`
	Deleted   bool      `bson:"deleted,omitempty"`
	Versions  []Version `bson:"versions"`
	CreatedAt time.Time `bson:"created_at"`
	UpdatedAt time.Time `bson:"updated_at"`
	// LogOutbox holds the secret's changes not yet in the change log (names and versions
	// only), written in the same compare-and-set as the change.
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty"`
}

// Current returns the newest version, or nil for a deleted secret.
func (s *Secret) Current() *Version {
	if len(s.Versions) == 0 {
		return nil
	}
	return &s.Versions[len(s.Versions)-1]
}

// Find returns version v (0: the current one) or nil.
func (s *Secret) Find(v int) *Version {
	if v == 0 {
		return s.Current()
	}
	for i := range s.Versions {
		if s.Versions[i].Version == v {
			return &s.Versions[i]
		}
	}
	return nil
}

// binding is the envelope binding of version v of s.
func (s *Secret) binding(v int) Binding {
	return Binding{ProjectID: s.ProjectID, Owner: OwnerProject, Name: s.Name, Version: v}
}

// logView is what the change log records of a secret: names, versions, times and authors,
// never a value, digest or ciphertext.
type logView struct {
	Project  string           `json:"project"`
	Name     string           `json:"name"`
	Versions []logViewVersion `json:"versions"`
	Deleted  bool             `json:"deleted,omitempty"`
}

type logViewVersion struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	Author    string    `json:"author"`
}

func secretLogView(s *Secret) logView {
	v := logView{Project: s.Project, Name: s.Name, Deleted: s.Deleted, Versions: []logViewVersion{}}
	for _, x := range s.Versions {
		v.Versions = append(v.Versions, logViewVersion{Version: x.Version, CreatedAt: x.CreatedAt, Author: x.Author})
	}
	return v
}

// Ref is one reference to a secret: its name, a pinned version (0: the current one) and how it
// reaches the workload ("env", also when empty, or "file").
type Ref struct {
	Secret  string `bson:"secret" json:"secret"`
	Version int    `bson:"version,omitempty" json:"version,omitempty"`
	As      string `bson:"as,omitempty" json:"as,omitempty"`
}

// Delivery modes of a [Ref].
const (
	AsEnv  = "env"
	AsFile = "file"
	// AsRegistry: the value ("user:password") pulls the service's image from the registry
	// whose host the key names (docs/registry.md section 9).
	AsRegistry = "registry"
)

// Validate checks r's fields (not that the secret exists). Errors wrap [ErrInvalid].
func (r Ref) Validate(key string) error {
	switch {
	case r.As == AsRegistry && !validRegistryHost(key):
		return fmt.Errorf("%w: %q is not a registry host (host[:port], lower case)", ErrInvalid, key)
	case r.As != AsRegistry && !ValidKey(key):
		return fmt.Errorf("%w: %q is not an environment variable name (letters, digits and _, not starting with a digit or BERTH_)", ErrInvalid, key)
	case !ValidName(r.Secret):
		return fmt.Errorf("%w: %s names secret %q, which is not a valid name", ErrInvalid, key, r.Secret)
	case r.Version < 0:
		return fmt.Errorf("%w: %s: version must be 1 or more (or left out for the current one)", ErrInvalid, key)
	case r.As != "" && r.As != AsEnv && r.As != AsFile && r.As != AsRegistry:
		return fmt.Errorf("%w: %s: as must be %q, %q or %q", ErrInvalid, key, AsEnv, AsFile, AsRegistry)
	}
	return nil
}

// registryHostRE is a registry host as image references name it: DNS labels or an IPv4
// address, optionally with a port.
var registryHostRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,5})?$`)

func validRegistryHost(h string) bool { return len(h) <= 253 && registryHostRE.MatchString(h) }

// Set is a document of collection "secret_sets": a named group of references that services
// attach as a whole (`secret_sets: [payments]`). Deleted sets stay as tombstones, like secrets.
type Set struct {
	ID        string         `bson:"_id"`
	ProjectID string         `bson:"project_id"`
	Project   string         `bson:"project"`
	Name      string         `bson:"name"`
	Revision  int64          `bson:"revision"`
	Deleted   bool           `bson:"deleted,omitempty"`
	Secrets   map[string]Ref `bson:"secrets"`
	CreatedAt time.Time      `bson:"created_at"`
	UpdatedAt time.Time      `bson:"updated_at"`
	// LogOutbox: as for [Secret].
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty"`
}

// Store reads and writes secrets and secret sets. It is safe for concurrent use.
type Store struct {
	st       *store.Store
	secrets  *mongo.Collection
	sets     *mongo.Collection
	rotation *mongo.Collection
	kr       *Keyring
	now      func() time.Time
}

// NewStore returns a Store over st sealing under kr. now may be nil (time.Now).
func NewStore(st *store.Store, kr *Keyring, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{st: st, secrets: st.Collection(Collection), sets: st.Collection(SetsCollection), rotation: st.Collection(RotationCollection), kr: kr, now: now}
}

// Keyring returns the keyring the Store seals under.
func (s *Store) Keyring() *Keyring { return s.kr }

// Any reports whether the store holds any secret document (a tombstone counts: its versions
// were sealed once). berthd asks it before it creates a keyring.
func Any(ctx context.Context, st *store.Store) (bool, error) {
	n, err := st.Collection(Collection).CountDocuments(ctx, bson.D{}, options.Count().SetLimit(1))
	if err != nil {
		return false, fmt.Errorf("secrets: count: %w", err)
	}
	return n > 0, nil
}

func logChange(ctx context.Context, entity, id, op string, payload any) (changelog.Pending, bool, error) {
	a, ok := changelog.ActorFrom(ctx)
	if !ok {
		return changelog.Pending{}, false, nil
	}
	p, err := changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey,
		EntityType: entity, EntityID: id, Op: op, Payload: payload})
	if err != nil {
		return changelog.Pending{}, false, fmt.Errorf("%s %s: %w", entity, id, err)
	}
	return p, true, nil
}

// Get returns the secret name of project projectID, tombstones excluded. Errors: wrapping
// [ErrNotFound].
func (s *Store) Get(ctx context.Context, projectID, name string) (*Secret, error) {
	sec, err := s.get(ctx, projectID, name)
	if err == nil && sec.Deleted {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return sec, err
}

// get returns the document, tombstones included.
func (s *Store) get(ctx context.Context, projectID, name string) (*Secret, error) {
	var sec Secret
	err := store.FindByID(ctx, s.secrets, DocID(projectID, name), &sec)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: get %s: %w", name, err)
	}
	return &sec, nil
}

// List returns the project's secrets by name, tombstones excluded (a scan by project_id: a
// read of the API, never a hot path).
func (s *Store) List(ctx context.Context, projectID string) ([]Secret, error) {
	cur, err := s.secrets.Find(ctx, bson.M{"project_id": projectID}, options.Find().SetSort(bson.D{{Key: "name", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("secrets: list: %w", err)
	}
	var all []Secret
	if err := cur.All(ctx, &all); err != nil {
		return nil, fmt.Errorf("secrets: list: %w", err)
	}
	out := []Secret{}
	for _, x := range all {
		if !x.Deleted {
			out = append(out, x)
		}
	}
	return out, nil
}

// Put seals value as a new version of secret name (creating the secret), with one
// compare-and-set (an insert for a new secret) that also carries the change-log entry of the
// change when ctx carries an actor. author names the writer. It returns the secret after the
// write and the new version. A concurrent writer makes it retry (at most 5 rounds). Errors:
// wrapping [ErrInvalid] (name, value size), [ErrTooManyVersions], [ErrConflict],
// changelog.ErrEntryTooLarge.
func (s *Store) Put(ctx context.Context, projectID, project, name string, value []byte, author string) (*Secret, *Version, error) {
	if !ValidName(name) {
		return nil, nil, fmt.Errorf("%w: name %q is not a DNS label", ErrInvalid, name)
	}
	if len(value) > MaxValueBytes {
		return nil, nil, fmt.Errorf("%w: the value is larger than %d bytes", ErrInvalid, MaxValueBytes)
	}
	var sec *Secret
	var v *Version
	err := store.RetryOnConflict(ctx, func() (err error) {
		sec, v, err = s.putOnce(ctx, projectID, project, name, value, author)
		return err
	}, ErrConflict)
	if errors.Is(err, store.ErrRetriesExhausted) {
		return nil, nil, fmt.Errorf("%s kept changing; retry: %w", name, err)
	}
	if err != nil {
		return nil, nil, err
	}
	return sec, v, nil
}

func (s *Store) putOnce(ctx context.Context, projectID, project, name string, value []byte, author string) (*Secret, *Version, error) {
	now := s.now().UTC()
	cur, err := s.get(ctx, projectID, name)
	fresh := errors.Is(err, ErrNotFound)
	if err != nil && !fresh {
		return nil, nil, err
	}
	next := Secret{ID: DocID(projectID, name), ProjectID: projectID, Project: project, Name: name, CreatedAt: now}
	if !fresh {
		next = *cur
		next.Versions = slices.Clone(cur.Versions)
		if cur.Deleted {
			next.Deleted, next.CreatedAt = false, now
		}
	}
	if len(next.Versions) >= MaxVersions {
		return nil, nil, fmt.Errorf("%w: %s holds %d versions; delete it and set it again", ErrTooManyVersions, name, MaxVersions)
	}
	n := next.Latest + 1
	sealed, err := Seal(s.kr, next.binding(n), value)
	if err != nil {
		return nil, nil, err
	}
	ver := Version{Version: n, CreatedAt: now, Author: author, Digest: s.kr.Digest(next.binding(n), value), Sealed: sealed}
	next.Versions = append(next.Versions, ver)
	next.Latest, next.UpdatedAt = n, now
	op := node.OpUpdate
	if fresh || cur.Deleted {
		op = node.OpCreate
	}
	pend, logged, err := logChange(ctx, "secret", next.ID, op, secretLogView(&next))
	if err != nil {
		return nil, nil, err
	}
	if fresh {
		next.Revision = 1
		if logged {
			next.LogOutbox = []changelog.Pending{pend}
		}
		if _, err := s.secrets.InsertOne(ctx, next); err != nil {
			if store.IsDuplicateKey(err) {
				return nil, nil, ErrConflict
			}
			return nil, nil, fmt.Errorf("secrets: put %s: %w", name, err)
		}
		return &next, &ver, nil
	}
	update := bson.M{"$set": bson.M{"latest": n, "deleted": false, "created_at": next.CreatedAt, "updated_at": now, "project": project}, "$push": bson.M{"versions": ver}}
	if logged {
		update["$push"] = bson.M{"versions": ver, changelog.OutboxField: pend}
		next.LogOutbox = append(slices.Clip(next.LogOutbox), pend)
	}
	rev, err := s.st.UpdateIfRevision(ctx, s.secrets, cur.ID, cur.Revision, update)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return nil, nil, ErrConflict
	}
	if err != nil {
		return nil, nil, fmt.Errorf("secrets: put %s: %w", name, err)
	}
	next.Revision = rev
	return &next, &ver, nil
}

// Delete turns secret name into a tombstone (its versions and their ciphertexts dropped) with
// one compare-and-set carrying its change-log entry. expected, when not nil, is the revision
// the caller read. The caller checked that no service uses it. Errors: wrapping [ErrNotFound],
// [ErrConflict].
func (s *Store) Delete(ctx context.Context, projectID, name string, expected *int64) (*Secret, error) {
	cur, err := s.Get(ctx, projectID, name)
	if err != nil {
		return nil, err
	}
	if expected != nil && *expected != cur.Revision {
		return nil, fmt.Errorf("%w: %s is at revision %d, not %d", ErrConflict, name, cur.Revision, *expected)
	}
	next := *cur
	next.Deleted, next.Versions, next.UpdatedAt = true, []Version{}, s.now().UTC()
	update := bson.M{"$set": bson.M{"deleted": true, "versions": bson.A{}, "updated_at": next.UpdatedAt}}
	pend, logged, err := logChange(ctx, "secret", cur.ID, node.OpDelete, secretLogView(&next))
	if err != nil {
		return nil, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
		next.LogOutbox = append(slices.Clip(next.LogOutbox), pend)
	}
	rev, err := s.st.UpdateIfRevision(ctx, s.secrets, cur.ID, cur.Revision, update)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrConflict, name)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: delete %s: %w", name, err)
	}
	next.Revision = rev
	return &next, nil
}

// Resolve returns which version a reference to secret name at version (0: current) means now.
// Errors: wrapping [ErrNotFound], [ErrVersionNotFound].
func (s *Store) Resolve(ctx context.Context, projectID, name string, version int) (*Secret, *Version, error) {
	sec, err := s.Get(ctx, projectID, name)
	if err != nil {
		return nil, nil, err
	}
	v := sec.Find(version)
	if v == nil {
		return nil, nil, fmt.Errorf("%w: %s has no version %d", ErrVersionNotFound, name, version)
	}
	return sec, v, nil
}

// Open returns the value of version v of secret sec, for sealing to a node. Errors: those of
// the package-level [Open], which fail closed.
func (s *Store) Open(sec *Secret, v *Version) ([]byte, error) {
	return Open(s.kr, sec.binding(v.Version), v.Sealed)
}

// EnvSafe reports whether the value of version v of secret sec can be delivered as an
// environment variable ([node.EnvSafe]: UTF-8 text without a NUL byte; a file carries any
// bytes). It opens the value and clears it at once. Errors: those of [Store.Open].
func (s *Store) EnvSafe(sec *Secret, v *Version) (bool, error) {
	value, err := s.Open(sec, v)
	if err != nil {
		return false, err
	}
	defer clear(value)
	return node.EnvSafe(value), nil
}
