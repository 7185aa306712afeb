// Package deploy is the one home of every change to what a service runs: an API apply, a release
// promotion, a registry push to a followed tag, a secret's new version, a binding's credentials,
// an undo and the automatic rollback all become one [Change] that [Deployer.Apply] runs through
// one ordered chain: resolve, default, validate, admit (service.apply policies, told the cause),
// and write (one compare-and-set of the service with its change-log entry).
//
// A refusal by policy on a path that has no caller to answer it (a push, a rollover, a binding's
// publication, an automatic rollback) leaves the service as it was and is recorded where an
// operator looks: a deploy.refused event, the service's verdict, and a metric (docs/deploy.md).
package deploy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// Cause names what made a change; the service.apply policies see it as the input's cause.
type Cause = abiwasm.Cause

// The causes of a change to what a service runs.
const (
	// CauseAPIPut: PUT /projects/{p}/services/{s} (berth apply).
	CauseAPIPut = abiwasm.CauseAPIPut
	// CauseReleasePromote: POST .../releases/{tag}/promote.
	CauseReleasePromote = abiwasm.CauseReleasePromote
	// CauseRegistryPush: a push to a tag a deploy_on_push service follows.
	CauseRegistryPush = abiwasm.CauseRegistryPush
	// CauseSecretRollover: a new version of a secret (or a changed set) an unpinned reference takes.
	CauseSecretRollover = abiwasm.CauseSecretRollover
	// CauseBindingPublish: a ready binding's credentials added to its service.
	CauseBindingPublish = abiwasm.CauseBindingPublish
	// CauseRolloutUndo: POST .../rollout/undo.
	CauseRolloutUndo = abiwasm.CauseRolloutUndo
	// CauseAutoRollback: the automatic rollback of a rollout past its progress deadline.
	CauseAutoRollback = abiwasm.CauseAutoRollback
	// CauseRolloutRebalance: POST .../rebalance (berth rebalance) records replica moves.
	CauseRolloutRebalance = abiwasm.CauseRolloutRebalance
	// CauseRolloutPause: POST .../rollout/pause (berth rollout pause), judged by [Deployer.ControlRollout].
	CauseRolloutPause = abiwasm.CauseRolloutPause
	// CauseRolloutResume: POST .../rollout/resume (berth rollout resume).
	CauseRolloutResume = abiwasm.CauseRolloutResume
	// CauseRolloutRestart: POST .../rollout/restart (berth rollout restart).
	CauseRolloutRestart = abiwasm.CauseRolloutRestart
	// CauseJobControl: POST .../jobs/{name}/suspend or /resume (berth job suspend|resume).
	CauseJobControl = abiwasm.CauseJobControl
	// CauseJobCommand: POST .../services/{s}/run (berth run), judged by [Deployer.AdmitCommand].
	CauseJobCommand = abiwasm.CauseJobCommand
)

// Unattended reports whether no caller waits for the answer of a change of cause c, so a refusal
// must be recorded where an operator looks rather than answered: registry.push,
// secret.rollover, binding.publish and rollout.auto_rollback.
func Unattended(c Cause) bool {
	switch c {
	case CauseRegistryPush, CauseSecretRollover, CauseBindingPublish, CauseAutoRollback:
		return true
	}
	return false
}

// DomainChecker reports why no ACME challenge can prove a domain, or nil (certs.Config).
type DomainChecker interface {
	CheckDomain(host string) error
}

// ManifestChecker reports whether the registry still holds a manifest
// ([registry.Registry.ManifestExists]).
type ManifestChecker interface {
	ManifestExists(ctx context.Context, repo, digest string) (bool, error)
}

