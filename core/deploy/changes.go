package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

// This file holds the changes of the causes other than api.put, each one [Change] through
// [Deployer.Apply].

// Promote points service name of p at image (a reference pinned by digest, as
// [Deployer.ReleaseImage] returns it), everything else as it is (release.promote). ch carries the
// actor and the expected revision. Errors: ErrNotContainer for a service that runs no image,
// ErrServiceNotFound, and Apply's.
func (d *Deployer) Promote(ctx context.Context, ch Change, image string) (Result, error) {
	ch.Cause = CauseReleasePromote
	ch.Next = func(cur *services.Service) (*services.Service, error) {
		if cur == nil {
			return nil, fmt.Errorf("%w: no service %q in project %q", services.ErrServiceNotFound, ch.Service, ch.Project.Name)
		}
		if cur.Runtime != "containerd" {
			return nil, fmt.Errorf("%w: %s/%s has runtime %q", services.ErrNotContainer, ch.Project.Name, ch.Service, cur.Runtime)
		}
		next := *cur
		next.Image, next.LogOutbox = image, nil
		return &next, nil
	}
	return d.Apply(ctx, ch)
}

// Undo returns the service of ch to what it ran before its latest change of what it runs
// (rollout.undo, [services.Undone]). Errors: ErrServiceNotFound, ErrServiceDeleting,
// ErrNoPreviousRelease, and Apply's.
func (d *Deployer) Undo(ctx context.Context, ch Change) (Result, error) {
	ch.Cause = CauseRolloutUndo
	ch.Next = func(cur *services.Service) (*services.Service, error) {
		if cur == nil {
			return nil, fmt.Errorf("%w: no service %q in project %q", services.ErrServiceNotFound, ch.Service, ch.Project.Name)
		}
		return services.Undone(cur, false)
	}
	return d.Apply(ctx, ch)
}

// RollBack is the automatic rollback of a failed rollout of svc, the service as the sweep read it
// (rollout.auto_rollback, docs/reconciliation.md section 7.2): [services.Undone] with RollbackOf,
// written only while the service is still at svc's revision, so a rollback decided twice over one
// revision writes once (the second is ErrRevisionConflict). The change log records the system
// ("rollout") as its actor. Errors: ErrRevisionConflict, ErrServiceDeleting,
// ErrNoPreviousRelease, a policy refusal (recorded), and the store's.
func (d *Deployer) RollBack(ctx context.Context, svc *services.Service) (*services.Service, error) {
	rev := svc.Revision
	res, err := d.Apply(ctx, Change{
		Cause: CauseAutoRollback, Project: &services.Project{ID: svc.ProjectID, Name: svc.Project}, Service: svc.Name,
		Actor: changelog.Actor{Type: "system", ID: "rollout"}, ExpectedRevision: &rev,
		Next: func(cur *services.Service) (*services.Service, error) {
			if cur == nil {
				return nil, fmt.Errorf("%w: service %s/%s is gone", services.ErrServiceNotFound, svc.Project, svc.Name)
			}
			return services.Undone(cur, true)
		},
	})
	if err != nil {
		return nil, err
	}
	return res.Service, nil
}

// RollSecrets re-resolves the secret versions of service name of p (secret.rollover): a new
// version of a secret the service takes unpinned, directly or through a set, rolls out like any
// change of what it runs. A service whose resolved versions did not move, or that is gone or
// being deleted, is left alone (PutUnchanged). The change log records the actor of ctx.
func (d *Deployer) RollSecrets(ctx context.Context, p *services.Project, name string) (Result, error) {
	return d.Apply(ctx, Change{
		Cause: CauseSecretRollover, Project: p, Service: name, MayTakeSecrets: true,
		Next: func(cur *services.Service) (*services.Service, error) {
			if cur == nil || cur.Deleting {
				return nil, ErrNoChange
			}
			res, err := d.resolveSecrets(ctx, p.ID, cur.Secrets, cur.SecretSets)
			if err != nil {
				return nil, err
			}
			if maps.Equal(res, cur.ResolvedSecrets) {
				return nil, ErrNoChange
			}
			next := *cur
			next.ResolvedSecrets, next.LogOutbox = res, nil
			return &next, nil
		},
	})
}

