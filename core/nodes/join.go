package nodes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Lifetimes of join tokens and join codes (docs/joining.md section 1).
const (
	// DefaultJoinTokenTTL is the lifetime of a join token when none is asked for.
	DefaultJoinTokenTTL = time.Hour
	// MaxJoinTokenTTL bounds the lifetime an operator may ask for a join token.
	MaxJoinTokenTTL = 7 * 24 * time.Hour
	// DefaultJoinCodeTTL is the lifetime of a join code when none is asked for.
	DefaultJoinCodeTTL = 30 * time.Minute
	// MaxJoinCodeTTL bounds the lifetime of a join code.
	MaxJoinCodeTTL = 24 * time.Hour
)

// JoinCodeLen is the length of a join code: 16 characters of lower-case
// base32 (80 random bits).
const JoinCodeLen = 16

// ErrJoinCodeInvalid is returned by [Registry.CheckJoinCode] for a code that is
// unknown, expired or already used: one answer for the three, so that the
// setup script route tells a guesser nothing more.
var ErrJoinCodeInvalid = errors.New("berth: join code is invalid, expired, or already used")

// joinToken is a document in collection "join_tokens", keyed by the digest of
// the token or code. Every join made since join codes exist reserves the id of
// the node it enrolls (ReservedNode): the enrollment that inserts that node is
// the one compare-and-set that consumes it, so the node and the consumption
// are one durable step and a second enrollment finds the node's id taken.
// A document without ReservedNode (made by an older berthd) is consumed by
// its own compare-and-set first ([Registry.consumeJoinToken]).
type joinToken struct {
	Digest       string            `bson:"_id"`
	CreatedAt    time.Time         `bson:"created_at"`
	ExpiresAt    time.Time         `bson:"expires_at"`
	UsedAt       *time.Time        `bson:"used_at,omitempty"`
	NodeID       string            `bson:"node_id,omitempty"`
	ReservedNode string            `bson:"reserved_node,omitempty"`
	Code         bool              `bson:"code,omitempty"`
	Labels       map[string]string `bson:"labels,omitempty"`
	MachineID    string            `bson:"machine_id,omitempty"`
	// Cluster is the cluster the enrolled node joins; "" is the default cluster.
	Cluster string `bson:"cluster,omitempty"`
}

// JoinRequest asks for a join token or a join code.
type JoinRequest struct {
	// Code asks for a short join code (for a setup script URL or a server's
	// user data) instead of a join token.
	Code bool
	// TTL is the lifetime; zero means the default of the kind
	// (DefaultJoinTokenTTL, DefaultJoinCodeTTL). More than the kind's maximum
	// is refused with ErrInvalid.
	TTL time.Duration
	// Labels are given to the node the join enrolls, over the ones its agent
	// declares.
	Labels map[string]string
	// MachineID names the machine the join was made for (docs/machines.md);
	// empty for an operator's join.
	MachineID string
	// Cluster is the cluster the enrolled node joins ("" is the default
	// cluster); the caller checked that it exists.
	Cluster string
}

// Join is a join token or code just made. Secret is shown once; only its
// digest is stored.
type Join struct {
	Secret    string
	NodeID    string // the id the enrolled node will have
	ExpiresAt time.Time
}

// CreateJoin makes a one-time join token or join code. Errors: wrapping
// ErrInvalid for a lifetime beyond the kind's maximum, or a store error.
func (r *Registry) CreateJoin(ctx context.Context, req JoinRequest) (Join, error) {
	def, max := DefaultJoinTokenTTL, MaxJoinTokenTTL
	if req.Code {
		def, max = DefaultJoinCodeTTL, MaxJoinCodeTTL
	}
	if req.TTL <= 0 {
		req.TTL = def
	}
	if req.TTL > max {
		return Join{}, fmt.Errorf("%w: a join lasts at most %s", ErrInvalid, max)
	}
	var secret, digest string
	var err error
	if req.Code {
		secret, err = newJoinCode()
		digest = identity.Digest(secret)
	} else {
		secret, digest, err = identity.NewToken(identity.PrefixJoin)
	}
	if err != nil {
		return Join{}, err
	}
	now := r.now().UTC()
	jt := joinToken{Digest: digest, CreatedAt: now, ExpiresAt: now.Add(req.TTL), ReservedNode: identity.NewID("nod_"),
		Code: req.Code, Labels: maps.Clone(req.Labels), MachineID: req.MachineID, Cluster: req.Cluster}
	if _, err := r.tokens.InsertOne(ctx, jt); err != nil {
		return Join{}, fmt.Errorf("store join token: %w", err)
	}
	return Join{Secret: secret, NodeID: jt.ReservedNode, ExpiresAt: jt.ExpiresAt}, nil
}

