package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/securefile"
)

// TokensCollection holds one record per API token, keyed by the token's digest.
const TokensCollection = "tokens"

// AdminTokenFile is the file under the data directory where [Tokens.EnsureAdmin] keeps the
// bootstrap admin token (0600).
const AdminTokenFile = "admin-token"

var (
	// ErrUnauthenticated is returned by [Tokens.Authenticate] for every credential failure
	// (malformed, unknown, expired, revoked), with no hint which one; details stay server-side.
	ErrUnauthenticated = errors.New("berth: unauthenticated")
	// ErrHumanOnlyScope is returned (wrapped) by [Tokens.Create] when a machine or node token is
	// asked to hold a human-only scope.
	ErrHumanOnlyScope = errors.New("berth: scope may only be held by a human")
)

// tokenRecord is the stored form of a token. The token itself is never stored.
type tokenRecord struct {
	Digest    string     `bson:"_id"`
	ID        string     `bson:"id"` // tok_<ULID>; safe to show and log
	Kind      Kind       `bson:"kind"`
	Name      string     `bson:"name"`
	Scopes    []Scope    `bson:"scopes"`
	CreatedAt time.Time  `bson:"created_at"`
	ExpiresAt *time.Time `bson:"expires_at,omitempty"`
	RevokedAt *time.Time `bson:"revoked_at,omitempty"`
}

// Tokens creates and authenticates API tokens (prefix brt_) stored as digests in the
// "tokens" collection. Safe for concurrent use.
type Tokens struct {
	coll *mongo.Collection
	now  func() time.Time
}

// TokensOption configures [NewTokens].
type TokensOption func(*Tokens)

// WithClock makes Tokens read the time from now instead of time.Now (creation and expiry).
func WithClock(now func() time.Time) TokensOption {
	return func(t *Tokens) { t.now = now }
}

// NewTokens returns a Tokens over s's "tokens" collection. It does no I/O.
func NewTokens(s *store.Store, opts ...TokensOption) *Tokens {
	t := &Tokens{coll: s.Collection(TokensCollection), now: time.Now}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Create makes a new token of the given kind (KindAdmin, KindMachine or KindHuman), stores its
// digest and returns the token, which cannot be recovered later. ttl > 0 sets an expiry; 0
// means none; negative is refused.
//
// Errors: wrapping [ErrHumanOnlyScope] when kind is KindMachine and scopes hold a human-only
// scope; an error for an unknown scope, a KindNode (node credentials live with node records),
// or a store failure.
func (t *Tokens) Create(ctx context.Context, kind Kind, name string, scopes []Scope, ttl time.Duration) (token string, err error) {
	switch kind {
	case KindAdmin, KindMachine, KindHuman:
	default:
		return "", fmt.Errorf("identity: create token %q: kind %q cannot hold an API token", name, kind)
	}
	if ttl < 0 {
		return "", fmt.Errorf("identity: create token %q: negative ttl %v", name, ttl)
	}
	for _, s := range scopes {
		if !Known(s) {
			return "", fmt.Errorf("identity: create token %q: unknown scope %q", name, s)
		}
		if HumanOnly(s) && !kind.mayHoldHumanOnly() {
			return "", fmt.Errorf("identity: create %s token %q with scope %q: %w", kind, name, s, ErrHumanOnlyScope)
		}
	}
	token, digest, err := NewToken(PrefixToken)
	if err != nil {
		return "", err
	}
	now := t.now().UTC()
	rec := tokenRecord{
		Digest:    digest,
		ID:        NewID(IDPrefixToken),
		Kind:      kind,
		Name:      name,
		Scopes:    append([]Scope{}, scopes...),
		CreatedAt: now,
	}
	if ttl > 0 {
		exp := now.Add(ttl)
		rec.ExpiresAt = &exp
	}
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return "", fmt.Errorf("identity: store token %s: %w", rec.ID, err)
	}
	return token, nil
}

// Authenticate returns the principal of an API token. Every credential failure (malformed,
// unknown, expired, revoked) returns exactly [ErrUnauthenticated]; a store failure returns a
// wrapped store error (never containing the token), which callers report as unavailable.
func (t *Tokens) Authenticate(ctx context.Context, token string) (*Principal, error) {
	if !WellFormed(token, PrefixToken) {
		return nil, ErrUnauthenticated
	}
	rec, err := t.find(ctx, Digest(token))
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("identity: authenticate: %w", err)
	}
	if !t.usable(rec) {
		return nil, ErrUnauthenticated
	}
	return &Principal{Kind: rec.Kind, ID: rec.ID, Name: rec.Name, Scopes: rec.Scopes}, nil
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
// there is no such token.
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

// EnsureAdmin makes sure an admin token exists for this data directory, at startup.
//
//  1. When dataDir/admin-token is missing, or holds a token whose digest is not in the store
//     (a new or reset database), it creates a KindAdmin token with [ScopeAdmin], writes it to
//     the file with [securefile.WriteFile] (0600; the file is written before the record, so a
//     failure never leaves an unknown admin credential behind) and returns created=true.
//  2. When the file's token is in the store and usable, it returns it with created=false.
//  3. When the file's token was revoked or has expired, it returns created=false and an empty
//     token: revocation survives restarts. Deleting the file mints a new token at next start.
//
// An insecure file (symlink, not regular, group/world bits) is an error wrapping
// [securefile.ErrInsecure]. The caller holds the data directory lock ([store.LockDir]).
func (t *Tokens) EnsureAdmin(ctx context.Context, dataDir string) (created bool, token string, err error) {
	path := filepath.Join(dataDir, AdminTokenFile)
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

	token, digest, err := NewToken(PrefixToken)
	if err != nil {
		return false, "", err
	}
	if err := securefile.WriteFile(path, []byte(token+"\n")); err != nil {
		return false, "", fmt.Errorf("identity: ensure admin token: %w", err)
	}
	rec := tokenRecord{
		Digest:    digest,
		ID:        NewID(IDPrefixToken),
		Kind:      KindAdmin,
		Name:      "bootstrap admin",
		Scopes:    []Scope{ScopeAdmin},
		CreatedAt: t.now().UTC(),
	}
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return false, "", fmt.Errorf("identity: ensure admin token: store %s: %w", rec.ID, err)
	}
	return true, token, nil
}