// PublishBinding adds refs, the secret references of a ready binding named binding, to its
// service name of p (binding.publish), so the next rollout delivers the credentials. A service
// that is gone, being deleted, or no longer declares the binding is left alone (PutUnchanged).
// expected, when not nil, is the revision the caller read. The change log records the system
// ("corestore") as its actor.
func (d *Deployer) PublishBinding(ctx context.Context, p *services.Project, name, binding string, refs map[string]secrets.Ref, expected *int64) (Result, error) {
	return d.Apply(ctx, Change{
		Cause: CauseBindingPublish, Project: p, Service: name, MayTakeSecrets: true, ExpectedRevision: expected,
		Actor: changelog.Actor{Type: "system", ID: "corestore"},
		Next: func(cur *services.Service) (*services.Service, error) {
			if cur == nil || cur.Deleting {
				return nil, ErrNoChange
			}
			declared := false
			for _, s := range cur.Bindings {
				declared = declared || s.Name == binding
			}
			if !declared {
				return nil, ErrNoChange
			}
			next := *cur
			next.Secrets, next.ResolvedSecrets, next.LogOutbox = maps.Clone(cur.Secrets), maps.Clone(cur.ResolvedSecrets), nil
			if next.Secrets == nil {
				next.Secrets = map[string]secrets.Ref{}
			}
			if next.ResolvedSecrets == nil {
				next.ResolvedSecrets = map[string]secrets.Ref{}
			}
			maps.Copy(next.Secrets, refs)
			maps.Copy(next.ResolvedSecrets, refs)
			return &next, nil
		},
	})
}

// PublishReady is the binding manager's OnReady (docs/bindings.md): it publishes the secret
// references of ready binding b to its service ([Deployer.PublishBinding], cause
// binding.publish, at the revision read and decided again after a concurrent write). A service
// that is gone, being deleted or no longer declares b is left alone (an unchanged Result).
func (d *Deployer) PublishReady(ctx context.Context, b *bindings.Binding) (Result, error) {
	p, err := d.cfg.Catalog.GetProject(ctx, b.Project)
	if err != nil {
		return Result{}, fmt.Errorf("publish binding %s: %w", b.ID, err)
	}
	res, err := d.PublishBinding(ctx, p, b.Service, b.Name, b.Secrets, nil)
	if err != nil {
		return res, fmt.Errorf("publish binding %s: %w", b.ID, err)
	}
	return res, nil
}

// OnlyRefusals reports whether err (from [Deployer.FollowTag], or any Apply) is made only of
// policy refusals, each already recorded: a decided outcome rather than a failure to retry.
func OnlyRefusals(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !OnlyRefusals(e) {
				return false
			}
		}
		return true
	}
	var de *policy.DeniedError
	return errors.As(err, &de)
}

// RefusalReason classifies an error of [Deployer.FollowTag] for the release it follows
// (docs/registry.md section 8.1): ok when err is made only of policy refusals ([OnlyRefusals]),
// with the reason "policy: <the policies' reasons>"; a failure mixed in makes it not ok, so the
// follow is tried again.
func RefusalReason(err error) (string, bool) {
	if !OnlyRefusals(err) {
		return "", false
	}
	var reasons []string
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var de *policy.DeniedError
		if errors.As(e, &de) {
			reasons = append(reasons, de.Reasons...)
		}
	}
	walk(err)
	return "policy: " + strings.Join(slices.Compact(reasons), "; "), true
}

