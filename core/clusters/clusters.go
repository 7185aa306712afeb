// Package clusters owns clusters (groups of nodes, optionally reached through one relay), their
// relay credentials with generations, and the registrations and election of their relays.
package clusters

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Default is the cluster a node belongs to when its join token names none. It exists from the
// first start (EnsureDefault) and never requires a relay.
const Default = "default"

// coll is the collection of cluster documents, keyed by name.
const coll = "clusters"

// maxRetired bounds how many rotated-away credential digests a cluster keeps, to tell a stale
// credential (relay_credential_stale: the relay parks) from one that was never valid.
const maxRetired = 16

// Timers of the relay election (docs/relay.md section 11). A registration is live while it was
// renewed within LiveFor; the core side renews each relay session it serves every RenewEvery.
const (
	RenewEvery = 10 * time.Second
	LiveFor    = 30 * time.Second
)

// Errors of [Registry] methods; the API maps each to its code in abi/errors.
var (
	// ErrNotFound: no cluster of that name (cluster_not_found).
	ErrNotFound = errors.New("berth: cluster not found")
	// ErrExists: Create of a name that is taken.
	ErrExists = errors.New("berth: cluster already exists")
	// ErrNoRelay: a relay credential or registration for a cluster that does not require a relay.
	ErrNoRelay = errors.New("berth: the cluster does not use a relay")
	// ErrInvalid: a malformed name or registration.
	ErrInvalid = errors.New("berth: invalid cluster request")
	// ErrCredentialStale: a relay credential of a generation rotated away, or a registration
	// under a generation that is no longer the cluster's (relay_credential_stale).
	ErrCredentialStale = errors.New("berth: the relay credential's generation was rotated away")
	// ErrSequenceNotAdvancing: a registration whose sequence is not above the one recorded for
	// the same relay (relay_registration_refused).
	ErrSequenceNotAdvancing = errors.New("berth: the relay's registration sequence did not advance")
	// ErrSuperseded: a renewal or stream of a registration a newer one of the same relay
	// replaced, or that is no longer recorded.
	ErrSuperseded = errors.New("berth: the relay registration was superseded")
	// ErrNotConnected: the cluster has no live registered relay (relay_not_connected).
	ErrNotConnected = errors.New("berth: no relay is connected for the cluster")
	// ErrAmbiguous: two or more live registered relays for one cluster (relay_ambiguous).
	ErrAmbiguous = errors.New("berth: more than one relay is registered for the cluster")
)

// Cluster is a cluster document in collection "clusters".
type Cluster struct {
	Name string `bson:"_id" json:"name"`
	// RequiresRelay reports whether the cluster's nodes are reached through a relay only.
	RequiresRelay bool      `bson:"requires_relay" json:"requires_relay"`
	CreatedAt     time.Time `bson:"created_at" json:"created_at"`
	// Credential is the current relay credential, nil until one was ensured.
	Credential *Credential `bson:"credential,omitempty" json:"credential,omitempty"`
	// Retired are the digests of credentials rotated away, newest last, at most 16.
	Retired []Credential `bson:"retired,omitempty" json:"-"`
	// Relays are the relay registrations recorded for the cluster, live or not.
	Relays []Registration `bson:"relays,omitempty" json:"relays,omitempty"`
	// Revision guards every change: each write is one compare-and-set on it.
	Revision int64 `bson:"revision" json:"revision"`
}

// Credential is one generation of a cluster's relay credential: only its SHA-256 digest is kept.
type Credential struct {
	Digest     string    `bson:"digest" json:"-"`
	Generation int64     `bson:"generation" json:"generation"`
	IssuedAt   time.Time `bson:"issued_at" json:"issued_at"`
}

