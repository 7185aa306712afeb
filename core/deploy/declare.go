package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// DefaultLeaseDurationMS is D of an expiring lease whose duration_ms is left out.
const DefaultLeaseDurationMS = 15000

// DefaultPort is the port of a service that names none.
const DefaultPort = 8080

// declare turns ch.Spec, a whole declaration of the service, into the service to write, in the
// order the API has always checked it (so the first problem found stays the one answered):
// shape, bundle, followed tag, secret use, tls, secret references, bindings, resolved secret
// versions, env-safe values, backup schedule, defaults, and the runtime spec's ownership of the
// replica count. It returns the revision to write under (see [Change.MayTakeSecrets]).
func (d *Deployer) declare(ctx context.Context, ch Change, cur *services.Service) (*services.Service, *int64, error) {
	spec := ch.Spec
	p := ch.Project
	if err := ValidateSpec(ch.Service, spec); err != nil {
		return nil, nil, err
	}
	var bundleDigest string
	if spec.Bundle != "" { // a container from a registry needs none
		dg, err := d.bundleDigest(ctx, p, spec.Bundle)
		if err != nil {
			return nil, nil, err
		}
		bundleDigest = dg
	}
	image, imageTag := spec.Image, ""
	if spec.DeployOnPush {
		var err error
		if image, imageTag, err = d.resolveFollowedTag(ctx, p, spec.Image); err != nil {
			return nil, nil, err
		}
	}
	expected, err := d.checkSecretUse(ch, cur, specRefs(spec), spec.SecretSets, spec.TLS.Secret, ch.ExpectedRevision)
	if err != nil {
		return nil, nil, err
	}
	if err := d.checkTLS(ctx, p, spec); err != nil {
		return nil, nil, err
	}
	refs, err := d.checkSecretRefs(ctx, p, spec)
	if err != nil {
		return nil, nil, err
	}
	bindingSpecs, err := d.bindingSpecs(spec)
	if err != nil {
		return nil, nil, err
	}
	if refs, err = d.withBindingSecrets(ctx, p.ID, ch.Service, bindingSpecs, refs); err != nil {
		return nil, nil, err
	}
	resolved, err := d.resolveSecrets(ctx, p.ID, refs, spec.SecretSets)
	if err != nil {
		return nil, nil, err
	}
	if err := d.CheckEnvValues(ctx, p.ID, resolved); err != nil {
		return nil, nil, err
	}
	svc := &services.Service{
		Secrets: refs, SecretSets: spec.SecretSets, ResolvedSecrets: resolved,
		Runtime: spec.Runtime, Image: image, ImageTag: imageTag, DeployOnPush: spec.DeployOnPush, User: spec.User, MemoryMB: spec.MemoryMB, CPUMillis: spec.CPUMillis,
		Name: ch.Service, Bundle: spec.Bundle, BundleDigest: bundleDigest, Command: spec.Command, Env: spec.Env,
		Port: spec.Port, Domains: spec.Domains, DNS: spec.DNS, Replicas: 1, HealthCheck: services.HealthCheck(spec.HealthCheck),
		Labels: spec.Labels, CapacityUnits: spec.CapacityUnits, Scheduling: services.Scheduling(spec.Scheduling), Timeouts: spec.Timeouts, TLS: services.TLS(spec.TLS), Stream: spec.Stream,
		ProgressDeadlineS: spec.ProgressDeadlineS, AutoRollback: spec.AutoRollback,
		Rollout: rolloutSpec(spec.Rollout),
	}
	if spec.Resources != nil {
		svc.Resources = replicaResources(spec.Resources)
	}
	for _, v := range spec.Volumes {
		svc.Volumes = append(svc.Volumes, services.Volume(v))
	}
	svc.Bindings = bindingSpecs
	if spec.Backup != nil {
		sched := backups.Schedule{Cron: spec.Backup.Cron, Keep: spec.Backup.Keep, Drill: spec.Backup.Drill}
		if err := sched.Validate(); err != nil {
			return nil, nil, abierrors.New(abierrors.BackupScheduleInvalid, err.Error())
		}
		svc.Backup = &services.BackupSchedule{Cron: sched.Cron, Keep: sched.Keep, Drill: sched.Drill}
	}
	applyDefaults(spec, svc)
	if svc.Job = jobSettings(spec, cur); svc.Job != nil {
		svc.Kind, svc.Replicas = services.KindJob, 0 // its runs are placed one by one (core/jobs)
	}
	if err := d.checkSpecOwnership(ctx, cur, svc, spec.Replicas != nil); err != nil {
		return nil, nil, err
	}
	return svc, expected, nil
}