// Config is what a [Deployer] uses. Catalog is required; every other field may be left at its
// zero value, with the effect its comment names.
type Config struct {
	// Catalog holds projects and services; its ApplyService is the write.
	Catalog *services.Catalog
	// Runtime holds runtime specs and the refusal records the verdict shows. Required: New
	// panics without it (a wiring bug).
	Runtime *rollout.Store
	// Bundles resolves bundle names to digests; nil refuses a service that names a bundle by
	// name (bundle_not_found).
	Bundles *bundles.Store
	// Secrets checks and resolves secret references; nil refuses references (unavailable).
	Secrets *secrets.Store
	// Bindings checks and declares service bindings; nil refuses services with bindings
	// (binding_kind_unknown).
	Bindings *bindings.Manager
	// Policy runs the service.apply admission; nil admits everything.
	Policy *policy.Engine
	// Releases resolves image tags (deploy_on_push, promotion); nil answers every tag
	// image_release_not_found.
	Releases *registry.Releases
	// Manifests, when not nil, is asked whether the registry still holds a release's manifest
	// before a service is pointed at it; nil trusts the release record.
	Manifests ManifestChecker
	// RegistryHost is the host (and port) of Berth's registry in the image references written
	// for followed tags and promotions; empty leaves the host out of a follow's match.
	RegistryHost string
	// ACME says whether a tls mode acme domain can be proven; nil refuses tls mode acme
	// (tls_domain_unverifiable).
	ACME DomainChecker
	// Events, when not nil, receives a deploy.refused event for each refusal.
	Events *events.Log
	// Metrics, when not nil, registers berth_deploy_refusals_total{cause}.
	Metrics prometheus.Registerer
	// Logger receives the deployer's logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Deployer applies changes to services. Build one with [New]; it is safe for concurrent use.
type Deployer struct {
	cfg      Config
	log      *slog.Logger
	refusals *prometheus.CounterVec
}

// New returns a Deployer over cfg (see [Config] for its zero values).
func New(cfg Config) *Deployer {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Catalog == nil || cfg.Runtime == nil {
		panic("deploy: Config.Catalog and Config.Runtime are required") // a wiring bug
	}
	d := &Deployer{cfg: cfg, log: cfg.Logger.With("component", "deploy")}
	d.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_deploy_refusals_total",
		Help: "Changes to what a service runs that a service.apply policy refused, by cause.",
	}, []string{"cause"})
	for _, c := range abiwasm.Causes() {
		d.refusals.WithLabelValues(string(c)) // every cause reads 0 before its first refusal
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(d.refusals)
	}
	return d
}

// Change is one change to what a service runs.
type Change struct {
	// Cause says what made the change; required.
	Cause Cause
	// Project is the service's project; required.
	Project *services.Project
	// Service is the service's name; required.
	Service string
	// Actor is who made the change, recorded in the change log with its Idempotency-Key; the
	// zero value takes the actor of ctx (changelog.ActorFrom), else the system's.
	Actor changelog.Actor
	// PolicyActor is who made the change as the admission policies see it; the zero value
	// derives it from Actor.
	PolicyActor abiwasm.Actor
	// ExpectedRevision, when not nil, is the revision the caller read (0: the service must not
	// exist); another revision is a conflict, never retried. Nil writes over the revision read
	// here, and a lost compare-and-set runs the chain again.
	ExpectedRevision *int64
	// Spec is a whole declaration of the service (api.put): it is validated, resolved and
	// defaulted here. Exactly one of Spec and Next is set.
	Spec *client.ServiceSpec
	// Next returns the service to write from cur, the stored service (nil when absent), or an
	// error that ends the change. It must not modify cur. Fields left empty are resolved: a
	// bundle without its digest, a followed tag without the tag it follows, secret references
	// without ResolvedSecrets.
	Next func(cur *services.Service) (*services.Service, error)
	// MayTakeSecrets says the actor may make the service take secrets it does not take now
	// (secret:use, docs/api.md section 10.2); without it, a declaration that keeps the
	// references it has is pinned to the revision they were compared with.
	MayTakeSecrets bool
}

// Result is what [Deployer.Apply] did.
type Result struct {
	// Service is the service as written, or as stored when nothing was written.
	Service *services.Service
	// Outcome says whether the service was created, updated or left unchanged.
	Outcome services.PutOutcome
	// Warnings are the admission policies' warnings, also on a refusal.
	Warnings []string
}

// Changed reports whether the apply wrote the service.
func (r Result) Changed() bool {
	return r.Outcome == services.PutCreated || r.Outcome == services.PutUpdated
}

// ErrNoChange is returned by a [Change.Next] that finds nothing to do; Apply answers it with the
// stored service and PutUnchanged, and writes nothing.
var ErrNoChange = errors.New("deploy: nothing to change")

// Apply runs ch through the chain: read the stored service, build the next one (ch.Spec or
// ch.Next), resolve, default, validate, admit and write it with one compare-and-set carrying its
// change-log entry. A refusal by policy returns an error wrapping *policy.DeniedError (as
// abi/errors policy_denied) and, for an unattended cause ([Unattended]), is recorded first.
// Other errors: the problems of validation (abi/errors codes), and Catalog.ApplyService's.
func (d *Deployer) Apply(ctx context.Context, ch Change) (Result, error) {
	if ch.Project == nil || ch.Service == "" || ch.Cause == "" || (ch.Spec == nil) == (ch.Next == nil) {
		return Result{}, fmt.Errorf("deploy: a change needs a cause, a project, a service and exactly one of Spec and Next")
	}
	ctx = ch.settleActors(ctx)
	if ch.ExpectedRevision != nil {
		// The caller judged a revision: a lost compare-and-set is its conflict to answer.
		return d.apply(ctx, ch)
	}
	// Otherwise the chain is decided again over the service as it is now, under the store's one
	// retry policy for lost compare-and-sets.
	var res Result
	err := store.RetryOnConflict(ctx, func() error {
		var err error
		res, err = d.apply(ctx, ch)
		return err
	}, services.ErrRevisionConflict)
	return res, err
}