// FollowTag rolls every service with deploy_on_push that follows repoTag
// ("<project>/<repo>:<tag>") to image ("<host>/<project>/<repo>@sha256:<hex>", what the tag
// names now), each as one registry.push change at the revision read, decided again when the
// service changed meanwhile (under store.RetryOnConflict). Services of other projects than the
// repository's never follow it; a service already at image, deleting, or no longer following
// the tag is skipped. Idempotent: a repeat writes nothing. It returns the services it wrote,
// and the errors of the others joined (a policy refusal wraps *policy.DeniedError and is
// recorded, see docs/deploy.md); one service's failure does not stop the others.
func (d *Deployer) FollowTag(ctx context.Context, repoTag, image string) ([]*services.Service, error) {
	project, _, ok := strings.Cut(repoTag, "/")
	if !ok {
		return nil, nil
	}
	p, err := d.cfg.Catalog.GetProject(ctx, project)
	if errors.Is(err, services.ErrProjectNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	followers, err := d.cfg.Catalog.Followers(ctx, p, repoTag)
	if err != nil {
		return nil, err
	}
	var out []*services.Service
	var errs []error
	for _, f := range followers {
		res, err := d.Apply(ctx, Change{
			Cause: CauseRegistryPush, Project: p, Service: f.Name, MayTakeSecrets: true,
			Next: func(cur *services.Service) (*services.Service, error) {
				if cur == nil || !cur.DeployOnPush || cur.ImageTag != repoTag || cur.Deleting || cur.Image == image {
					return nil, ErrNoChange
				}
				next := *cur
				next.Image, next.LogOutbox = image, nil
				return &next, nil
			},
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("follow %s with %s/%s: %w", repoTag, p.Name, f.Name, err))
			continue
		}
		if res.Changed() {
			out = append(out, res.Service)
		}
	}
	return out, errors.Join(errs...)
}

// Rebalance records moves as the service's rebalance (rollout.rebalance, docs/placement.md
// section 7): the next generation of [services.Rebalance], which the rollout's placement honours
// while each move stays feasible, carried out under the rollout's bounds like any change of a
// replica's node. The service's declaration is unchanged; the write carries its change-log
// entry and reconcile request as every service write does. moves may be empty: it clears moves
// an earlier rebalance left that no longer improve anything. Errors: ErrServiceNotFound,
// ErrServiceDeleting, and Apply's (ErrRevisionConflict with ch.ExpectedRevision).
func (d *Deployer) Rebalance(ctx context.Context, ch Change, moves []services.RebalanceMove) (Result, error) {
	ch.Cause = CauseRolloutRebalance
	ch.Next = func(cur *services.Service) (*services.Service, error) {
		if cur == nil {
			return nil, fmt.Errorf("%w: no service %q in project %q", services.ErrServiceNotFound, ch.Service, ch.Project.Name)
		}
		if cur.Deleting {
			return nil, fmt.Errorf("%w: %s/%s", services.ErrServiceDeleting, ch.Project.Name, ch.Service)
		}
		next := *cur
		next.LogOutbox = nil
		r := &services.Rebalance{Generation: 1, Moves: slices.Clone(moves)}
		if cur.Rebalance != nil {
			r.Generation = cur.Rebalance.Generation + 1
		}
		next.Rebalance = r
		return &next, nil
	}
	return d.Apply(ctx, ch)
}

// ErrNotAJob is returned by [Deployer.SuspendJob] for a service that is not a job.
var ErrNotAJob = abierrors.New(abierrors.ValidationFailed, "not a job")

// SuspendJob holds (suspended) or continues a job's schedule (docs/jobs.md section 7) as a
// change of cause job.control: admitted by the service.apply policies and written with its
// change-log entry like every other. Runs already placed go on; fire times while it is held
// are not recorded (the cursor does not move, so on resume only the latest within the
// starting deadline runs). Suspending a suspended job writes nothing. Errors: not found or
// deleting as for every change, [ErrNotAJob] for a service.
func (d *Deployer) SuspendJob(ctx context.Context, ch Change, suspended bool) (Result, error) {
	ch.Cause = CauseJobControl
	ch.Next = func(cur *services.Service) (*services.Service, error) {
		if cur == nil {
			return nil, fmt.Errorf("%w: no job %q in project %q", services.ErrServiceNotFound, ch.Service, ch.Project.Name)
		}
		if cur.Deleting {
			return nil, fmt.Errorf("%w: %s/%s", services.ErrServiceDeleting, ch.Project.Name, ch.Service)
		}
		if !cur.IsJob() || cur.Job == nil {
			return nil, fmt.Errorf("%w: %s/%s is a service", ErrNotAJob, ch.Project.Name, ch.Service)
		}
		if cur.Job.Suspended == suspended {
			return nil, ErrNoChange
		}
		next := *cur
		next.LogOutbox = nil
		j := *cur.Job
		j.Suspended = suspended
		next.Job = &j
		return &next, nil
	}
	return d.Apply(ctx, ch)
}

// AdmitCommand asks the service.apply policies whether command may run once in the
// environment of ch.Service (berth run; docs/jobs.md section 9), as a change of cause
// job.command: the object judged is the stored service as the run would run it (kind job, its
// command replaced), the old object the service as stored. Nothing is written; the jobs
// controller records the run after an allowed answer. A service that takes secrets needs an
// actor that may take them ([Change.MayTakeSecrets]): the command could read them. It returns
// the stored service and the policies' warnings. Errors: not found or deleting as for every
// change, 403 secret_use_forbidden, and a refusal as [Deployer.Apply] answers it (recorded as a
// deploy.refused event).
func (d *Deployer) AdmitCommand(ctx context.Context, ch Change, command []string) (*services.Service, []string, error) {
	ch.Cause = CauseJobCommand
	if ch.PolicyActor.Kind == "" {
		ch.PolicyActor.Kind, ch.PolicyActor.ID = "system", "berthd"
	}
	p := ch.Project
	cur, err := d.cfg.Catalog.GetService(ctx, p, ch.Service)
	if err != nil {
		return nil, nil, err
	}
	if cur.Deleting {
		return nil, nil, fmt.Errorf("%w: %s/%s", services.ErrServiceDeleting, p.Name, ch.Service)
	}
	if (len(cur.Secrets) > 0 || len(cur.SecretSets) > 0) && !ch.MayTakeSecrets {
		return nil, nil, abierrors.New(abierrors.SecretUseForbidden, fmt.Sprintf("service %s/%s takes secrets, and a command in its environment could read them: running one needs secret:use on it", p.Name, ch.Service))
	}
	next := *cur
	next.LogOutbox = nil
	next.Kind = services.KindJob
	next.Command = append([]string(nil), command...)
	warnings, err := d.admit(ctx, ch, p, cur, &next)
	if err != nil {
		return nil, warnings, err
	}
	return cur, warnings, nil
}

// ControlRollout pauses, resumes or restarts the rollout of ch.Service (berth rollout
// pause|resume|restart; docs/reconciliation.md section 5.2) as a change of cause rollout.pause,
// rollout.resume or rollout.restart: the service.apply policies judge the service as stored (a
// restart replaces every replica, a pause holds the rollout: both change what runs), and only
// an admitted change is written, by [services.Catalog.ControlRollout], pinned to the revision
// judged, with its change-log entry and reconcile request. Pausing a paused rollout and resuming
// a running one are not judged and write nothing. Without ch.ExpectedRevision, a write lost to a
// concurrent one is decided again under the store's retry policy. Errors: ErrServiceNotFound,
// ErrServiceDeleting, ErrRevisionConflict (with ch.ExpectedRevision), ErrRolloutAction, and a
// refusal as [Deployer.Apply] answers it.
func (d *Deployer) ControlRollout(ctx context.Context, ch Change, action services.RolloutAction) (Result, error) {
	switch action {
	case services.RolloutPause:
		ch.Cause = CauseRolloutPause
	case services.RolloutResume:
		ch.Cause = CauseRolloutResume
	case services.RolloutRestart:
		ch.Cause = CauseRolloutRestart
	default:
		return Result{}, fmt.Errorf("%w: %q", services.ErrRolloutAction, action)
	}
	ctx = ch.settleActors(ctx)
	control := func() (Result, error) {
		p := ch.Project
		cur, err := d.cfg.Catalog.GetService(ctx, p, ch.Service)
		if err != nil {
			return Result{}, err
		}
		switch {
		case ch.ExpectedRevision != nil && *ch.ExpectedRevision != cur.Revision:
			return Result{}, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, ch.Service, cur.Revision, *ch.ExpectedRevision)
		case cur.Deleting:
			return Result{}, fmt.Errorf("%w: %s/%s", services.ErrServiceDeleting, p.Name, ch.Service)
		case action == services.RolloutPause && cur.RolloutPaused, action == services.RolloutResume && !cur.RolloutPaused:
			return Result{Service: cur, Outcome: services.PutUnchanged}, nil
		}
		next := *cur
		next.LogOutbox = nil
		warnings, err := d.admit(ctx, ch, p, cur, &next)
		if err != nil {
			return Result{Warnings: warnings}, err
		}
		judged := cur.Revision
		out, wrote, err := d.cfg.Catalog.ControlRollout(ctx, p, ch.Service, action, &judged)
		if err != nil {
			return Result{Warnings: warnings}, err
		}
		res := Result{Service: out, Outcome: services.PutUnchanged, Warnings: warnings}
		if wrote {
			res.Outcome = services.PutUpdated
			d.log.Info("rollout "+string(action), "project", p.Name, "service", out.Name, "service_id", out.ID, "cause", ch.Cause,
				"revision", out.Revision, "paused", out.RolloutPaused, "restart_generation", out.RestartGeneration)
		}
		return res, nil
	}
	if ch.ExpectedRevision != nil {
		return control()
	}
	var res Result
	err := store.RetryOnConflict(ctx, func() error {
		var err error
		res, err = control()
		return err
	}, services.ErrRevisionConflict)
	return res, err
}
