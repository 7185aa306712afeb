package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// Machine token lifetimes (docs/api.md section "Identity").
const (
	DefaultMachineTokenTTL = 90 * 24 * time.Hour
	MaxMachineTokenTTL     = 365 * 24 * time.Hour
)

// nameRecord points a machine token's name at the digest of its current secret.
type nameRecord struct {
	Name     string `bson:"_id"`
	Digest   string `bson:"digest"`
	TokenID  string `bson:"token_id"`
	Owner    string `bson:"owner,omitempty"`
	Revision int64  `bson:"revision"`
	// LogOutbox holds the changes of the token's rotations not yet in the
	// change log, written in the same compare-and-set as each rotation.
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty"`
}

// MachineTokenRequest is a named machine token to create.
type MachineTokenRequest struct {
	Name    string
	Owner   string // the user it belongs to; must exist unless empty
	Scopes  []Scope
	Project string // empty: every project (then Service must be empty)
	Service string
	TTL     time.Duration // 0: DefaultMachineTokenTTL; at most MaxMachineTokenTTL
}

// MachineToken is what a token list shows: never the token or its digest.
type MachineToken struct {
	Name      string     `json:"name"`
	ID        string     `json:"id"`
	Kind      Kind       `json:"kind"`
	Owner     string     `json:"owner,omitempty"`
	Scopes    []Scope    `json:"scopes"`
	Project   string     `json:"project,omitempty"`
	Service   string     `json:"service,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  *time.Time `json:"last_used_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Change is where the write that returned this listing left its
	// change-log item (zero for reads and writes whose ctx carried no actor).
	Change Change `json:"-"`
}

func (r tokenRecord) public(name string) MachineToken {
	return MachineToken{Name: name, ID: r.ID, Kind: r.Kind, Owner: r.Owner, Scopes: r.Scopes, Project: r.Project,
		Service: r.Service, CreatedAt: r.CreatedAt, LastUsed: r.LastUsed, ExpiresAt: r.ExpiresAt, RevokedAt: r.RevokedAt}
}

// CreateMachine makes a named machine token (brt_) and returns it once with its listing. The
// name is claimed first (one insert keyed by name), then the token record is written: a create
// that dies between the two leaves the name taken by no live token, which revoke clears. When
// ctx carries a change-log actor ([changelog.WithActor]) the token record's insert, the commit
// point, carries the "create token" change ([MachineToken.Change]).
//
// Errors: wrapping [ErrHumanOnlyScope] for a human-only scope; [ErrInvalid] for a bad name,
// unknown scope, no scope, a service without a project, a lifetime over one year or negative;
// [ErrExists] when the name is taken; a store failure.
func (t *Tokens) CreateMachine(ctx context.Context, req MachineTokenRequest) (string, MachineToken, error) {
	if !ValidName(req.Name) {
		return "", MachineToken{}, fmt.Errorf("identity: token name %q: lower-case, at most 64 characters, no ':' or '/': %w", req.Name, ErrInvalid)
	}
	if len(req.Scopes) == 0 {
		return "", MachineToken{}, fmt.Errorf("identity: token %s: give at least one scope: %w", req.Name, ErrInvalid)
	}
	if err := checkScopes(KindMachine, req.Scopes); err != nil {
		return "", MachineToken{}, fmt.Errorf("identity: token %s: %w", req.Name, err)
	}
	if req.Service != "" && req.Project == "" {
		return "", MachineToken{}, fmt.Errorf("identity: token %s: a service bound needs a project: %w", req.Name, ErrInvalid)
	}
	if req.TTL == 0 {
		req.TTL = DefaultMachineTokenTTL
	}
	if req.TTL < 0 || req.TTL > MaxMachineTokenTTL {
		return "", MachineToken{}, fmt.Errorf("identity: token %s: lifetime %v: at most one year: %w", req.Name, req.TTL, ErrInvalid)
	}
	rec, token, err := t.newRecord(PrefixToken, KindMachine, req.Name, req.Scopes, req.TTL)
	if err != nil {
		return "", MachineToken{}, err
	}
	rec.Owner, rec.Project, rec.Service = req.Owner, req.Project, req.Service
	p, logged, err := logChange(ctx, EntityToken, req.Name, node.OpCreate, "create token")
	if err != nil {
		return "", MachineToken{}, err
	}
	if logged {
		rec.LogOutbox = []changelog.Pending{p}
	}
	if _, err := t.names.InsertOne(ctx, nameRecord{Name: req.Name, Digest: rec.Digest, TokenID: rec.ID, Owner: req.Owner}); err != nil {
		if store.IsDuplicateKey(err) {
			return "", MachineToken{}, fmt.Errorf("identity: token %s: %w", req.Name, ErrExists)
		}
		return "", MachineToken{}, fmt.Errorf("identity: claim token name %s: %w", req.Name, err)
	}
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return "", MachineToken{}, fmt.Errorf("identity: store token %s: %w", req.Name, err)
	}
	info := rec.public(req.Name)
	if logged {
		info.Change = Change{Collection: TokensCollection, ID: rec.Digest, Outbox: rec.LogOutbox}
	}
	return token, info, nil
}

