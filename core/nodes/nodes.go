// Package nodes owns enrolled nodes: join tokens, enrollment, node credentials,
// session state and each node's signed desired-state revision.
package nodes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Errors of [Registry] methods.
var (
	// ErrJoinTokenUsed is returned by Enroll for a token that was consumed already.
	ErrJoinTokenUsed = errors.New("berth: join token already used")
	// ErrJoinTokenExpired is returned by Enroll for an expired or unknown token.
	ErrJoinTokenExpired = errors.New("berth: join token expired or unknown")
	// ErrNotFound is returned for a node id that does not exist.
	ErrNotFound = errors.New("berth: node not found")
	// ErrUnauthenticated is returned by Authenticate for every failure.
	// It is identity.ErrUnauthenticated, the one answer to every credential failure.
	ErrUnauthenticated = identity.ErrUnauthenticated
	// ErrConflict is returned by SetDesired when the node's revision moved.
	ErrConflict = errors.New("berth: node revision changed concurrently")
)

// Node statuses (docs/node-protocol.md section 2.5 and 4.4).
const (
	StatusPending      = "pending"
	StatusConnected    = "connected"
	StatusDisconnected = "disconnected"
	StatusDraining     = "draining"
	StatusRemoved      = "removed"
)

// Node is a node document in collection "nodes".
type Node struct {
	ID        string            `bson:"_id"`
	Hostname  string            `bson:"hostname"`
	Region    string            `bson:"region,omitempty"`
	Labels    map[string]string `bson:"labels,omitempty"`
	Address   string            `bson:"address"`
	CPUs      int               `bson:"cpus"`
	MemoryMB  int64             `bson:"memory_mb"`
	PublicKey string            `bson:"public_key"`
	// BoxPublicKey is the node's X25519 public key (base64) workload secrets are sealed to
	// (docs/node-protocol.md section 6.6); empty when the agent registered none.
	BoxPublicKey     string `bson:"box_public_key,omitempty"`
	CredentialDigest string `bson:"credential_digest"`
	Status           string `bson:"status"`
	// Cluster is the cluster the node belongs to, named by its join token; "" (a node enrolled
	// before clusters existed) is the default cluster ([Node.ClusterName]).
	Cluster      string     `bson:"cluster,omitempty"`
	Drivers      []string   `bson:"drivers,omitempty"`
	AgentVersion string     `bson:"agent_version,omitempty"`
	EnrolledAt   time.Time  `bson:"enrolled_at"`
	LastSeenAt   *time.Time `bson:"last_seen_at,omitempty"`
	SessionID    string     `bson:"session_id,omitempty"`
	// DesiredRev is the revision of DesiredSpec; it only increases.
	DesiredRev  int64  `bson:"desired_rev"`
	DesiredHash string `bson:"desired_hash,omitempty"`
	// DesiredSpec is the JSON of the node's abi/node.Spec at DesiredRev.
	DesiredSpec string `bson:"desired_spec,omitempty"`
	AppliedRev  int64  `bson:"applied_rev"`
	// FenceFailure lists the node's failed self-fences no operator has acknowledged yet; while
	// a lease is listed, it is granted to no node (docs/node-protocol.md section 8.5). Written
	// by core/fencing with one compare-and-set on FenceRev.
	FenceFailure []FenceFailure `bson:"fence_failure,omitempty"`
	// FenceAckPending lists lease ids whose acknowledgement the node has not yet confirmed
	// (command fence_ack, section 5.17).
	FenceAckPending []string `bson:"fence_ack_pending,omitempty"`
	// FenceAcked lists acknowledged lease ids whose lease documents are not yet updated: the
	// intent record of an acknowledgement in progress.
	FenceAcked []string `bson:"fence_acked,omitempty"`
	// FenceRev guards the three fence fields above; it increases by one on each change.
	FenceRev int64 `bson:"fence_rev,omitempty"`
	// Retirement is the node's retirement from placement, nil while it is a member
	// (docs/reconciliation.md section 10).
	Retirement *Retirement `bson:"retirement,omitempty"`
	// RetirementDisposition mirrors Retirement.Disposition as a top-level field, the
	// compare-and-set guard of retirement writes.
	RetirementDisposition string `bson:"retirement_disposition,omitempty"`
	// Networks names the node-network plugins its last hello reported
	// (network_versions, e.g. ["nftables"]), sorted; empty when it runs none.
	Networks []string `bson:"networks,omitempty"`

	// Allocatable is what the node's agent last reported it can give to workloads (at
	// enrollment, in hello and in status reports), after what the host keeps for itself.
	Allocatable Resources `bson:"allocatable,omitempty"`
	// ResourceLimits says how the node enforces a workload's memory and CPU limits, as its agent
	// reported it: "cgroup2", "cgroup1", "container", or "none: <why>" when limits are not
	// enforced; "" when unknown.
	ResourceLimits string `bson:"resource_limits,omitempty"`
	// ReportRev guards Allocatable and ResourceLimits; it increases by one on each change.
	ReportRev int64 `bson:"report_rev,omitempty"`
	// CapacityOverride is the operator's capacity (berth node set-capacity): each stated field
	// replaces the reported one in [Node.Capacity]; nil when none.
	CapacityOverride *Resources `bson:"capacity_override,omitempty"`
	// Cordoned reports whether the operator stopped new placements on the node.
	Cordoned bool `bson:"cordoned,omitempty"`
	// Drain is the node's drain, nil when it is not draining ([Node.Draining]).
	Drain *Drain `bson:"drain,omitempty"`
	// OpRev guards the operator's fields (CapacityOverride, Cordoned, Drain): every change is
	// one compare-and-set on it, and it increases by one on each.
	OpRev int64 `bson:"op_rev,omitempty"`

	// LogOutbox holds the node's changes not yet in the change log,
	// written with the change (docs/node-protocol.md section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
}

