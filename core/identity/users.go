package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// Session lifetimes (docs/api.md section "Identity").
const (
	DefaultSessionTTL = 12 * time.Hour
	MaxSessionTTL     = 7 * 24 * time.Hour
	// ReauthWindow is how recent a human's login must be for a sensitive action.
	ReauthWindow = 5 * time.Minute
	// Login backoff: after LoginFailuresFree failed logins of one user within LoginFailureWindow,
	// every further attempt for that user waits 1 s, doubling per failure, at most
	// MaxLoginDelay; it is never refused outright, so nobody can lock a user out.
	LoginFailuresFree  = 10
	LoginFailureWindow = time.Minute
	MaxLoginDelay      = 16 * time.Second
	// MinLoginConcurrency is the least number of password verifications run at once.
	MinLoginConcurrency = 2
	// LoginVerificationsPerCore bounds password verifications run at once per CPU.
	LoginVerificationsPerCore = 4
	// MaxNameLen bounds user and token names.
	MaxNameLen = 64
)

// IDPrefixUser prefixes user ids.
const IDPrefixUser = "usr_"

// userRecord is a stored user, keyed by name. The verifier never leaves this package.
type userRecord struct {
	Name       string    `bson:"_id"`
	ID         string    `bson:"id"`
	Kind       Kind      `bson:"kind"` // KindHuman or KindMachine
	Roles      []Role    `bson:"roles"`
	Grants     []Grant   `bson:"grants,omitempty"`
	Generation int64     `bson:"generation"`
	Verifier   string    `bson:"verifier,omitempty"`
	CreatedAt  time.Time `bson:"created_at"`
	UpdatedAt  time.Time `bson:"updated_at"`
	Revision   int64     `bson:"revision"`
	// LogOutbox holds the user's identity changes not yet in the change log,
	// written in the same write as each change (docs/node-protocol.md
	// section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty"`
}