// MachineTokenInfo returns the named token's listing; an error wrapping [store.ErrNotFound]
// when the name is unknown.
func (t *Tokens) MachineTokenInfo(ctx context.Context, name string) (MachineToken, error) {
	var n nameRecord
	if err := store.FindByID(ctx, t.names, name, &n); err != nil {
		return MachineToken{}, err
	}
	rec, err := t.find(ctx, n.Digest)
	if errors.Is(err, store.ErrNotFound) {
		return MachineToken{Name: name, ID: n.TokenID, Owner: n.Owner}, nil
	}
	if err != nil {
		return MachineToken{}, err
	}
	return rec.public(name), nil
}

// ListMachineTokens returns every named token (the bootstrap token included), sorted by name;
// owner, when not empty, keeps only that user's. An administrative scan, not a request path.
func (t *Tokens) ListMachineTokens(ctx context.Context, owner string) ([]MachineToken, error) {
	cur, err := t.names.Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("identity: list tokens: %w", err)
	}
	var names []nameRecord
	if err := cur.All(ctx, &names); err != nil {
		return nil, fmt.Errorf("identity: list tokens: %w", err)
	}
	out := make([]MachineToken, 0, len(names))
	for _, n := range names {
		if owner != "" && n.Owner != owner {
			continue
		}
		rec, err := t.find(ctx, n.Digest)
		switch {
		case errors.Is(err, store.ErrNotFound):
			out = append(out, MachineToken{Name: n.Name, ID: n.TokenID, Owner: n.Owner})
		case err != nil:
			return nil, fmt.Errorf("identity: list tokens: %w", err)
		default:
			out = append(out, rec.public(n.Name))
		}
	}
	slices.SortFunc(out, func(a, b MachineToken) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RevokeMachine revokes the named token and frees its name: the token record is revoked
// first, so a revoke that dies half-way has still cut the token off. When ctx carries a
// change-log actor, that revoke write carries the "revoke token" change (returned; the token
// record is kept, so its outbox outlives the name). Revoking an unknown name returns an error
// wrapping [store.ErrNotFound].
func (t *Tokens) RevokeMachine(ctx context.Context, name string) (Change, error) {
	var n nameRecord
	if err := store.FindByID(ctx, t.names, name, &n); err != nil {
		return Change{}, fmt.Errorf("identity: revoke token %s: %w", name, err)
	}
	p, logged, err := logChange(ctx, EntityToken, name, node.OpUpdate, "revoke token")
	if err != nil {
		return Change{}, err
	}
	var ch Change
	if !logged {
		err = t.revokeDigest(ctx, n.Digest)
	} else {
		var rec tokenRecord
		err = t.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: n.Digest}},
			bson.M{"$min": bson.M{"revoked_at": t.now().UTC()}, "$push": bson.M{changelog.OutboxField: p}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&rec)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			// A create that died before its token record: nothing to cut off or record.
			err = nil
		case err != nil:
			err = fmt.Errorf("identity: revoke token %s: %w", name, err)
		default:
			ch = Change{Collection: TokensCollection, ID: n.Digest, Outbox: upTo(rec.LogOutbox, p.ID)}
		}
	}
	if err != nil {
		return Change{}, err
	}
	if _, err := t.names.DeleteOne(ctx, bson.D{{Key: "_id", Value: name}, {Key: "digest", Value: n.Digest}}); err != nil {
		return ch, fmt.Errorf("identity: revoke token %s: free the name: %w", name, err)
	}
	return ch, nil
}