// ClusterName is the cluster n belongs to: [Node.Cluster], or clusters.Default when empty.
func (n *Node) ClusterName() string {
	if n.Cluster == "" {
		return clusters.Default
	}
	return n.Cluster
}

// Member reports whether n takes part in placement: enrolled, not removed and not retiring.
// An offline node stays a member.
func (n *Node) Member() bool { return n.Status != StatusRemoved && n.Retirement == nil }

// FenceFailure is one failed self-fence recorded on a node (docs/node-protocol.md section 8.5):
// the lease, its token and the workloads that may still run.
type FenceFailure struct {
	LeaseID      string    `bson:"lease_id" json:"lease_id"`
	ResourceID   string    `bson:"resource_id,omitempty" json:"resource_id,omitempty"`
	FencingToken int64     `bson:"fencing_token" json:"fencing_token"`
	WorkloadIDs  []string  `bson:"workload_ids" json:"workload_ids"`
	Detail       string    `bson:"detail,omitempty" json:"detail,omitempty"`
	At           time.Time `bson:"at" json:"at"`
}

// Registry reads and writes nodes and join tokens.
type Registry struct {
	st     *store.Store
	nodes  *mongo.Collection
	creds  *mongo.Collection // credentialDoc by digest
	tokens *mongo.Collection
	now    func() time.Time
	// tokMu serialises join-token consumption on the embedded store, whose one process is this
	// one: the consumption reads and updates by _id under it, instead of a filtered update
	// that scans the collection (DESIGN section 4) or the store's lock shared by every
	// compare-and-set.
	tokMu sync.Mutex
}

// NewRegistry returns a Registry over s. now may be nil (time.Now).
func NewRegistry(s *store.Store, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{st: s, nodes: s.Collection("nodes"), creds: s.Collection("node_credentials"), tokens: s.Collection("join_tokens"), now: now}
}

// EnsureIndexes creates the indexes the registry relies on; idempotent.
func (r *Registry) EnsureIndexes(ctx context.Context) error {
	_, err := r.nodes.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "credential_digest", Value: 1}},
		Options: options.Index().SetUnique(true).SetName("credential_digest"),
	})
	if err != nil {
		return fmt.Errorf("create node indexes: %w", err)
	}
	return nil
}

// EnrollRequest is what a node proves and declares at enrollment.
type EnrollRequest struct {
	JoinToken string
	PublicKey string // base64 std Ed25519 public key
	// BoxPublicKey is the base64 X25519 key secrets are sealed to; empty or 32 bytes.
	BoxPublicKey string
	Hostname     string
	Region       string
	Labels       map[string]string
	Address      string
	CPUs         int
	MemoryMB     int64
	// Allocatable is what the node says it can give to workloads ([Node.Allocatable]); zero
	// when the agent did not say (an older agent), until its first hello.
	Allocatable Resources
	// Admit, when not nil, is asked after the join token was consumed and
	// before the node is recorded (the node.enroll policy hook); its error is
	// returned as is and nothing is recorded. A refused enrollment uses up
	// its join token.
	Admit func(ctx context.Context, n *Node) error
}