// applyDefaults writes out what a declaration leaves to Berth: a stateful service's local lease
// (an expiring one lasting DefaultLeaseDurationMS unless stated), port DefaultPort, no domains
// as an empty list, and one replica unless stated.
func applyDefaults(spec *client.ServiceSpec, svc *services.Service) {
	if spec.PlacementMode == services.PlacementStateful {
		svc.PlacementMode, svc.LeaseMode = services.PlacementStateful, string(node.LeaseLocal)
		if spec.Lease != nil && spec.Lease.Mode != "" {
			svc.LeaseMode = spec.Lease.Mode
		}
		if svc.LeaseMode == string(node.LeaseExpiring) {
			svc.LeaseDurationMS = spec.Lease.DurationMS
			if svc.LeaseDurationMS == 0 {
				svc.LeaseDurationMS = DefaultLeaseDurationMS
			}
		}
	}
	if svc.Port == 0 {
		svc.Port = DefaultPort
	}
	if svc.Domains == nil {
		svc.Domains = []string{}
	}
	if spec.Replicas != nil {
		svc.Replicas = *spec.Replicas
	}
}

// bundleDigest resolves a bundle name or digest of project p.
func (d *Deployer) bundleDigest(ctx context.Context, p *services.Project, ref string) (string, error) {
	notFound := abierrors.New(abierrors.BundleNotFound, fmt.Sprintf("no bundle %q in project %q; push it with 'berth bundle push'", ref, p.Name))
	if d.cfg.Bundles == nil {
		return "", notFound
	}
	b, err := d.cfg.Bundles.Resolve(ctx, p.ID, ref)
	if errors.Is(err, bundles.ErrNotFound) {
		return "", notFound
	} else if err != nil {
		return "", err
	}
	return b.Digest, nil
}

// checkSpecOwnership refuses a service update that states replicas while an operator runtime
// spec owns placement (docs/reconciliation.md section 1: spec-owns-placement), and one whose port
// would leave the spec's probe naming an undeclared port; otherwise the stored replica count
// stands under an operator spec.
func (d *Deployer) checkSpecOwnership(ctx context.Context, cur, svc *services.Service, statesReplicas bool) error {
	if cur == nil {
		return nil
	}
	doc, err := d.cfg.Runtime.Spec(ctx, cur.ID)
	if err != nil || doc == nil || doc.Source != rollout.SourceOperator {
		return err
	}
	sp := doc.Spec
	err = slots.CheckServiceUpdate(&sp, statesReplicas, []int{svc.Port})
	if errors.Is(err, &slots.Refusal{Reason: slots.ReasonSpecOwnsPlacement}) {
		return abierrors.New(abierrors.SpecOwnsPlacement, "the runtime spec owns the replica count: leave replicas out of the service, or change them with 'berth spec set'")
	} else if err != nil {
		return err
	}
	svc.Replicas = cur.Replicas
	return nil
}

