package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/securefile"
)

// Collections of the identity package. Every lookup on a request's path is by _id: tokens by
// digest, users and token names by name.
const (
	TokensCollection     = "tokens"      // one record per bearer (machine token or session), _id = digest
	TokenNamesCollection = "token_names" // one record per named machine token, _id = name
	UsersCollection      = "users"       // one record per user, _id = name
	MetaCollection       = "identity_meta"
)

// AdminTokenFile is the file under the data directory where [Tokens.EnsureAdmin] keeps the
// bootstrap admin token (0600).
const AdminTokenFile = "admin-token"

// BootstrapTokenName is the name of the bootstrap admin token in token lists.
const BootstrapTokenName = "bootstrap"

// LastUsedEvery is how often at most the last use of one token is written to the store.
const LastUsedEvery = time.Minute

var (
	// ErrUnauthenticated is returned by [Tokens.Authenticate] and [Tokens.Login] for every
	// credential failure (malformed, unknown, expired, revoked, wrong password, stale
	// generation), with no hint which one; details stay server-side.
	ErrUnauthenticated = errors.New("berth: unauthenticated")
	// ErrHumanOnlyScope is returned (wrapped) by [Tokens.Create] when a machine or node token is
	// asked to hold a human-only scope.
	ErrHumanOnlyScope = errors.New("berth: scope may only be held by a human")
	// ErrInvalid is returned (wrapped) for a refused value: a bad name, role, scope, bound or
	// lifetime. The message says which.
	ErrInvalid = errors.New("berth: invalid identity request")
	// ErrExists is returned (wrapped) when a user or token name is taken.
	ErrExists = errors.New("berth: name taken")
)

// tokenRecord is the stored form of a bearer. The bearer itself is never stored.
type tokenRecord struct {
	Digest    string     `bson:"_id"`
	ID        string     `bson:"id"` // tok_<ULID>; safe to show and log
	Kind      Kind       `bson:"kind"`
	Name      string     `bson:"name"`
	Owner     string     `bson:"owner,omitempty"`
	Scopes    []Scope    `bson:"scopes"`
	Project   string     `bson:"project,omitempty"`
	Service   string     `bson:"service,omitempty"`
	CreatedAt time.Time  `bson:"created_at"`
	ExpiresAt *time.Time `bson:"expires_at,omitempty"`
	RevokedAt *time.Time `bson:"revoked_at,omitempty"`
	LastUsed  *time.Time `bson:"last_used_at,omitempty"`
	// Session holds only for human sessions (prefix brs_): the user's credential generation
	// when the session was opened, and when the password was verified.
	Session    bool      `bson:"session,omitempty"`
	Generation int64     `bson:"generation,omitempty"`
	AuthAt     time.Time `bson:"auth_at,omitzero"`
	// LogOutbox holds the changes of a named machine token's creation and
	// revocation not yet in the change log, written in the same write as
	// each (docs/node-protocol.md section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty"`
}

// Tokens is Berth's identity store: users, their human sessions and machine tokens, all
// stored as digests or verifiers, and the one place every API bearer is checked. Safe for
// concurrent use.
type Tokens struct {
	st     *store.Store
	coll   *mongo.Collection
	names  *mongo.Collection
	users  *mongo.Collection
	meta   *mongo.Collection
	now    func() time.Time
	argon  Argon2Params
	dummy  string // a verifier checked for unknown users, so both answers cost the same
	mu     sync.Mutex
	used   map[string]time.Time   // digest -> last write of last_used_at; mu
	failed map[string][]time.Time // user name -> failed logins in the last minute; mu
	// reserved is, per name in backoff, when the attempt admitted last makes the next one due; mu
	reserved map[string]time.Time
	// verifying counts, per name, the attempts admitted and not yet finished; mu. They count
	// as failures when the next attempt is admitted, so parallel guesses get no more than
	// sequential ones.
	verifying map[string]int
	// verifySlots holds one value per password verification running; its capacity bounds them.
	verifySlots chan struct{}
	verifyHook  func(ctx context.Context) // run while a verification holds its slot; tests only
	// adminFile is the admin-token file [Tokens.EnsureAdmin] keeps, once it ran; mu.
	adminFile string
	// fileMu orders rewrites of adminFile.
	fileMu sync.Mutex
}