// User is what the API shows of a user: never a password or verifier.
type User struct {
	Name            string    `json:"name"`
	ID              string    `json:"id"`
	Kind            Kind      `json:"kind"`
	Roles           []Role    `json:"roles"`
	Grants          []Grant   `json:"grants,omitempty"`
	Generation      int64     `json:"generation"`
	PasswordEnabled bool      `json:"password_enabled"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	// Change is where the write that returned this user left its change-log
	// item (zero for reads and for writes whose ctx carried no actor).
	Change Change `json:"-"`
}

func (u userRecord) public() User {
	return User{Name: u.Name, ID: u.ID, Kind: u.Kind, Roles: u.Roles, Grants: u.Grants, Generation: u.Generation,
		PasswordEnabled: u.Verifier != "", CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt}
}

// scopes returns the global scopes and per-project grants of u's roles.
func (u userRecord) scopes() ([]Scope, map[string][]Scope) {
	var global []Scope
	for _, r := range u.Roles {
		global = append(global, r.Scopes(u.Kind)...)
	}
	var grants map[string][]Scope
	for _, g := range u.Grants {
		if grants == nil {
			grants = map[string][]Scope{}
		}
		grants[g.Project] = append(grants[g.Project], g.Role.Scopes(u.Kind)...)
	}
	return global, grants
}

// ValidName reports whether name is a valid user or token name: 1 to 64 characters, no
// upper-case letter, no ':' or '/', no space or control character.
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameLen {
		return false
	}
	for _, r := range name {
		if unicode.IsUpper(r) || r == ':' || r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) || r > unicode.MaxASCII {
			return false
		}
	}
	return true
}

// NewUserRequest is a user to create.
type NewUserRequest struct {
	Name     string
	Kind     Kind // KindHuman or KindMachine
	Roles    []Role
	Grants   []Grant
	Password string // humans only; empty leaves password login off
}

// CreateUser stores a new user in one insert keyed by name; when ctx carries a change-log actor
// ([changelog.WithActor]) the insert carries its "create user" change (returned in
// [User.Change]). Errors: wrapping [ErrInvalid] for
// a bad name, kind, role or grant, [ErrPasswordPolicy] for a bad password (or any password on a
// machine user), [ErrExists] when the name is taken; a store failure.
func (t *Tokens) CreateUser(ctx context.Context, req NewUserRequest) (User, error) {
	if !ValidName(req.Name) {
		return User{}, fmt.Errorf("identity: user name %q: lower-case, at most 64 characters, no ':' or '/': %w", req.Name, ErrInvalid)
	}
	if req.Kind != KindHuman && req.Kind != KindMachine {
		return User{}, fmt.Errorf("identity: user %s: kind must be human or machine: %w", req.Name, ErrInvalid)
	}
	for _, r := range req.Roles {
		if !r.Valid() {
			return User{}, fmt.Errorf("identity: user %s: unknown role %q: %w", req.Name, r, ErrInvalid)
		}
	}
	for _, g := range req.Grants {
		if !g.Role.Valid() || g.Project == "" {
			return User{}, fmt.Errorf("identity: user %s: a grant needs a project and a known role: %w", req.Name, ErrInvalid)
		}
	}
	now := t.now().UTC()
	rec := userRecord{Name: req.Name, ID: NewID(IDPrefixUser), Kind: req.Kind, Roles: req.Roles, Grants: req.Grants,
		Generation: 1, CreatedAt: now, UpdatedAt: now}
	if rec.Roles == nil {
		rec.Roles = []Role{}
	}
	if req.Password != "" {
		if req.Kind != KindHuman {
			return User{}, fmt.Errorf("identity: machine user %s has no password: %w", req.Name, ErrPasswordPolicy)
		}
		if err := CheckPassword(req.Password); err != nil {
			return User{}, err
		}
		v, err := HashPassword(req.Password, t.argon)
		if err != nil {
			return User{}, err
		}
		rec.Verifier = v
	}
	p, logged, err := logChange(ctx, EntityUser, req.Name, node.OpCreate, "create user")
	if err != nil {
		return User{}, err
	}
	if logged {
		rec.LogOutbox = []changelog.Pending{p}
	}
	if _, err := t.users.InsertOne(ctx, rec); err != nil {
		if store.IsDuplicateKey(err) {
			return User{}, fmt.Errorf("identity: user %s: %w", req.Name, ErrExists)
		}
		return User{}, fmt.Errorf("identity: create user %s: %w", req.Name, err)
	}
	out := rec.public()
	if logged {
		out.Change = Change{Collection: UsersCollection, ID: rec.Name, Outbox: rec.LogOutbox}
	}
	return out, nil
}

// bootstrapRecord names the one bootstrap admin of a cluster (MetaCollection, _id "bootstrap").
type bootstrapRecord struct {
	ID        string    `bson:"_id"`
	Name      string    `bson:"name"`
	CreatedAt time.Time `bson:"created_at"`
}

// BootstrapAdmin creates the first human admin, once per cluster: the claim is one insert of
// the bootstrap record, and the user is created after it. created reports that this call made
// the user; a later start (same name or another) changes nothing and never overwrites a user or
// a password, and a start that died between the two writes finishes the user on the next call
// with the same name. The password must pass [CheckPassword].
func (t *Tokens) BootstrapAdmin(ctx context.Context, name, password string) (created bool, err error) {
	if err := CheckPassword(password); err != nil {
		return false, err
	}
	if !ValidName(name) {
		return false, fmt.Errorf("identity: bootstrap admin name %q: %w", name, ErrInvalid)
	}
	_, err = t.meta.InsertOne(ctx, bootstrapRecord{ID: "bootstrap", Name: name, CreatedAt: t.now().UTC()})
	if err != nil && !store.IsDuplicateKey(err) {
		return false, fmt.Errorf("identity: claim bootstrap admin: %w", err)
	}
	claimed, err := t.bootstrapName(ctx)
	if err != nil {
		return false, err
	}
	if claimed != name {
		return false, nil
	}
	_, err = t.CreateUser(ctx, NewUserRequest{Name: name, Kind: KindHuman, Roles: []Role{RoleAdmin}, Password: password})
	if errors.Is(err, ErrExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// The bootstrap token now belongs to the bootstrap admin.
	var n nameRecord
	if err := store.FindByID(ctx, t.names, BootstrapTokenName, &n); err == nil && n.Owner == "" {
		if _, err := t.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: n.Digest}}, bson.M{"$set": bson.M{"owner": name}}); err != nil {
			return true, fmt.Errorf("identity: bootstrap token owner: %w", err)
		}
		if _, err := t.names.UpdateOne(ctx, bson.D{{Key: "_id", Value: BootstrapTokenName}}, bson.M{"$set": bson.M{"owner": name}}); err != nil {
			return true, fmt.Errorf("identity: bootstrap token owner: %w", err)
		}
	}
	return true, nil
}

func (t *Tokens) bootstrapName(ctx context.Context) (string, error) {
	var b bootstrapRecord
	if err := store.FindByID(ctx, t.meta, "bootstrap", &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return "", nil
		}
		return "", fmt.Errorf("identity: read bootstrap admin: %w", err)
	}
	return b.Name, nil
}

func (t *Tokens) user(ctx context.Context, name string) (userRecord, error) {
	var u userRecord
	if name == "" {
		return u, fmt.Errorf("identity: user: %w", store.ErrNotFound)
	}
	err := store.FindByID(ctx, t.users, name, &u)
	return u, err
}

// GetUser returns the user named name; an error wrapping [store.ErrNotFound] when there is none.
func (t *Tokens) GetUser(ctx context.Context, name string) (User, error) {
	u, err := t.user(ctx, name)
	if err != nil {
		return User{}, err
	}
	return u.public(), nil
}

// ListUsers returns every user sorted by name (an administrative scan).
func (t *Tokens) ListUsers(ctx context.Context) ([]User, error) {
	cur, err := t.users.Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("identity: list users: %w", err)
	}
	var recs []userRecord
	if err := cur.All(ctx, &recs); err != nil {
		return nil, fmt.Errorf("identity: list users: %w", err)
	}
	out := make([]User, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.public())
	}
	slices.SortFunc(out, func(a, b User) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Session is a human session opened by [Tokens.Login]; Token is shown once.
type Session struct {
	Token      string    `json:"token"`
	User       string    `json:"user"`
	Generation int64     `json:"generation"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// LoginBusyRetry is the Retry-After of an attempt refused with [ErrLoginBusy].
const LoginBusyRetry = time.Second

var (
	// ErrLoginBusy is returned (in a [*LoginThrottledError]) by [Tokens.Login] when as many
	// password verifications run as its bound allows ([WithLoginConcurrency]).
	ErrLoginBusy = errors.New("berth: too many logins are being verified; retry shortly")
	// ErrLoginBackoff is returned (in a [*LoginThrottledError]) by [Tokens.Login] for an attempt
	// on a name that failed too often before its next attempt is due.
	ErrLoginBackoff = errors.New("berth: too many failed logins for this name; retry later")
)

// LoginThrottledError is a login refused before any password was verified: Err is
// [ErrLoginBusy] or [ErrLoginBackoff], RetryAfter how long to wait before trying again.
type LoginThrottledError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *LoginThrottledError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.RetryAfter)
}