// checkSecretUse enforces the rule of docs/api.md section 10.2: a service write may make the
// service take a secret it does not take now (a reference that is new or changed in key, secret,
// version or delivery, a set not attached now, another tls.secret) only when the actor may take
// secrets (ch.MayTakeSecrets); references the stored service already has stay allowed, so a
// deploy token rolls new releases of a service the operator gave secrets. It is asked before any
// value is opened or any existence is answered. Without secret:use, a write that keeps
// references is pinned to the revision they were compared with: it returns the expected
// revision to write under (expected itself when the actor may take secrets or the write
// references nothing). Errors: 403 secret_use_forbidden naming the first secret or set taken
// anew; ErrRevisionConflict for an expected revision other than the one read.
func (d *Deployer) checkSecretUse(ch Change, cur *services.Service, refs map[string]secrets.Ref, sets []string, tlsSecret string, expected *int64) (*int64, error) {
	if len(refs) == 0 && len(sets) == 0 && tlsSecret == "" {
		return expected, nil
	}
	if ch.MayTakeSecrets {
		return expected, nil
	}
	p, name := ch.Project, ch.Service
	if cur == nil {
		cur = &services.Service{}
	}
	forbidden := func(what string) error {
		return abierrors.New(abierrors.SecretUseForbidden, fmt.Sprintf("service %s/%s does not take %s yet, and making it take a secret needs secret:use on it; this token may keep the references the service has", p.Name, name, what))
	}
	for _, k := range slices.Sorted(maps.Keys(refs)) {
		if had, ok := cur.Secrets[k]; !ok || !sameRef(had, refs[k]) {
			return nil, forbidden(fmt.Sprintf("secret %s as %s", refs[k].Secret, k))
		}
	}
	for _, set := range sets {
		if !slices.Contains(cur.SecretSets, set) {
			return nil, forbidden("secret set " + set)
		}
	}
	if tlsSecret != "" && tlsSecret != cur.TLS.Secret {
		return nil, forbidden("secret " + tlsSecret + " as tls.secret")
	}
	if expected != nil && *expected != cur.Revision {
		return nil, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", services.ErrRevisionConflict, p.Name, name, cur.Revision, *expected)
	}
	rev := cur.Revision
	return &rev, nil
}

// CheckSecretUse is the secret-use rule of a declaration ([Change.MayTakeSecrets]) for a change
// that returns the service to refs and sets (an undo): nil when the actor may take secrets or
// the stored service cur takes them all now, else 403 secret_use_forbidden naming the first.
func (d *Deployer) CheckSecretUse(ch Change, cur *services.Service, refs map[string]secrets.Ref, sets []string) error {
	_, err := d.checkSecretUse(ch, cur, refs, sets, "", nil)
	return err
}

// sameRef reports whether a and b take the same secret version the same way ("" is env).
func sameRef(a, b secrets.Ref) bool {
	if a.As == "" {
		a.As = secrets.AsEnv
	}
	if b.As == "" {
		b.As = secrets.AsEnv
	}
	return a == b
}

// specRefs returns the references a service spec states itself.
func specRefs(spec *client.ServiceSpec) map[string]secrets.Ref {
	if len(spec.Secrets) == 0 {
		return nil
	}
	out := make(map[string]secrets.Ref, len(spec.Secrets))
	for k, r := range spec.Secrets {
		out[k] = secrets.Ref(r)
	}
	return out
}

// rolloutSpec converts an API rollout block (nil: none) to the stored one.
func rolloutSpec(r *client.RolloutSpec) *slots.RolloutSpec {
	if r == nil {
		return nil
	}
	bound := func(b *client.IntOrPercent) *slots.Bound {
		if b == nil {
			return nil
		}
		return &slots.Bound{Value: b.Value, Percent: b.Percent}
	}
	return &slots.RolloutSpec{MaxSurge: bound(r.MaxSurge), MaxUnavailable: bound(r.MaxUnavailable)}
}

// replicaResources converts the API's resources block of a service (nil: none) to what one
// replica reserves; a disk amount is not part of it.
func replicaResources(r *client.Resources) services.Resources {
	if r == nil {
		return services.Resources{}
	}
	return services.Resources{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Extended: r.Extended}
}