// TokensOption configures [NewTokens].
type TokensOption func(*Tokens)

// WithClock makes Tokens read the time from now instead of time.Now (creation and expiry).
func WithClock(now func() time.Time) TokensOption {
	return func(t *Tokens) { t.now = now }
}

// WithArgon2Params replaces [DefaultArgon2Params] for new verifiers (tests use cheap ones).
func WithArgon2Params(p Argon2Params) TokensOption {
	return func(t *Tokens) { t.argon = p }
}

// WithLoginConcurrency bounds how many password verifications [Tokens.Login] runs at once
// (each argon2id verification holds [DefaultArgon2Params] memory, 64 MiB); n <= 0 means
// [MinLoginConcurrency]. [LoginConcurrencyFor] sizes it from the memory of the machine.
func WithLoginConcurrency(n int) TokensOption {
	return func(t *Tokens) { t.verifySlots = make(chan struct{}, max(n, MinLoginConcurrency)) }
}

// WithVerifyHookForTest makes every password verification of [Tokens.Login] call hook while it
// holds its slot, before it verifies, so a test can count and hold verifications.
func WithVerifyHookForTest(hook func(ctx context.Context)) TokensOption {
	return func(t *Tokens) { t.verifyHook = hook }
}

// NewTokens returns a Tokens over s's identity collections. It does no I/O apart from hashing
// one dummy password.
func NewTokens(s *store.Store, opts ...TokensOption) *Tokens {
	t := &Tokens{
		st: s, coll: s.Collection(TokensCollection), names: s.Collection(TokenNamesCollection),
		users: s.Collection(UsersCollection), meta: s.Collection(MetaCollection),
		now: time.Now, argon: DefaultArgon2Params,
		used: map[string]time.Time{}, failed: map[string][]time.Time{}, reserved: map[string]time.Time{},
		verifying: map[string]int{},
	}
	for _, o := range opts {
		o(t)
	}
	if t.verifySlots == nil {
		t.verifySlots = make(chan struct{}, MinLoginConcurrency)
	}
	t.dummy, _ = HashPassword("berth dummy password for unknown users", t.argon)
	return t
}

// Create makes a new unnamed token of the given kind (KindAdmin, KindMachine or KindHuman),
// stores its digest and returns the token, which cannot be recovered later. ttl > 0 sets an
// expiry; 0 means none; negative is refused. Named, bounded machine tokens are made with
// [Tokens.CreateMachine].
//
// Errors: wrapping [ErrHumanOnlyScope] when kind is KindMachine and scopes hold a human-only
// scope; wrapping [ErrInvalid] for an unknown scope, a KindNode (node credentials live with
// node records) or a negative ttl; a store failure.
func (t *Tokens) Create(ctx context.Context, kind Kind, name string, scopes []Scope, ttl time.Duration) (token string, err error) {
	switch kind {
	case KindAdmin, KindMachine, KindHuman:
	default:
		return "", fmt.Errorf("identity: create token %q: kind %q cannot hold an API token: %w", name, kind, ErrInvalid)
	}
	if ttl < 0 {
		return "", fmt.Errorf("identity: create token %q: negative ttl %v: %w", name, ttl, ErrInvalid)
	}
	if err := checkScopes(kind, scopes); err != nil {
		return "", fmt.Errorf("identity: create token %q: %w", name, err)
	}
	rec, token, err := t.newRecord(PrefixToken, kind, name, scopes, ttl)
	if err != nil {
		return "", err
	}
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return "", fmt.Errorf("identity: store token %s: %w", rec.ID, err)
	}
	return token, nil
}

func checkScopes(kind Kind, scopes []Scope) error {
	for _, s := range scopes {
		if !Known(s) {
			return fmt.Errorf("unknown scope %q: %w", s, ErrInvalid)
		}
		if HumanOnly(s) && !kind.mayHoldHumanOnly() {
			return fmt.Errorf("%s token with scope %q: %w", kind, s, ErrHumanOnlyScope)
		}
	}
	return nil
}