// Registration is one relay's registration (docs/relay.md section 10): who it is, where it
// listens, the sequence that only grows within its process and the credential generation it
// was accepted under.
type Registration struct {
	RelayID    string `bson:"relay_id" json:"relay_id"`
	Build      string `bson:"build" json:"build"`
	NodeID     string `bson:"node_id,omitempty" json:"node_id,omitempty"`
	Address    string `bson:"address" json:"address"`
	Sequence   uint64 `bson:"sequence" json:"sequence"`
	Generation int64  `bson:"generation" json:"generation"`
	// Core names the berthd process serving the relay's session.
	Core         string    `bson:"core,omitempty" json:"core,omitempty"`
	RegisteredAt time.Time `bson:"registered_at" json:"registered_at"`
	RenewedAt    time.Time `bson:"renewed_at" json:"renewed_at"`
}

// Live reports whether r is a registration of the cluster's current generation renewed within
// LiveFor of now.
func (r Registration) Live(c *Cluster, now time.Time) bool {
	return c.Credential != nil && r.Generation == c.Credential.Generation && now.Sub(r.RenewedAt) < LiveFor
}

// Registry reads and writes clusters.
type Registry struct {
	st  *store.Store
	now func() time.Time
}

// New returns a Registry over s; now may be nil (time.Now).
func New(s *store.Store, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{st: s, now: now}
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName reports whether name is a cluster name: a DNS label (lowercase letters, digits and
// inner hyphens, 1 to 63 characters).
func ValidName(name string) bool { return nameRE.MatchString(name) }

// EnsureDefault records the default cluster when it is missing; idempotent.
func (r *Registry) EnsureDefault(ctx context.Context) error {
	_, err := r.Create(ctx, Default, false)
	if errors.Is(err, ErrExists) {
		return nil
	}
	return err
}

// Create records a new cluster. Errors: ErrInvalid for a bad name, ErrExists when taken.
func (r *Registry) Create(ctx context.Context, name string, requiresRelay bool) (*Cluster, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("%w: cluster name %q must be a DNS label (lowercase letters, digits, inner hyphens, at most 63)", ErrInvalid, name)
	}
	c := &Cluster{Name: name, RequiresRelay: requiresRelay, CreatedAt: r.now().UTC()}
	if err := r.st.Insert(ctx, coll, c); err != nil {
		if store.IsDuplicateKey(err) {
			return nil, fmt.Errorf("cluster %s: %w", name, ErrExists)
		}
		return nil, fmt.Errorf("create cluster %s: %w", name, err)
	}
	return c, nil
}

// Get returns the cluster from the store. Errors: ErrNotFound.
func (r *Registry) Get(ctx context.Context, name string) (*Cluster, error) {
	var c Cluster
	err := r.st.Get(ctx, coll, name, &c)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("cluster %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read cluster %s: %w", name, err)
	}
	return &c, nil
}

// RequiresRelay reports whether the cluster named requires a relay; false for a cluster that
// does not exist (its nodes are refused elsewhere). Errors: the store's.
func (r *Registry) RequiresRelay(ctx context.Context, name string) (bool, error) {
	c, err := r.Get(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return c.RequiresRelay, nil
}

// List returns every cluster, ordered by name.
func (r *Registry) List(ctx context.Context) ([]Cluster, error) {
	var out []Cluster
	if err := r.st.All(ctx, coll, &out); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Cluster) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, nil
}

// update applies fn to the current document and writes it with one compare-and-set, retrying
// lost races under store.RetryOnConflict. fn returns the fields to set, or an error that ends
// the update.
func (r *Registry) update(ctx context.Context, name string, fn func(c *Cluster) (store.Fields, error)) (*Cluster, error) {
	var out *Cluster
	err := store.RetryOnConflict(ctx, func() error {
		c, err := r.Get(ctx, name)
		if err != nil {
			return err
		}
		set, err := fn(c)
		if err != nil || set == nil {
			out = c
			return err
		}
		rev, err := r.st.SetIfRevision(ctx, coll, name, c.Revision, set)
		if err != nil {
			return err
		}
		c.Revision = rev
		out = c
		return nil
	})
	return out, err
}