// CreateJoinToken makes a one-time join token valid for ttl (zero means
// DefaultJoinTokenTTL): [Registry.CreateJoin] without a code.
func (r *Registry) CreateJoinToken(ctx context.Context, ttl time.Duration) (token string, expires time.Time, err error) {
	return r.CreateClusterJoinToken(ctx, ttl, "")
}

// CreateClusterJoinToken is [Registry.CreateJoinToken] for a node of cluster ("" is the default
// cluster). The caller checked that the cluster exists.
func (r *Registry) CreateClusterJoinToken(ctx context.Context, ttl time.Duration, cluster string) (token string, expires time.Time, err error) {
	j, err := r.CreateJoin(ctx, JoinRequest{TTL: ttl, Cluster: cluster})
	return j.Secret, j.ExpiresAt, err
}

var joinCodeEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func newJoinCode() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new join code: read random bytes: %w", err)
	}
	return joinCodeEncoding.EncodeToString(b[:]), nil
}

// WellFormedJoinCode reports whether s has the shape of a join code.
func WellFormedJoinCode(s string) bool {
	if len(s) != JoinCodeLen {
		return false
	}
	_, err := joinCodeEncoding.DecodeString(s)
	return err == nil
}

// CheckJoinCode returns nil while code can still enroll a node: known, a
// code (not a token), unexpired and unused (its node not enrolled). Every
// other answer is exactly ErrJoinCodeInvalid, or a wrapped store error. It
// reads by _id only.
func (r *Registry) CheckJoinCode(ctx context.Context, code string) error {
	if !WellFormedJoinCode(code) {
		return ErrJoinCodeInvalid
	}
	var jt joinToken
	err := store.FindByID(ctx, r.tokens, identity.Digest(code), &jt)
	if errors.Is(err, store.ErrNotFound) {
		return ErrJoinCodeInvalid
	}
	if err != nil {
		return fmt.Errorf("read join code: %w", err)
	}
	if !jt.Code || jt.UsedAt != nil || !jt.ExpiresAt.After(r.now()) {
		return ErrJoinCodeInvalid
	}
	if _, err := r.Get(ctx, jt.ReservedNode); err == nil {
		return ErrJoinCodeInvalid // enrolled; the used mark was not written yet
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Enroll consumes the join token or code and records the node as pending. It
// returns the node and its credential, which is shown once and stored only as
// a digest. Errors: ErrJoinTokenUsed, ErrJoinTokenExpired (also for an unknown
// token), what Admit returned, or a store error.
//
// The node is inserted under the id its join reserved, and that insert is the
// consumption (docs/joining.md section 2): of two enrollments with one join,
// one inserts the node and the other is refused ErrJoinTokenUsed; an
// enrollment that stops before the insert leaves the join unused, to be tried
// again. The join document is marked used afterwards, for listings; a mark
// lost in a crash is read back from the node. A refusal by Admit uses nothing.
func (r *Registry) Enroll(ctx context.Context, req EnrollRequest) (*Node, string, error) {
	if pk, err := base64.StdEncoding.DecodeString(req.PublicKey); err != nil || len(pk) != ed25519.PublicKeySize {
		return nil, "", fmt.Errorf("public_key: %w", errBadKey)
	}
	if req.BoxPublicKey != "" {
		if bk, err := base64.StdEncoding.DecodeString(req.BoxPublicKey); err != nil || len(bk) != 32 {
			return nil, "", fmt.Errorf("box_public_key: %w", errBadKey)
		}
	}
	if err := req.Allocatable.Validate("allocatable"); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	now := r.now().UTC()
	digest := identity.Digest(req.JoinToken)
	var jt joinToken
	err := store.FindByID(ctx, r.tokens, digest, &jt)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, "", ErrJoinTokenExpired
	case err != nil:
		return nil, "", fmt.Errorf("read join token: %w", err)
	case jt.UsedAt != nil:
		return nil, "", ErrJoinTokenUsed
	case !jt.ExpiresAt.After(now):
		return nil, "", ErrJoinTokenExpired
	}
	nodeID := jt.ReservedNode
	legacy := nodeID == ""
	if legacy {
		nodeID = identity.NewID("nod_")
		if _, err := r.consumeJoinToken(ctx, digest, nodeID, now); err != nil {
			return nil, "", err
		}
	}
	cred, credDigest, err := identity.NewToken("brn_")
	if err != nil {
		return nil, "", err
	}
	labels := req.Labels
	if len(jt.Labels) > 0 {
		labels = maps.Clone(req.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, jt.Labels)
	}
	n := &Node{
		ID: nodeID, Hostname: req.Hostname, Region: req.Region, Labels: labels,
		Address: req.Address, CPUs: req.CPUs, MemoryMB: req.MemoryMB, PublicKey: req.PublicKey, BoxPublicKey: req.BoxPublicKey,
		Allocatable: req.Allocatable, CredentialDigest: credDigest, Status: StatusPending, EnrolledAt: now, Cluster: jt.Cluster,
	}
	if req.Admit != nil {
		if err := req.Admit(ctx, n); err != nil {
			return nil, "", err
		}
	}
	// The credential index first: a crash before the node is stored leaves
	// an entry whose digest is no node's, which authenticates nothing.
	if _, err := r.creds.InsertOne(ctx, credentialDoc{Digest: credDigest, NodeID: nodeID}); err != nil {
		return nil, "", fmt.Errorf("index node credential: %w", err)
	}
	if _, ok := changelog.ActorFrom(ctx); ok {
		// Enrollment is recorded with the new node as its actor: the join
		// token, not a principal, is the proof.
		p, err := changelog.Prepare(changelog.Change{ActorType: "node", ActorID: n.ID, EntityType: "node", EntityID: n.ID, Op: node.OpCreate, Payload: n.LogPayload()})
		if err != nil {
			return nil, "", fmt.Errorf("record node: %w", err)
		}
		n.LogOutbox = []changelog.Pending{p}
	}
	if _, err := r.nodes.InsertOne(ctx, n); err != nil {
		if store.IsDuplicateKey(err) && !legacy {
			_, _ = r.creds.DeleteOne(ctx, bson.D{{Key: "_id", Value: credDigest}}) // names a node that holds another credential
			return nil, "", ErrJoinTokenUsed
		}
		return nil, "", fmt.Errorf("record node: %w", err)
	}
	if !legacy {
		// Best effort: CheckJoinCode and Enroll read the node when the mark is missing.
		_, _ = r.tokens.UpdateOne(ctx, bson.D{{Key: "_id", Value: digest}}, bson.M{"$set": bson.M{"used_at": now, "node_id": nodeID}})
	}
	return n, cred, nil
}

// JoinCodeLabels validates labels given to a join code the way enrollment
// validates an agent's: keys of letters, digits, '.', '_', '-' and '/', at
// most 63 characters each, values at most 63.
func JoinCodeLabels(labels map[string]string) error {
	for k, v := range labels {
		if k == "" || len(k) > 63 || len(v) > 63 || strings.ContainsAny(k+v, " \t\n'\"\\$`=") {
			return fmt.Errorf("%w: label %q=%q: keys and values are at most 63 characters without spaces, quotes or '='", ErrInvalid, k, v)
		}
	}
	return nil
}