// consumeJoinToken marks the join token whose digest is digest used by nodeID at now, once, and
// returns the cluster it names. Errors: ErrJoinTokenUsed, ErrJoinTokenExpired (also for an
// unknown token), or a store error. On the embedded store it is a read and an update by _id
// under tokMu; elsewhere one conditional update, atomic on the server.
func (r *Registry) consumeJoinToken(ctx context.Context, digest, nodeID string, now time.Time) (string, error) {
	if r.st.Embedded() {
		r.tokMu.Lock()
		defer r.tokMu.Unlock()
		var jt joinToken
		err := r.tokens.FindOne(ctx, bson.D{{Key: "_id", Value: digest}}).Decode(&jt)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return "", ErrJoinTokenExpired
		case err != nil:
			return "", fmt.Errorf("read join token: %w", err)
		case jt.UsedAt != nil:
			return "", ErrJoinTokenUsed
		case !jt.ExpiresAt.After(now):
			return "", ErrJoinTokenExpired
		}
		if _, err := r.tokens.UpdateOne(ctx, bson.D{{Key: "_id", Value: digest}}, bson.M{"$set": bson.M{"used_at": now, "node_id": nodeID}}); err != nil {
			return "", fmt.Errorf("consume join token: %w", err)
		}
		return jt.Cluster, nil
	}
	var jt joinToken
	err := r.tokens.FindOneAndUpdate(ctx,
		bson.M{"_id": digest, "used_at": bson.M{"$exists": false}, "expires_at": bson.M{"$gt": now}},
		bson.M{"$set": bson.M{"used_at": now, "node_id": nodeID}}).Decode(&jt)
	if errors.Is(err, mongo.ErrNoDocuments) {
		var jt joinToken
		err := r.tokens.FindOne(ctx, bson.M{"_id": digest}).Decode(&jt)
		if err == nil && jt.UsedAt != nil {
			return "", ErrJoinTokenUsed
		}
		return "", ErrJoinTokenExpired
	} else if err != nil {
		return "", fmt.Errorf("consume join token: %w", err)
	}
	return jt.Cluster, nil
}

var errBadKey = errors.New("not a base64 Ed25519 public key")

// LogPayload is n as the change log records it: what the cluster decided
// about the node, never its credential digest, and none of its session
// state (status, last seen, applied revision), which is observation, not a
// change of desired state (docs/node-protocol.md section 7.6).
func (n *Node) LogPayload() map[string]any {
	return map[string]any{
		"id": n.ID, "hostname": n.Hostname, "region": n.Region, "labels": n.Labels, "address": n.Address,
		"cpus": n.CPUs, "memory_mb": n.MemoryMB, "public_key": n.PublicKey, "box_public_key": n.BoxPublicKey, "enrolled_at": n.EnrolledAt.UTC(),
	}
}

// logChange prepares the change-log item of a change to node id when ctx
// carries the actor (changelog.WithActor); ok is false when it carries none.
func logChange(ctx context.Context, id, op string, payload any) (p changelog.Pending, ok bool, err error) {
	a, ok := changelog.ActorFrom(ctx)
	if !ok {
		return changelog.Pending{}, false, nil
	}
	p, err = changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: "node", EntityID: id, Op: op, Payload: payload})
	if err != nil {
		return changelog.Pending{}, false, fmt.Errorf("node %s: %w", id, err)
	}
	return p, true, nil
}

// IsBadKey reports whether err is Enroll's refusal of a malformed public key.
func IsBadKey(err error) bool { return errors.Is(err, errBadKey) }

// Authenticate returns the node whose credential is cred. It returns exactly
// ErrUnauthenticated when cred matches no node's current credential or its
// node was removed (a removed node never authenticates), and a wrapped store
// error when the store could not answer: the caller answers that as
// unavailable, never as a bad credential.
func (r *Registry) Authenticate(ctx context.Context, cred string) (*Node, error) {
	if cred == "" {
		return nil, ErrUnauthenticated
	}
	n, err := r.byCredential(ctx, identity.Digest(cred))
	if err != nil {
		return nil, err
	}
	if n.Status == StatusRemoved || !identity.CheckBearer(cred, identity.PrefixNode, n.CredentialDigest) {
		return nil, ErrUnauthenticated
	}
	return n, nil
}

// CredentialCurrent answers a check repeated on every request made with
// something issued to a node credential (the registry's short bearers,
// docs/registry.md section 9): nil while node id is enrolled under the
// credential whose digest is credDigest; exactly ErrUnauthenticated when the
// node is unknown, removed, or holds another credential; a wrapped store
// error when the store cannot answer. It reads the store's read view, so with
// the view on it costs a map lookup (plus one read by _id after the node was
// written).
func (r *Registry) CredentialCurrent(ctx context.Context, id, credDigest string) error {
	n, err := r.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return ErrUnauthenticated
	}
	if err != nil {
		return err
	}
	if n.Status == StatusRemoved || !identity.Equal(n.CredentialDigest, credDigest) {
		return ErrUnauthenticated
	}
	return nil
}