// EnsureCredential issues the cluster's first relay credential (generation 1) and returns its
// bearer, shown once. When the cluster holds one already it returns "" and that generation:
// the bearer is never shown again (rotate for a new one). Errors: ErrNotFound, ErrNoRelay.
func (r *Registry) EnsureCredential(ctx context.Context, name string) (bearer string, gen int64, err error) {
	c, err := r.update(ctx, name, func(c *Cluster) (store.Fields, error) {
		if !c.RequiresRelay {
			return nil, fmt.Errorf("cluster %s: %w", name, ErrNoRelay)
		}
		if c.Credential != nil {
			bearer = ""
			return nil, nil
		}
		tok, digest, err := identity.NewToken(identity.PrefixRelay)
		if err != nil {
			return nil, err
		}
		bearer = tok
		c.Credential = &Credential{Digest: digest, Generation: 1, IssuedAt: r.now().UTC()}
		return store.Fields{"credential": c.Credential}, nil
	})
	if err != nil {
		return "", 0, err
	}
	return bearer, c.Credential.Generation, nil
}

// RotateCredential replaces the cluster's relay credential with a new one of the next
// generation and returns its bearer, shown once. There is no overlap: the old bearer
// authenticates nothing from this write on, and every registration under it stops being live.
// Errors: ErrNotFound, ErrNoRelay.
func (r *Registry) RotateCredential(ctx context.Context, name string) (bearer string, gen int64, err error) {
	c, err := r.update(ctx, name, func(c *Cluster) (store.Fields, error) {
		if !c.RequiresRelay {
			return nil, fmt.Errorf("cluster %s: %w", name, ErrNoRelay)
		}
		tok, digest, err := identity.NewToken(identity.PrefixRelay)
		if err != nil {
			return nil, err
		}
		bearer = tok
		next := int64(1)
		retired := c.Retired
		if c.Credential != nil {
			next = c.Credential.Generation + 1
			retired = append(retired, *c.Credential)
			if len(retired) > maxRetired {
				retired = retired[len(retired)-maxRetired:]
			}
		}
		c.Credential = &Credential{Digest: digest, Generation: next, IssuedAt: r.now().UTC()}
		return store.Fields{"credential": c.Credential, "retired": retired}, nil
	})
	if err != nil {
		return "", 0, err
	}
	return bearer, c.Credential.Generation, nil
}

// AuthenticateRelay returns the cluster and generation whose current relay credential is bearer.
// Errors: ErrCredentialStale for the bearer of a generation rotated away (with that generation
// named), identity.ErrUnauthenticated for any other bearer, a wrapped store error when the store
// cannot answer. It reads every cluster: it runs once per relay session, never per request.
func (r *Registry) AuthenticateRelay(ctx context.Context, bearer string) (*Cluster, int64, error) {
	if !identity.WellFormed(bearer, identity.PrefixRelay) {
		return nil, 0, identity.ErrUnauthenticated
	}
	all, err := r.List(ctx)
	if err != nil {
		return nil, 0, err
	}
	for i := range all {
		c := &all[i]
		if c.Credential != nil && identity.CheckBearer(bearer, identity.PrefixRelay, c.Credential.Digest) {
			return c, c.Credential.Generation, nil
		}
		for _, old := range c.Retired {
			if identity.CheckBearer(bearer, identity.PrefixRelay, old.Digest) {
				return c, old.Generation, fmt.Errorf("cluster %s: generation %d, current %d: %w", c.Name, old.Generation, c.Credential.Generation, ErrCredentialStale)
			}
		}
	}
	return nil, 0, identity.ErrUnauthenticated
}

