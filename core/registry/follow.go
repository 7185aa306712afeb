package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/store"
)

// FollowState is where deploy on push stands for a release (docs/registry.md section 8).
type FollowState string

// Follow states. Pending is the only one the [FollowWorker] acts on; the others are outcomes,
// kept until the next push of the tag writes a new pending follow.
const (
	FollowPending  FollowState = "pending"  // owed: written with the push, not settled yet
	FollowFollowed FollowState = "followed" // every service that follows the tag runs the digest
	FollowRefused  FollowState = "refused"  // admission refused the change; Reason says why
	FollowFailed   FollowState = "failed"   // the follow failed FollowWorkerConfig.Retry.MaxAttempts times
)

// ReleaseFollow is deploy on push's durable work for one release: the sub-document "follow" of
// the release record. [Releases.Record] writes it pending in the compare-and-set that moves the
// tag, so it is owed as soon as the push is; the [FollowWorker] settles it with a second
// compare-and-set on the same document.
type ReleaseFollow struct {
	State FollowState `bson:"state" json:"state"`
	// Digest is the digest to follow: what the push that wrote the follow recorded.
	Digest string `bson:"digest" json:"digest"`
	// Reason is why a follow was refused ("policy: <the policy's reasons>") or failed, and, while
	// pending after a failed attempt, that attempt's error.
	Reason string `bson:"reason,omitempty" json:"reason,omitempty"`
	// Attempts counts the failed attempts so far (refusals are not retried).
	Attempts int `bson:"attempts" json:"attempts"`
	// NextAt is when a pending follow that failed is tried again; zero: at once.
	NextAt    time.Time `bson:"next_at,omitempty" json:"next_at,omitzero"`
	UpdatedAt time.Time `bson:"updated_at" json:"updated_at"`
	// Actor and ActorKind name the principal that pushed; the services' change-log entries are
	// attributed to it.
	Actor     string `bson:"actor,omitempty" json:"-"`
	ActorKind string `bson:"actor_kind,omitempty" json:"-"`
}

// FollowRequest asks a [Follower] to roll the services that follow Repository:Tag to Digest.
type FollowRequest struct {
	Repository string // "<project>/<repo>"
	Tag        string
	Digest     string // "sha256:<hex>", what the release record names now
	// Actor pushed the digest; the follower attributes its writes to it.
	Actor changelog.Actor
}

// FollowResult is what a [Follower] did.
type FollowResult struct {
	// Followers is how many services follow the tag (written now or already at the digest).
	// Zero: none does, and the release shows no follow.
	Followers int
}

// Follower rolls the services that follow a tag (deploy_on_push) to a digest: berthd wires it
// to the service catalog. Follow is called by the [FollowWorker] for the newest digest of a
// release, possibly more than once for one push (after a restart, on another replica, or after
// a failed attempt), so it must be idempotent: a service already at the digest, or no longer
// following the tag, is left alone. Its errors are classified by FollowWorkerConfig.Refusal: a
// refusal is final, anything else is retried with backoff.
type Follower interface {
	Follow(ctx context.Context, req FollowRequest) (FollowResult, error)
}

// FollowerFunc adapts a function to [Follower].
type FollowerFunc func(ctx context.Context, req FollowRequest) (FollowResult, error)

// Follow calls f.
func (f FollowerFunc) Follow(ctx context.Context, req FollowRequest) (FollowResult, error) {
	return f(ctx, req)
}

// DefaultFollowAttempts is how many failed attempts a follow takes before it is failed, when
// FollowWorkerConfig.Retry.MaxAttempts is zero.
const DefaultFollowAttempts = 5

// DefaultFollowRescan is how often the worker re-reads the pending follows from the store, when
// FollowWorkerConfig.Rescan is zero.
const DefaultFollowRescan = 5 * time.Minute

// maxFollowReason bounds a stored reason, in bytes.
const maxFollowReason = 512