// Get returns one node or ErrNotFound.
func (r *Registry) Get(ctx context.Context, id string) (*Node, error) {
	var n Node
	err := r.st.View().Get(ctx, r.nodes, id, &n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", id, err)
	}
	return &n, nil
}

// List returns every node, ordered by id, from the store's read view.
func (r *Registry) List(ctx context.Context) ([]Node, error) {
	var out []Node
	if err := r.st.View().Find(ctx, r.nodes, nil, &out); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// SessionStarted marks the node connected under sessionID (the newest session
// wins) and records what its hello said: its agent version, its runtime
// drivers and the node-network plugins it runs (networks; none when absent).
func (r *Registry) SessionStarted(ctx context.Context, nodeID, sessionID, agentVersion string, drivers []string, networks ...string) error {
	now := r.now().UTC()
	set := bson.M{"$set": bson.M{"status": StatusConnected, "session_id": sessionID, "last_seen_at": now, "agent_version": agentVersion, "drivers": drivers, "networks": networks}}
	return store.RetryOnConflict(ctx, func() error {
		n, err := r.Get(ctx, nodeID)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("mark node %s connected: %w", nodeID, err)
		}
		if n.Status == StatusRemoved {
			return nil
		}
		ok, err := r.st.UpdateIf(ctx, r.nodes, nodeID, bson.D{{Key: "status", Value: n.Status}}, set)
		if err != nil {
			return fmt.Errorf("mark node %s connected: %w", nodeID, err)
		}
		if !ok {
			return fmt.Errorf("mark node %s connected: %w", nodeID, ErrConflict)
		}
		return nil
	}, ErrConflict)
}

// SessionEnded marks the node disconnected, but only while sessionID is still
// its current session (a newer session is not overwritten).
func (r *Registry) SessionEnded(ctx context.Context, nodeID, sessionID string) error {
	_, err := r.st.UpdateIf(ctx, r.nodes, nodeID, bson.D{{Key: "session_id", Value: sessionID}, {Key: "status", Value: StatusConnected}},
		bson.M{"$set": bson.M{"status": StatusDisconnected}})
	if err != nil {
		return fmt.Errorf("mark node %s disconnected: %w", nodeID, err)
	}
	return nil
}

// MarkAllDisconnected sets every connected node to disconnected; a core calls
// it at start, since no session survives a core restart.
func (r *Registry) MarkAllDisconnected(ctx context.Context) error {
	_, err := r.nodes.UpdateMany(ctx, bson.M{"status": StatusConnected}, bson.M{"$set": bson.M{"status": StatusDisconnected}})
	if err != nil {
		return fmt.Errorf("mark nodes disconnected: %w", err)
	}
	return nil
}

// Seen records a frame from the node and, when applied is not nil, its applied revision.
func (r *Registry) Seen(ctx context.Context, nodeID string, applied *int64) error {
	set := bson.M{"last_seen_at": r.now().UTC()}
	if applied != nil {
		set["applied_rev"] = *applied
	}
	if _, err := r.nodes.UpdateOne(ctx, bson.M{"_id": nodeID}, bson.M{"$set": set}); err != nil {
		return fmt.Errorf("record node %s seen: %w", nodeID, err)
	}
	return nil
}

// SetDesired stores a new desired spec for the node when its hash differs from
// the stored one, as one compare-and-set on the node's desired_rev. It returns
// the node's revision after the call and whether it changed. Errors: ErrConflict
// when another writer moved the revision first (the caller recomputes).
func (r *Registry) SetDesired(ctx context.Context, n *Node, hash, specJSON string) (int64, bool, error) {
	if n.DesiredHash == hash {
		return n.DesiredRev, false, nil
	}
	ok, err := r.st.UpdateIf(ctx, r.nodes, n.ID, bson.D{{Key: "desired_rev", Value: n.DesiredRev}},
		bson.M{"$set": bson.M{"desired_rev": n.DesiredRev + 1, "desired_hash": hash, "desired_spec": specJSON}})
	if err != nil {
		return 0, false, fmt.Errorf("store desired state of %s: %w", n.ID, err)
	}
	if !ok {
		return 0, false, ErrConflict
	}
	n.DesiredRev++
	n.DesiredHash = hash
	n.DesiredSpec = specJSON
	return n.DesiredRev, true, nil
}