// Unwrap returns Err.
func (e *LoginThrottledError) Unwrap() error { return e.Err }

// LoginConcurrencyFor is how many password verifications to run at once on a machine with
// memBytes of memory and cores CPUs: an eighth of the memory in verifications of
// [DefaultArgon2Params] (64 MiB each), and no more than [LoginVerificationsPerCore] per CPU
// (more would only queue for the CPU while holding their memory), at least
// [MinLoginConcurrency]. A cores of zero or less leaves the CPU bound out.
func LoginConcurrencyFor(memBytes uint64, cores int) int {
	per := uint64(DefaultArgon2Params.Memory) * 1024
	n := memBytes / 8 / per
	if cores > 0 {
		n = min(n, uint64(cores*LoginVerificationsPerCore))
	}
	return int(max(n, MinLoginConcurrency))
}

// Login verifies a human's password and opens a session (a brs_ token stored as a digest, of
// the user's current generation) of ttl, 0 meaning [DefaultSessionTTL]. Unknown users, machine
// users, users without a password and wrong passwords all return exactly [ErrUnauthenticated]
// after one argon2id verification each (a dummy verifier for unknown users).
//
// Before verifying, an attempt is refused with a [*LoginThrottledError], verifying nothing:
//
//  1. wrapping [ErrLoginBusy] when the bound on verifications running at once
//     ([WithLoginConcurrency]) is reached, unknown names included;
//  2. wrapping [ErrLoginBackoff] when the name failed [LoginFailuresFree] times within
//     [LoginFailureWindow] and its next attempt is not due yet: it is due 1 s after the last
//     failure, doubling per further failure up to [MaxLoginDelay], and one attempt takes each
//     due time (parallel attempts do not multiply the guesses). A success clears the count.
//
// Errors also: wrapping [ErrInvalid] for a ttl out of bounds; a store failure.
func (t *Tokens) Login(ctx context.Context, name, password string, ttl time.Duration) (Session, error) {
	if ttl == 0 {
		ttl = DefaultSessionTTL
	}
	if ttl < time.Minute || ttl > MaxSessionTTL {
		return Session{}, fmt.Errorf("identity: session lifetime %v: between 1 minute and 7 days: %w", ttl, ErrInvalid)
	}
	select {
	case t.verifySlots <- struct{}{}:
	default:
		return Session{}, &LoginThrottledError{Err: ErrLoginBusy, RetryAfter: LoginBusyRetry}
	}
	defer func() { <-t.verifySlots }()
	if wait := t.admitLogin(name); wait > 0 {
		return Session{}, &LoginThrottledError{Err: ErrLoginBackoff, RetryAfter: wait}
	}
	defer t.loginFinished(name)
	u, err := t.user(ctx, name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return Session{}, fmt.Errorf("identity: login: %w", err)
	}
	verifier := u.Verifier
	if err != nil || u.Kind != KindHuman || verifier == "" || len(password) > MaxPasswordBytes {
		verifier = t.dummy
		u = userRecord{}
	}
	if t.verifyHook != nil {
		t.verifyHook(ctx)
	}
	ok := VerifyPassword(password, verifier)
	if !ok || u.Name == "" {
		t.loginFailed(name)
		return Session{}, ErrUnauthenticated
	}
	t.loginSucceeded(name)
	rec, token, err := t.newRecord(PrefixSession, KindHuman, u.Name, nil, ttl)
	if err != nil {
		return Session{}, err
	}
	rec.Owner, rec.Session, rec.Generation, rec.AuthAt = u.Name, true, u.Generation, rec.CreatedAt
	if _, err := t.coll.InsertOne(ctx, rec); err != nil {
		return Session{}, fmt.Errorf("identity: store session of %s: %w", u.Name, err)
	}
	return Session{Token: token, User: u.Name, Generation: u.Generation, ExpiresAt: *rec.ExpiresAt}, nil
}