// RotateMachine gives the named token a new secret with the same grants and the same expiry
// and returns it once; the old secret fails from the first write on, with no overlap. Steps:
// revoke the old record, write the new one, then move the name to it with a compare-and-set
// on the name's revision. A rotation that dies half-way leaves the name on a revoked secret
// (fail closed) and can be repeated; of two concurrent rotations one wins and the loser's new
// secret is revoked. When ctx carries a change-log actor, the compare-and-set on the name, the
// commit point, carries the "rotate token" change ([MachineToken.Change]). Errors: wrapping
// [store.ErrNotFound] for an unknown name,
// [store.ErrConflict] when another rotation won; a store failure.
func (t *Tokens) RotateMachine(ctx context.Context, name string) (string, MachineToken, error) {
	var n nameRecord
	if err := store.FindByID(ctx, t.names, name, &n); err != nil {
		return "", MachineToken{}, fmt.Errorf("identity: rotate token %s: %w", name, err)
	}
	old, err := t.find(ctx, n.Digest)
	if err != nil {
		return "", MachineToken{}, fmt.Errorf("identity: rotate token %s: %w", name, err)
	}
	if err := t.revokeDigest(ctx, old.Digest); err != nil {
		return "", MachineToken{}, err
	}
	token, digest, err := NewToken(PrefixToken)
	if err != nil {
		return "", MachineToken{}, err
	}
	rec := old
	rec.Digest, rec.ID, rec.CreatedAt, rec.RevokedAt, rec.LastUsed = digest, NewID(IDPrefixToken), t.now().UTC(), nil, nil
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return "", MachineToken{}, fmt.Errorf("identity: rotate token %s: store: %w", name, err)
	}
	p, logged, err := logChange(ctx, EntityToken, name, node.OpUpdate, "rotate token")
	if err != nil {
		_ = t.revokeDigest(ctx, digest)
		return "", MachineToken{}, err
	}
	update := bson.M{"$set": bson.M{"digest": digest, "token_id": rec.ID}}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: p}
	}
	if _, err := t.st.UpdateIfRevision(ctx, t.names, name, n.Revision, update); err != nil {
		_ = t.revokeDigest(ctx, digest)
		return "", MachineToken{}, fmt.Errorf("identity: rotate token %s: %w", name, err)
	}
	info := rec.public(name)
	if logged {
		var after nameRecord
		if err := store.FindByID(ctx, t.names, name, &after); err != nil && !errors.Is(err, store.ErrNotFound) {
			return "", MachineToken{}, fmt.Errorf("identity: rotate token %s: read it back: %w", name, err)
		}
		// Read back to hand over earlier rotations' changes still pending too; when the name is
		// gone already (revoked meanwhile), this change is handed over alone.
		info.Change = Change{Collection: TokenNamesCollection, ID: name, Outbox: upTo(after.LogOutbox, p.ID)}
		if after.Name == "" {
			info.Change.Outbox = []changelog.Pending{p}
		}
	}
	return token, info, nil
}