func (t *Tokens) newRecord(prefix string, kind Kind, name string, scopes []Scope, ttl time.Duration) (tokenRecord, string, error) {
	token, digest, err := NewToken(prefix)
	if err != nil {
		return tokenRecord{}, "", err
	}
	now := t.now().UTC()
	rec := tokenRecord{
		Digest: digest, ID: NewID(IDPrefixToken), Kind: kind, Name: name,
		Scopes: append([]Scope{}, scopes...), CreatedAt: now,
	}
	if ttl > 0 {
		exp := now.Add(ttl)
		rec.ExpiresAt = &exp
	}
	return rec, token, nil
}

// Authenticate returns the principal of an API bearer: a machine or admin token (brt_) or a
// human session (brs_). Every credential failure (malformed, unknown, expired, revoked, a
// session of an older credential generation or of a removed user) returns exactly
// [ErrUnauthenticated]; a store failure returns a wrapped store error (never containing the
// token), which callers report as unavailable. Nothing is cached: the token record, and for a
// session the user record, are read on every call (by _id). The last use is written at most
// once per [LastUsedEvery] per token.
func (t *Tokens) Authenticate(ctx context.Context, token string) (*Principal, error) {
	session := WellFormed(token, PrefixSession)
	if !session && !WellFormed(token, PrefixToken) {
		return nil, ErrUnauthenticated
	}
	digest := Digest(token)
	rec, err := t.find(ctx, digest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("identity: authenticate: %w", err)
	}
	if !Equal(rec.Digest, digest) || rec.Session != session {
		return nil, ErrUnauthenticated
	}
	p, err := t.principal(ctx, rec, t.user)
	if err != nil {
		return nil, err
	}
	t.touch(ctx, rec.Digest)
	return p, nil
}

// Recheck answers, for the bearer whose [Digest] is digest, what [Tokens.Authenticate] would
// answer for the bearer itself now: its principal while it is usable, exactly
// [ErrUnauthenticated] once it is unknown, revoked, rotated away or expired, or, for a
// session, once its user is removed or the user's credential generation moved on (password
// rotated, sessions revoked). Roles changed since are reflected in the principal's scopes.
//
// It serves checks repeated on every request by something that authenticated the bearer once
// and keeps only its digest (the registry's short bearers, docs/registry.md section 3): the
// token and user records are read from the store's read view, so with the view on a call is a
// map lookup and a decode, plus one read by _id after the record was written; with it off,
// one or two reads by _id. It never writes (the last use is not recorded). A store failure
// returns a wrapped store error, never the digest.
func (t *Tokens) Recheck(ctx context.Context, digest string) (*Principal, error) {
	var rec tokenRecord
	err := t.st.View().Get(ctx, t.coll, digest, &rec)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("identity: recheck token: %w", err)
	}
	if !Equal(rec.Digest, digest) {
		return nil, ErrUnauthenticated
	}
	return t.principal(ctx, rec, func(ctx context.Context, name string) (userRecord, error) {
		var u userRecord
		if name == "" {
			return u, fmt.Errorf("identity: user: %w", store.ErrNotFound)
		}
		err := t.st.View().Get(ctx, t.users, name, &u)
		return u, err
	})
}