// loginDelay is how long after its last failure a name that failed n times within the
// window waits for its next attempt: none below LoginFailuresFree, then 1 s doubling per
// failure, at most MaxLoginDelay.
func loginDelay(n int) time.Duration {
	if n < LoginFailuresFree {
		return 0
	}
	return min(time.Second<<min(n-LoginFailuresFree, 5), MaxLoginDelay)
}

// admitLogin returns how long an attempt for name must still wait, or 0 when it may verify
// now. Attempts of name still being verified count as failures, so a burst of parallel
// guesses is admitted no further than the same guesses one after another. An admitted
// attempt of a name in backoff takes the due time, so the next attempt waits a full delay
// again whatever the outcome. An admitted attempt must be ended with [Tokens.loginFinished].
func (t *Tokens) admitLogin(name string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.recentFailuresLocked(name)
	d := loginDelay(len(f) + t.verifying[name])
	if d > 0 {
		now := t.now()
		due := now.Add(d) // only attempts in flight so far: due one delay from now
		if len(f) > 0 {
			due = f[len(f)-1].Add(d)
		}
		if r, ok := t.reserved[name]; ok && r.After(due) {
			due = r
		}
		if now.Before(due) {
			return due.Sub(now)
		}
		t.reserved[name] = now.Add(d)
	}
	t.verifying[name]++
	return 0
}

// loginFinished ends an attempt admitLogin admitted, once its outcome is recorded.
func (t *Tokens) loginFinished(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.verifying[name]--; t.verifying[name] <= 0 {
		delete(t.verifying, name)
	}
}

// recentFailuresLocked drops failures older than the window and returns the rest. mu must be held.
func (t *Tokens) recentFailuresLocked(name string) []time.Time {
	cut := t.now().Add(-LoginFailureWindow)
	f := slices.DeleteFunc(t.failed[name], func(at time.Time) bool { return !at.After(cut) })
	if len(f) == 0 {
		delete(t.failed, name)
		delete(t.reserved, name)
		return nil
	}
	t.failed[name] = f
	return f
}

func (t *Tokens) loginFailed(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.failed) > 10_000 {
		for k := range t.failed {
			t.recentFailuresLocked(k)
		}
	}
	f := t.recentFailuresLocked(name)
	if len(f) < 64 {
		f = append(f, t.now())
	} else {
		f = append(f[1:], t.now())
	}
	t.failed[name] = f
}

func (t *Tokens) loginSucceeded(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.failed, name)
	delete(t.reserved, name)
}

// Logout revokes the session token given; an unknown or malformed token is no error.
func (t *Tokens) Logout(ctx context.Context, token string) error {
	if !WellFormed(token, PrefixSession) {
		return nil
	}
	return t.revokeDigest(ctx, Digest(token))
}

// CredentialOp is one change of a human's credential; each advances the generation.
type CredentialOp string

// Credential operations.
const (
	OpRotatePassword CredentialOp = "rotate_password" // set a new password
	OpRevokePassword CredentialOp = "revoke_password" // turn password login off
	OpRevokeSessions CredentialOp = "revoke_sessions" // end every session, keep the password
)