// settleActors fills the change's actors: a zero Actor takes the one ctx carries (a berthd
// without a change log carries none) or the system's; a given Actor goes into the returned
// context, which the change log reads; a zero PolicyActor is derived from Actor.
func (ch *Change) settleActors(ctx context.Context) context.Context {
	if ch.Actor == (changelog.Actor{}) {
		if a, ok := changelog.ActorFrom(ctx); ok {
			ch.Actor = a
		} else {
			ch.Actor = changelog.Actor{Type: "system", ID: "berthd"}
		}
	} else {
		ctx = changelog.WithActor(ctx, ch.Actor)
	}
	if ch.PolicyActor.Kind == "" {
		ch.PolicyActor = abiwasm.Actor{Kind: "system", ID: ch.Actor.ID}
		if ch.Actor.Type == "node" {
			ch.PolicyActor.Kind = "node"
		} else if ch.Actor.Type != "system" {
			ch.PolicyActor.Kind = "token"
		}
	}
	return ctx
}

// apply is one run of the chain.
func (d *Deployer) apply(ctx context.Context, ch Change) (Result, error) {
	p := ch.Project
	cur, err := d.cfg.Catalog.GetService(ctx, p, ch.Service)
	if errors.Is(err, services.ErrServiceNotFound) {
		cur = nil
	} else if err != nil {
		return Result{}, err
	}
	expected := ch.ExpectedRevision
	var next *services.Service
	if ch.Spec != nil {
		next, expected, err = d.declare(ctx, ch, cur)
		if err != nil {
			return Result{}, err
		}
	} else {
		if ch.ExpectedRevision != nil && cur != nil && *ch.ExpectedRevision != cur.Revision {
			return Result{}, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, ch.Service, cur.Revision, *ch.ExpectedRevision)
		}
		next, err = ch.Next(cur)
		if errors.Is(err, ErrNoChange) {
			return Result{Service: cur, Outcome: services.PutUnchanged}, nil
		} else if err != nil {
			return Result{}, err
		}
		next.Name = ch.Service
		if err := d.resolve(ctx, p, next); err != nil {
			return Result{}, err
		}
		if cur != nil && services.SameDeclaration(cur, next) && services.SameRebalance(cur, next) {
			// Nothing to change, so nothing to admit or write (an API apply is admitted
			// either way: its caller asked to be judged).
			return Result{Service: cur, Outcome: services.PutUnchanged}, nil
		}
	}
	if expected == nil {
		// Admission judges the revision read here, so the write is pinned to it.
		var rev int64
		if cur != nil {
			rev = cur.Revision
		}
		expected = &rev
	}
	warnings, err := d.admit(ctx, ch, p, cur, next)
	if err != nil {
		return Result{Warnings: warnings}, err
	}
	// The reconcile request written with the change names the change's cause.
	next.Reconcile = &services.ReconcileRequest{Cause: string(ch.Cause)}
	out, outcome, err := d.cfg.Catalog.ApplyService(ctx, p, next, expected)
	if err != nil {
		return Result{Warnings: warnings}, err
	}
	if ch.Spec != nil {
		if err := d.afterDeclare(ctx, p, out, outcome); err != nil {
			return Result{Service: out, Outcome: outcome, Warnings: warnings}, err
		}
	}
	if outcome != services.PutUnchanged {
		d.log.Info("service changed", "project", p.Name, "service", out.Name, "service_id", out.ID, "cause", ch.Cause,
			"revision", out.Revision, "release", out.Release().Digest())
	}
	return Result{Service: out, Outcome: outcome, Warnings: warnings}, nil
}

// afterDeclare finishes an api.put once the service is written: its bindings are declared and a
// service without an operator spec gets its derived spec. Both also run when nothing changed:
// each is idempotent and repairs an apply that stopped between its writes.
func (d *Deployer) afterDeclare(ctx context.Context, p *services.Project, out *services.Service, outcome services.PutOutcome) error {
	if d.cfg.Bindings != nil && (len(out.Bindings) > 0 || outcome != services.PutCreated) {
		if err := d.cfg.Bindings.Declare(ctx, p.ID, p.Name, out.Name, out.Bindings); err != nil {
			return err
		}
	}
	if !out.Stateful() {
		if _, err := d.cfg.Runtime.EnsureDerivedSpec(ctx, out); err != nil {
			return err
		}
	}
	return nil
}