// principal is the principal of the token record rec when it is usable now, reading its owner
// with user: exactly [ErrUnauthenticated] for a revoked or expired record, a session whose user
// is gone or of another credential generation, or a machine token whose owner is gone. A
// session holds its user's roles; a machine token of an owner holds the scopes both it and its
// owner's current roles hold (docs/api.md section 9.3), read on every call.
func (t *Tokens) principal(ctx context.Context, rec tokenRecord, user func(context.Context, string) (userRecord, error)) (*Principal, error) {
	if !t.usable(rec) {
		return nil, ErrUnauthenticated
	}
	p := &Principal{Kind: rec.Kind, ID: rec.ID, Name: rec.Name, Owner: rec.Owner, Scopes: rec.Scopes,
		Project: rec.Project, Service: rec.Service, ExpiresAt: rec.ExpiresAt}
	if rec.Session {
		u, err := user(ctx, rec.Owner)
		if errors.Is(err, store.ErrNotFound) {
			return nil, ErrUnauthenticated
		}
		if err != nil {
			return nil, fmt.Errorf("identity: authenticate: %w", err)
		}
		if u.Kind != KindHuman || u.Generation != rec.Generation {
			return nil, ErrUnauthenticated
		}
		p.Kind, p.AuthAt = KindHuman, rec.AuthAt
		p.Scopes, p.Grants = u.scopes()
		return p, nil
	}
	if rec.Kind != KindMachine || rec.Owner == "" {
		return p, nil // the bootstrap token stands for the holder of the data directory
	}
	// A machine token acts with what it holds that its owner's roles also give now.
	u, err := user(ctx, rec.Owner)
	switch {
	case errors.Is(err, store.ErrNotFound) && rec.Owner == BootstrapTokenName:
		// Minted by the bootstrap token before there was a bootstrap admin: its owner is the
		// bootstrap token, which holds admin.
		return p, nil
	case errors.Is(err, store.ErrNotFound):
		return nil, ErrUnauthenticated
	case err != nil:
		return nil, fmt.Errorf("identity: authenticate: %w", err)
	}
	global, grants := u.scopes()
	if rec.Project != "" {
		p.Scopes = intersectScopes(rec.Scopes, append(global, grants[rec.Project]...))
		return p, nil
	}
	p.Scopes = intersectScopes(rec.Scopes, global)
	for project, g := range grants {
		if in := intersectScopes(rec.Scopes, g); len(in) > 0 {
			if p.Grants == nil {
				p.Grants = map[string][]Scope{}
			}
			p.Grants[project] = in
		}
	}
	return p, nil
}

// touch records the last use of the token with this digest, at most once per LastUsedEvery;
// a failed write is retried on a later use and never fails the request.
func (t *Tokens) touch(ctx context.Context, digest string) {
	now := t.now().UTC()
	t.mu.Lock()
	last, ok := t.used[digest]
	due := !ok || now.Sub(last) >= LastUsedEvery
	if due {
		if len(t.used) > 100_000 {
			clear(t.used)
		}
		t.used[digest] = now
	}
	t.mu.Unlock()
	if !due {
		return
	}
	if _, err := t.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: digest}}, bson.M{"$max": bson.M{"last_used_at": now}}); err != nil {
		t.mu.Lock()
		delete(t.used, digest)
		t.mu.Unlock()
	}
}

func (t *Tokens) find(ctx context.Context, digest string) (tokenRecord, error) {
	var rec tokenRecord
	err := store.FindByID(ctx, t.coll, digest, &rec)
	return rec, err
}

// usable reports whether rec is neither revoked nor expired and has a valid kind.
func (t *Tokens) usable(rec tokenRecord) bool {
	if rec.RevokedAt != nil || !rec.Kind.Valid() || rec.Kind == KindNode {
		return false
	}
	return rec.ExpiresAt == nil || t.now().Before(*rec.ExpiresAt)
}

// Revoke marks the token with the given id (tok_...) revoked; Authenticate refuses it from then
// on. Revoking a revoked token is a no-op. Returns an error wrapping [store.ErrNotFound] when
// there is no such token. It scans the tokens collection (an administrative path only).
func (t *Tokens) Revoke(ctx context.Context, id string) error {
	res, err := t.coll.UpdateOne(ctx,
		bson.M{"id": id},
		bson.M{"$min": bson.M{"revoked_at": t.now().UTC()}},
	)
	if err != nil {
		return fmt.Errorf("identity: revoke token %s: %w", id, err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("identity: revoke token %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// revokeDigest marks the record with this digest revoked (idempotent; absent is no error).
func (t *Tokens) revokeDigest(ctx context.Context, digest string) error {
	if _, err := t.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: digest}},
		bson.M{"$min": bson.M{"revoked_at": t.now().UTC()}}); err != nil {
		return fmt.Errorf("identity: revoke token: %w", err)
	}
	return nil
}

// RewriteAdminFile writes token, the new secret of the bootstrap token that a rotation just
// answered, to the admin-token file [Tokens.EnsureAdmin] keeps for this process's data
// directory, with [securefile.WriteFile] (0600, temporary file, fsync, rename), and returns the
// file's path. It writes nothing and returns "" when EnsureAdmin never ran in this process, or
// when the name [BootstrapTokenName] no longer points at token (a later rotation or a
// revocation won; the file is then that one's to write). Rewrites are serialised, so the file
// ends holding the secret the name points at. Errors: a store failure reading the name, or the
// file write's.
func (t *Tokens) RewriteAdminFile(ctx context.Context, token string) (string, error) {
	t.mu.Lock()
	path := t.adminFile
	t.mu.Unlock()
	if path == "" {
		return "", nil
	}
	t.fileMu.Lock()
	defer t.fileMu.Unlock()
	var n nameRecord
	err := store.FindByID(ctx, t.names, BootstrapTokenName, &n)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("identity: rewrite admin token file: %w", err)
	}
	if !Equal(n.Digest, Digest(token)) {
		return "", nil
	}
	if err := securefile.WriteFile(path, []byte(token+"\n")); err != nil {
		return "", fmt.Errorf("identity: rewrite admin token file: %w", err)
	}
	return path, nil
}