// ChangeCredential applies op to the human user name in one compare-and-set on the user's
// record, conditional on expectedGeneration (0 takes the current one), and advances the
// generation by one: every session of an older generation fails its next request. It returns
// the user as changed. Errors: wrapping [store.ErrNotFound] for an unknown user,
// [store.ErrConflict] when the generation or record moved, [ErrPasswordPolicy] for a bad new
// password, [ErrInvalid] for an unknown op or a machine user. When ctx carries a change-log
// actor the compare-and-set carries its "credential <op>" change (in [User.Change]).
func (t *Tokens) ChangeCredential(ctx context.Context, name string, expectedGeneration int64, op CredentialOp, newPassword string) (User, error) {
	u, err := t.user(ctx, name)
	if err != nil {
		return User{}, err
	}
	if u.Kind != KindHuman {
		return User{}, fmt.Errorf("identity: user %s is not a human: %w", name, ErrInvalid)
	}
	if expectedGeneration != 0 && expectedGeneration != u.Generation {
		return User{}, fmt.Errorf("identity: user %s at generation %d, not %d: %w", name, u.Generation, expectedGeneration, store.ErrConflict)
	}
	set := bson.M{"generation": u.Generation + 1, "updated_at": t.now().UTC()}
	switch op {
	case OpRotatePassword:
		if err := CheckPassword(newPassword); err != nil {
			return User{}, err
		}
		v, err := HashPassword(newPassword, t.argon)
		if err != nil {
			return User{}, err
		}
		set["verifier"] = v
	case OpRevokePassword:
		set["verifier"] = ""
	case OpRevokeSessions:
	default:
		return User{}, fmt.Errorf("identity: unknown credential operation %q: %w", op, ErrInvalid)
	}
	return t.updateUser(ctx, u, bson.M{"$set": set}, "credential "+string(op))
}

// updateUser applies update to u's record in one compare-and-set on its revision, with the
// change of action in the same write when ctx carries an actor, and returns the user as
// changed. Errors: those of [store.Store.UpdateIfRevision], wrapped; a store failure.
func (t *Tokens) updateUser(ctx context.Context, u userRecord, update bson.M, action string) (User, error) {
	p, logged, err := logChange(ctx, EntityUser, u.Name, node.OpUpdate, action)
	if err != nil {
		return User{}, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: p}
	}
	if _, err := t.st.UpdateIfRevision(ctx, t.users, u.Name, u.Revision, update); err != nil {
		return User{}, fmt.Errorf("identity: %s of %s: %w", action, u.Name, err)
	}
	u, err = t.user(ctx, u.Name)
	if err != nil {
		return User{}, err
	}
	out := u.public()
	if logged {
		out.Change = Change{Collection: UsersCollection, ID: u.Name, Outbox: upTo(u.LogOutbox, p.ID)}
	}
	return out, nil
}

// Fresh reports whether p may take a sensitive action now: a human session whose password
// was verified within [ReauthWindow], or a principal that is not a human session (the
// bootstrap admin token stands for the operator holding the data directory; machine tokens
// never hold human-only scopes anyway).
func (t *Tokens) Fresh(p *Principal) bool {
	if p == nil {
		return false
	}
	if p.Kind != KindHuman || p.AuthAt.IsZero() {
		return p.Kind != KindHuman
	}
	return t.now().Sub(p.AuthAt) <= ReauthWindow
}

// SetRoles replaces the global roles and per-project grants of the user name, in one
// compare-and-set on the user's record. They take effect on the user's next request (sessions
// read roles on every request); the generation does not move. Errors: wrapping
// [store.ErrNotFound] for an unknown user, [ErrInvalid] for an unknown role or a grant without
// a project, [store.ErrConflict] when the record changed meanwhile. When ctx carries a
// change-log actor the compare-and-set carries its "set roles" change (in [User.Change]).
func (t *Tokens) SetRoles(ctx context.Context, name string, roles []Role, grants []Grant) (User, error) {
	for _, r := range roles {
		if !r.Valid() {
			return User{}, fmt.Errorf("identity: user %s: unknown role %q: %w", name, r, ErrInvalid)
		}
	}
	for _, g := range grants {
		if !g.Role.Valid() || g.Project == "" {
			return User{}, fmt.Errorf("identity: user %s: a grant needs a project and a known role: %w", name, ErrInvalid)
		}
	}
	if roles == nil {
		roles = []Role{}
	}
	u, err := t.user(ctx, name)
	if err != nil {
		return User{}, err
	}
	return t.updateUser(ctx, u, bson.M{"$set": bson.M{
		"roles": roles, "grants": grants, "updated_at": t.now().UTC()}}, "set roles")
}

// Now returns the identity store's clock reading (see [WithClock]).
func (t *Tokens) Now() time.Time { return t.now() }