// Register records reg for cluster name (docs/relay.md section 10): it replaces the relay's
// older registration and drops registrations that stopped being live long ago. Errors:
// ErrNotFound, ErrNoRelay, ErrInvalid (no relay id or address), ErrCredentialStale when
// reg.Generation is not the cluster's current one, ErrSequenceNotAdvancing when the relay
// already registered a sequence at or above reg.Sequence.
func (r *Registry) Register(ctx context.Context, name string, reg Registration) (*Cluster, error) {
	if reg.RelayID == "" || reg.Address == "" || reg.Sequence == 0 {
		return nil, fmt.Errorf("%w: a registration names the relay id, its bound address and a sequence above 0", ErrInvalid)
	}
	now := r.now().UTC()
	reg.RegisteredAt, reg.RenewedAt = now, now
	return r.update(ctx, name, func(c *Cluster) (store.Fields, error) {
		if !c.RequiresRelay {
			return nil, fmt.Errorf("cluster %s: %w", name, ErrNoRelay)
		}
		if c.Credential == nil || reg.Generation != c.Credential.Generation {
			return nil, fmt.Errorf("cluster %s: %w", name, ErrCredentialStale)
		}
		keep := []Registration{reg}
		for _, old := range c.Relays {
			if old.RelayID == reg.RelayID {
				if old.Sequence >= reg.Sequence {
					return nil, fmt.Errorf("relay %s: sequence %d after %d: %w", reg.RelayID, reg.Sequence, old.Sequence, ErrSequenceNotAdvancing)
				}
				continue
			}
			if now.Sub(old.RenewedAt) < 10*LiveFor {
				keep = append(keep, old)
			}
		}
		c.Relays = keep
		return store.Fields{"relays": keep}, nil
	})
}

// Renew marks the registration (relayID, seq) renewed now. Errors: ErrSuperseded when the relay
// registered a newer sequence or its registration is gone, ErrCredentialStale when the cluster's
// generation moved past the registration's, ErrNotFound.
func (r *Registry) Renew(ctx context.Context, name, relayID string, seq uint64) error {
	now := r.now().UTC()
	_, err := r.update(ctx, name, func(c *Cluster) (store.Fields, error) {
		i := slices.IndexFunc(c.Relays, func(x Registration) bool { return x.RelayID == relayID })
		if i < 0 || c.Relays[i].Sequence != seq {
			return nil, fmt.Errorf("relay %s session %d: %w", relayID, seq, ErrSuperseded)
		}
		if c.Credential == nil || c.Relays[i].Generation != c.Credential.Generation {
			return nil, fmt.Errorf("relay %s: %w", relayID, ErrCredentialStale)
		}
		regs := slices.Clone(c.Relays)
		regs[i].RenewedAt = now
		return store.Fields{"relays": regs}, nil
	})
	return err
}

// Unregister removes the registration (relayID, seq) when it is still the relay's newest; a
// superseded or missing one is left as it is (idempotent).
func (r *Registry) Unregister(ctx context.Context, name, relayID string, seq uint64) error {
	_, err := r.update(ctx, name, func(c *Cluster) (store.Fields, error) {
		i := slices.IndexFunc(c.Relays, func(x Registration) bool { return x.RelayID == relayID && x.Sequence == seq })
		if i < 0 {
			return nil, nil
		}
		return store.Fields{"relays": slices.Delete(slices.Clone(c.Relays), i, i+1)}, nil
	})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// Elect returns the one live registered relay of c at now (docs/relay.md section 11). Errors:
// ErrNotConnected when there is none, ErrAmbiguous (with the relays named) when there are two
// or more: the core never chooses between them.
func Elect(c *Cluster, now time.Time) (Registration, error) {
	var live []Registration
	for _, r := range c.Relays {
		if r.Live(c, now) {
			live = append(live, r)
		}
	}
	switch len(live) {
	case 0:
		return Registration{}, fmt.Errorf("cluster %s: %w", c.Name, ErrNotConnected)
	case 1:
		return live[0], nil
	}
	ids := make([]string, len(live))
	for i, r := range live {
		ids[i] = r.RelayID + "@" + r.Address
	}
	return Registration{}, fmt.Errorf("cluster %s: relays %v: %w", c.Name, ids, ErrAmbiguous)
}

// Elect is [Elect] on the stored cluster name, read from the store.
func (r *Registry) Elect(ctx context.Context, name string) (Registration, error) {
	c, err := r.Get(ctx, name)
	if err != nil {
		return Registration{}, err
	}
	return Elect(c, r.now())
}