// FollowWorkerConfig wires a [FollowWorker]. Releases and Follower are required.
type FollowWorkerConfig struct {
	Releases *Releases
	Follower Follower
	// Retry paces failed attempts with the operation queue's backoff ([operations.Policy.Backoff]:
	// BaseDelay doubled per attempt up to MaxDelay; zero values: 1 s and 5 min) and bounds them
	// (MaxAttempts; zero: DefaultFollowAttempts). LeaseTTL is not used.
	Retry operations.Policy
	// Rescan is how often the pending follows are read from the store again, to pick up those a
	// push on another replica wrote and that replica did not settle; zero: DefaultFollowRescan.
	// They are always read when Run starts.
	Rescan time.Duration
	// Refusal reports whether err is an admission refusal, and the reason shown on the release;
	// nil: a *policy.DeniedError anywhere in err's chain, reason "policy: <its reasons>".
	Refusal func(err error) (reason string, ok bool)
	// Logger; nil discards.
	Logger *slog.Logger
	// Metrics, when not nil, receives berth_registry_follows_total{outcome} and
	// berth_registry_follows_pending (docs/operating.md "Metrics").
	Metrics prometheus.Registerer
}

// FollowWorker settles the pending follows of deploy on push (docs/registry.md section 8).
//
// Lifecycle:
//  1. [Releases.Record] writes a pending follow with each push that moves a tag.
//  2. [FollowWorker.OnPush] (Config.OnPush) records the push and wakes the worker for it, so the
//     follow normally runs at once, after the push is answered.
//  3. [FollowWorker.Run] reads every pending follow when it starts (those a stopped berthd
//     owed) and again every Rescan, calls the Follower for the digest the release names then,
//     and writes the outcome with a compare-and-set at the revision it read. A lost
//     compare-and-set means a newer push was recorded meanwhile: the release is read again and
//     followed again, so the newest push is the one the services end on.
//
// One worker handles one release at a time, so within one berthd an older push never rolls a
// service after a newer one. A worker is safe for concurrent use; Run is called once.
type FollowWorker struct {
	cfg FollowWorkerConfig
	log *slog.Logger

	mu   sync.Mutex
	due  map[string]time.Time // release id -> not before; zero: at once. mu must be held
	wake chan struct{}

	// behind holds, by release id, the digest this worker followed when its outcome write lost
	// to a newer push of the tag: Run's goroutine only.
	behind map[string]string

	settled *prometheus.CounterVec // by outcome
}

// NewFollowWorker returns a worker; it does nothing until Run. It panics, as MustRegister does,
// when cfg.Metrics holds its metrics already.
func NewFollowWorker(cfg FollowWorkerConfig) *FollowWorker {
	if cfg.Retry.MaxAttempts <= 0 {
		cfg.Retry.MaxAttempts = DefaultFollowAttempts
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = DefaultFollowRescan
	}
	if cfg.Refusal == nil {
		cfg.Refusal = policyRefusal
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &FollowWorker{cfg: cfg, log: cfg.Logger, due: map[string]time.Time{}, wake: make(chan struct{}, 1), behind: map[string]string{},
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_registry_follows_total",
			Help: "Deploy-on-push follows settled or retried, by outcome (followed, refused, failed, retry, none)."}, []string{"outcome"})}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(w.settled, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_registry_follows_pending",
			Help: "Deploy-on-push follows this berthd knows are owed and not settled yet."}, func() float64 {
			w.mu.Lock()
			defer w.mu.Unlock()
			return float64(len(w.due))
		}))
	}
	return w
}

// policyRefusal is the default FollowWorkerConfig.Refusal.
func policyRefusal(err error) (string, bool) {
	var de *policy.DeniedError
	if !errors.As(err, &de) {
		return "", false
	}
	return "policy: " + strings.Join(de.Reasons, "; "), true
}

// OnPush is Config.OnPush with deploy on push: it records p ([Releases.Record], which writes
// the pending follow) and wakes the worker for the release. It returns only the record's
// error: a push recorded is answered as stored, whatever its follow later does.
func (w *FollowWorker) OnPush(ctx context.Context, p Push) error {
	if err := w.cfg.Releases.Record(ctx, p); err != nil {
		return err
	}
	if !isDigestRef(p.Reference) && p.Digest != "" {
		w.Notify(p.Repository, p.Reference)
	}
	return nil
}