// EnsureAdmin makes sure the bootstrap admin token exists for this data directory, at startup.
// It is a KindAdmin token named [BootstrapTokenName], owned by the bootstrap admin user when
// one was created ([Tokens.BootstrapAdmin]), and listed, rotated and revoked by name like every
// machine token.
//
//  1. When dataDir/admin-token is missing, or holds a token whose digest is not in the store
//     (a new or reset database), it creates the token, writes it to the file with
//     [securefile.WriteFile] (0600; the file is written before the record, so a failure never
//     leaves an unknown admin credential behind), points the name "bootstrap" at it (revoking
//     the token the name pointed at before) and returns created=true.
//  2. When the file's token is in the store and usable, it returns it with created=false.
//  3. When the file's token was revoked, rotated or has expired, it returns created=false and
//     an empty token: revocation survives restarts. Deleting the file mints a new token at the
//     next start.
//
// An insecure file (symlink, not regular, group/world bits) is an error wrapping
// [securefile.ErrInsecure]. The caller holds the data directory lock ([store.LockDir]).
func (t *Tokens) EnsureAdmin(ctx context.Context, dataDir string) (created bool, token string, err error) {
	path := filepath.Join(dataDir, AdminTokenFile)
	t.mu.Lock()
	t.adminFile = path
	t.mu.Unlock()
	data, err := securefile.ReadFile(path)
	switch {
	case err == nil:
		existing := strings.TrimSpace(string(data))
		rec, err := t.find(ctx, Digest(existing))
		switch {
		case err == nil && t.usable(rec):
			return false, existing, nil
		case err == nil:
			return false, "", nil
		case !errors.Is(err, store.ErrNotFound):
			return false, "", fmt.Errorf("identity: ensure admin token: %w", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return false, "", fmt.Errorf("identity: ensure admin token: %w", err)
	}

	rec, token, err := t.newRecord(PrefixToken, KindAdmin, BootstrapTokenName, []Scope{ScopeAdmin}, 0)
	if err != nil {
		return false, "", err
	}
	rec.Owner, _ = t.bootstrapName(ctx)
	if err := securefile.WriteFile(path, []byte(token+"\n")); err != nil {
		return false, "", fmt.Errorf("identity: ensure admin token: %w", err)
	}
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return false, "", fmt.Errorf("identity: ensure admin token: store %s: %w", rec.ID, err)
	}
	// Point the name at the new token; a token the name held before (the file was deleted) is
	// revoked, so one name never stands for two live tokens.
	var prev nameRecord
	if err := store.FindByID(ctx, t.names, BootstrapTokenName, &prev); err == nil && prev.Digest != rec.Digest {
		if err := t.revokeDigest(ctx, prev.Digest); err != nil {
			return false, "", fmt.Errorf("identity: ensure admin token: %w", err)
		}
	}
	if _, err := t.names.ReplaceOne(ctx, bson.D{{Key: "_id", Value: BootstrapTokenName}},
		nameRecord{Name: BootstrapTokenName, Digest: rec.Digest, TokenID: rec.ID, Owner: rec.Owner, Revision: prev.Revision + 1,
			LogOutbox: prev.LogOutbox}, // a rotation's change still pending stays for the log
		options.Replace().SetUpsert(true)); err != nil {
		return false, "", fmt.Errorf("identity: ensure admin token: name it: %w", err)
	}
	return true, token, nil
}