// Notify asks the worker to look at the release repo:tag at once. It never blocks; a release
// with no pending follow is read and left alone.
func (w *FollowWorker) Notify(repo, tag string) {
	w.mu.Lock()
	w.due[releaseID(repo, tag)] = time.Time{}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run settles pending follows until ctx ends. It reads the pending follows from the store
// first, then works on what Notify and the periodic rescan bring. A follow under way when ctx
// ends stays pending in the store, for the next Run.
func (w *FollowWorker) Run(ctx context.Context) {
	w.rescan(ctx)
	rescan := time.NewTicker(w.cfg.Rescan)
	defer rescan.Stop()
	for {
		var timer <-chan time.Time
		var t *time.Timer
		if next, ok := w.nextDue(); ok {
			t = time.NewTimer(time.Until(next))
			timer = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-w.wake:
		case <-timer:
		case <-rescan.C:
			w.rescan(ctx)
		}
		if t != nil {
			t.Stop()
		}
		w.runDue(ctx)
	}
}

// rescan adds every pending follow of the store to the due set.
func (w *FollowWorker) rescan(ctx context.Context) {
	ids, err := w.cfg.Releases.pendingFollows(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Error("registry: read pending deploy-on-push follows; trying again at the next rescan", "err", err, "rescan", w.cfg.Rescan)
		}
		return
	}
	w.mu.Lock()
	for _, id := range ids {
		if _, ok := w.due[id]; !ok {
			w.due[id] = time.Time{}
		}
	}
	w.mu.Unlock()
}

// nextDue returns the earliest time in the due set.
func (w *FollowWorker) nextDue() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	found := false
	for _, at := range w.due {
		if !found || at.Before(first) {
			first, found = at, true
		}
	}
	return first, found
}

// runDue takes one step on each release due now, one at a time.
func (w *FollowWorker) runDue(ctx context.Context) {
	now := time.Now()
	w.mu.Lock()
	var ids []string
	for id, at := range w.due {
		if !at.After(now) {
			ids = append(ids, id)
			delete(w.due, id)
		}
	}
	w.mu.Unlock()
	for _, id := range ids {
		if ctx.Err() != nil {
			return
		}
		at, again := w.step(ctx, id)
		if !again {
			continue
		}
		w.mu.Lock()
		if cur, ok := w.due[id]; !ok || at.Before(cur) {
			w.due[id] = at
		}
		w.mu.Unlock()
	}
}

// step reads release id and, when its follow is pending and due, follows the digest it names
// and writes the outcome. It reports whether to look at the release again, and when.
func (w *FollowWorker) step(ctx context.Context, id string) (time.Time, bool) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	rel, err := w.cfg.Releases.getID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return time.Time{}, false
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Error("registry: read release to follow", "release", id, "err", err)
		}
		return now.Add(w.cfg.Retry.Backoff(1)), true
	}
	f := rel.Follow
	followed, wasBehind := w.behind[id]
	delete(w.behind, id)
	if f == nil || f.State != FollowPending {
		if wasBehind && f != nil && f.State == FollowFollowed && followed != rel.Digest {
			w.catchUp(ctx, rel)
		}
		return time.Time{}, false
	}
	if now.Before(f.NextAt) {
		return f.NextAt, true
	}
	res, ferr := w.cfg.Follower.Follow(ctx, FollowRequest{Repository: rel.Repository, Tag: rel.Tag, Digest: rel.Digest,
		Actor: changelog.Actor{Type: f.ActorKind, ID: f.Actor}})
	if ctx.Err() != nil {
		return time.Time{}, false // stopping: the follow stays pending in the store
	}
	next, outcome := w.settle(f, rel.Digest, res, ferr, now)
	ok, err := w.cfg.Releases.settleFollow(ctx, rel, next)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.log.Error("registry: write deploy-on-push outcome", "release", id, "outcome", outcome, "err", err)
		}
		return now.Add(w.cfg.Retry.Backoff(1)), true
	case !ok:
		// A newer push was recorded (or another replica settled it): read it again at once.
		w.behind[id] = rel.Digest
		return time.Time{}, true
	}
	w.settled.WithLabelValues(outcome).Inc()
	attrs := []any{"repository", rel.Repository, "tag", rel.Tag, "digest", rel.Digest, "outcome", outcome, "followers", res.Followers}
	switch outcome {
	case "retry":
		w.log.Warn("registry: deploy on push failed; retrying", append(attrs, "attempt", next.Attempts, "next_at", next.NextAt, "err", ferr)...)
		return next.NextAt, true
	case string(FollowRefused), string(FollowFailed):
		w.log.Warn("registry: deploy on push did not roll the services", append(attrs, "reason", next.Reason)...)
	default:
		w.log.Info("registry: deploy on push settled", attrs...)
	}
	return time.Time{}, false
}

// catchUp follows rel's digest once more after this worker followed an older one of the tag
// while another replica (which wrote the outcome) followed rel's: the older write may have
// landed last. The follow is idempotent, so services already at the digest are left alone. Its
// error is logged: the outcome stays the other replica's.
func (w *FollowWorker) catchUp(ctx context.Context, rel *Release) {
	_, err := w.cfg.Follower.Follow(ctx, FollowRequest{Repository: rel.Repository, Tag: rel.Tag, Digest: rel.Digest,
		Actor: changelog.Actor{Type: rel.Follow.ActorKind, ID: rel.Follow.Actor}})
	if err != nil && ctx.Err() == nil {
		w.log.Error("registry: follow the newest push again after following an older one", "repository", rel.Repository, "tag", rel.Tag, "digest", rel.Digest, "err", err)
	}
}

// settle decides what a follow attempt leaves on the release: nil when no service follows the
// tag. outcome names it for logs and metrics.
func (w *FollowWorker) settle(f *ReleaseFollow, digest string, res FollowResult, ferr error, now time.Time) (next *ReleaseFollow, outcome string) {
	n := *f
	n.Digest, n.UpdatedAt, n.NextAt = digest, now, time.Time{}
	switch {
	case ferr == nil && res.Followers == 0:
		return nil, "none"
	case ferr == nil:
		n.State, n.Reason = FollowFollowed, ""
		return &n, string(FollowFollowed)
	}
	if reason, ok := w.cfg.Refusal(ferr); ok {
		n.State, n.Reason = FollowRefused, bounded(reason)
		return &n, string(FollowRefused)
	}
	n.Attempts++
	n.Reason = bounded(ferr.Error())
	if n.Attempts >= w.cfg.Retry.MaxAttempts {
		n.State = FollowFailed
		return &n, string(FollowFailed)
	}
	n.NextAt = now.Add(w.cfg.Retry.Backoff(n.Attempts))
	return &n, "retry"
}

func bounded(s string) string {
	if len(s) <= maxFollowReason {
		return s
	}
	return s[:maxFollowReason-3] + "..."
}

// getID returns the release with _id id, or an error wrapping store.ErrNotFound.
func (r *Releases) getID(ctx context.Context, id string) (*Release, error) {
	var rel Release
	if err := store.FindByID(ctx, r.coll, id, &rel); err != nil {
		return nil, fmt.Errorf("read release %s: %w", id, err)
	}
	return &rel, nil
}

// settleFollow writes f (nil: none) as rel's follow, one compare-and-set at rel.Revision. It
// reports false, writing nothing, when the release changed since rel was read or is gone.
func (r *Releases) settleFollow(ctx context.Context, rel *Release, f *ReleaseFollow) (bool, error) {
	update := bson.M{"$set": bson.M{"follow": f}}
	if f == nil {
		update = bson.M{"$unset": bson.M{"follow": ""}}
	}
	_, err := r.st.UpdateIfRevision(ctx, r.coll, rel.ID, rel.Revision, update)
	switch {
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("settle the follow of release %s: %w", rel.ID, err)
	}
	return true, nil
}

// pendingFollows returns the ids of the releases whose follow is pending. It filters on a field,
// so it reads the whole collection: for start-up and the worker's periodic rescan, not hot paths.
func (r *Releases) pendingFollows(ctx context.Context) ([]string, error) {
	cur, err := r.coll.Find(ctx, bson.M{"follow.state": string(FollowPending)})
	if err != nil {
		return nil, fmt.Errorf("read pending follows: %w", err)
	}
	var out []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("read pending follows: %w", err)
	}
	ids := make([]string, len(out))
	for i, o := range out {
		ids[i] = o.ID
	}
	return ids, nil
}
