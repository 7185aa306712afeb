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
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// resolve fills in what a [Change.Next] left to be resolved: a bundle named without its digest,
// a followed tag without the tag it follows, and secret references without their resolved
// versions (the current version of each unpinned one).
func (d *Deployer) resolve(ctx context.Context, p *services.Project, next *services.Service) error {
	if next.Bundle != "" && next.BundleDigest == "" {
		dg, err := d.bundleDigest(ctx, p, next.Bundle)
		if err != nil {
			return err
		}
		next.BundleDigest = dg
	}
	if next.DeployOnPush && next.ImageTag == "" {
		image, tag, err := d.resolveFollowedTag(ctx, p, next.Image)
		if err != nil {
			return err
		}
		next.Image, next.ImageTag = image, tag
	}
	if next.ResolvedSecrets == nil && (len(next.Secrets) > 0 || len(next.SecretSets) > 0) {
		res, err := d.resolveSecrets(ctx, p.ID, next.Secrets, next.SecretSets)
		if err != nil {
			return err
		}
		next.ResolvedSecrets = res
	}
	return nil
}

// registryPrefix is "<RegistryHost>/", or "" without a host.
func (d *Deployer) registryPrefix() string {
	if d.cfg.RegistryHost == "" {
		return ""
	}
	return d.cfg.RegistryHost + "/"
}

// resolveFollowedTag resolves the image of a deploy_on_push service ("[host/]<project>/<repo>:<tag>",
// validated by splitTagRef) to the image reference it runs ("<host>/<project>/<repo>@<digest>")
// and the "<project>/<repo>:<tag>" it follows. Errors: 422 validation_failed for a repository of
// another project or another registry, 404 image_release_not_found, 409 release_not_pushed.
func (d *Deployer) resolveFollowedTag(ctx context.Context, p *services.Project, ref string) (image, repoTag string, err error) {
	name, tag, _ := splitTagRef(ref)
	repo := strings.TrimPrefix(name, d.registryPrefix())
	if !strings.HasPrefix(repo, p.Name+"/") {
		return "", "", abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("deploy_on_push follows a repository of project %s in Berth's registry (%s/%s/...), not %s", p.Name, d.cfg.RegistryHost, p.Name, name))
	}
	digest, err := d.pushedDigest(ctx, repo, tag)
	if err != nil {
		return "", "", err
	}
	return d.registryPrefix() + repo + "@" + digest, repo + ":" + tag, nil
}

// ReleaseImage returns the image reference a promotion of tag of repo writes:
// "<RegistryHost>/<repo>@<digest>". Errors: 404 image_release_not_found for a tag never pushed
// and for a release whose manifest registry retention removed (docs/registry.md section 10); 409
// release_not_pushed; a storage failure.
func (d *Deployer) ReleaseImage(ctx context.Context, repo, tag string) (string, error) {
	digest, err := d.pushedDigest(ctx, repo, tag)
	if err != nil {
		return "", err
	}
	return d.registryPrefix() + repo + "@" + digest, nil
}

// pushedDigest returns the digest repo:tag names, once the registry (Config.Manifests) confirms
// it still holds that manifest. Errors: 404 image_release_not_found for a tag never pushed and for
// a release whose manifest registry retention removed (docs/registry.md section 10); 409
// release_not_pushed; a storage failure.
func (d *Deployer) pushedDigest(ctx context.Context, repo, tag string) (string, error) {
	if d.cfg.Releases == nil {
		return "", abierrors.New(abierrors.ImageReleaseNotFound, fmt.Sprintf("repository %s has no tag %q", repo, tag))
	}
	rel, err := d.cfg.Releases.Get(ctx, repo, tag)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", abierrors.New(abierrors.ImageReleaseNotFound, fmt.Sprintf("repository %s has no tag %q", repo, tag))
	case err != nil:
		return "", err
	case rel.Digest == "":
		return "", abierrors.New(abierrors.ReleaseNotPushed, fmt.Sprintf("tag %q of %s is reserved but nothing was pushed to it yet", tag, repo))
	}
	if d.cfg.Manifests != nil {
		ok, err := d.cfg.Manifests.ManifestExists(ctx, repo, rel.Digest)
		if err != nil {
			return "", fmt.Errorf("check release %s:%s: %w", repo, tag, err)
		}
		if !ok {
			return "", abierrors.New(abierrors.ImageReleaseNotFound, fmt.Sprintf("release %q of %s names %s, which registry retention removed; push that image to the tag again to promote it", tag, repo, rel.Digest))
		}
	}
	return rel.Digest, nil
}

// checkTLS refuses a service's tls block that cannot be served (docs/certificates.md section
// 6): an unknown mode or manual without a secret (tls_mode_invalid), a manual secret that is not
// a matching PEM certificate and key covering every domain (tls_certificate_invalid), an acme
// domain no challenge can prove with this berthd's configuration (tls_domain_unverifiable). It
// reads the manual secret's current version only; the value is never logged or returned.
func (d *Deployer) checkTLS(ctx context.Context, p *services.Project, spec *client.ServiceSpec) error {
	switch spec.TLS.Mode {
	case "", certs.ModeNone, certs.ModePassthrough:
		if spec.TLS.Secret != "" {
			return abierrors.New(abierrors.TLSModeInvalid, "tls.secret is only for tls mode manual")
		}
		return nil
	case certs.ModeACME:
		if spec.TLS.Secret != "" {
			return abierrors.New(abierrors.TLSModeInvalid, "tls.secret is only for tls mode manual")
		}
		if d.cfg.ACME == nil {
			return abierrors.New(abierrors.TLSDomainUnverifiable, "this berthd has no ACME CA configured (berthd --acme-directory); tls mode acme cannot be served")
		}
		for _, dom := range spec.Domains {
			if err := d.cfg.ACME.CheckDomain(dom); err != nil {
				return abierrors.New(abierrors.TLSDomainUnverifiable, err.Error())
			}
		}
		return nil
	case certs.ModeManual:
		if spec.TLS.Secret == "" {
			return abierrors.New(abierrors.TLSModeInvalid, "tls mode manual needs tls.secret: the project secret holding the PEM certificate chain and private key")
		}
		if d.cfg.Secrets == nil {
			return abierrors.New(abierrors.Unavailable, "this berthd serves no secrets")
		}
		sec, v, err := d.cfg.Secrets.Resolve(ctx, p.ID, spec.TLS.Secret, 0)
		if err != nil {
			return SecretRefError(fmt.Errorf("tls.secret: %w", err))
		}
		value, err := d.cfg.Secrets.Open(sec, v)
		if errors.Is(err, secrets.ErrOpenFailed) {
			return abierrors.New(abierrors.SecretOpenFailed, fmt.Sprintf("tls.secret %s does not open under the keyring", spec.TLS.Secret))
		} else if err != nil {
			return err
		}
		certPEM, keyPEM, err := certs.SplitPEM(value)
		if err == nil {
			_, err = certs.CheckPair(certPEM, keyPEM, spec.Domains, d.cfg.Now().UTC())
		}
		if err != nil {
			return abierrors.New(abierrors.TLSCertificateInvalid, fmt.Sprintf("tls.secret %s: %s", spec.TLS.Secret, err.Error()))
		}
		return nil
	}
	return abierrors.New(abierrors.TLSModeInvalid, fmt.Sprintf("unknown tls mode %q (want none, acme, manual or passthrough)", spec.TLS.Mode))
}

// checkSecretRefs validates a service spec's secret references (docs/api.md section 10.2):
// well-formed keys, no key also in env or given twice, and every secret, pinned version and set
// existing in project p (422 secret_unknown naming the first that does not).
func (d *Deployer) checkSecretRefs(ctx context.Context, p *services.Project, spec *client.ServiceSpec) (map[string]secrets.Ref, error) {
	if len(spec.Secrets) == 0 && len(spec.SecretSets) == 0 {
		return nil, nil
	}
	if d.cfg.Secrets == nil {
		return nil, abierrors.New(abierrors.Unavailable, "this berthd serves no secrets")
	}
	refs := map[string]secrets.Ref{}
	for k, r := range spec.Secrets {
		ref := secrets.Ref(r)
		if err := ref.Validate(k); err != nil {
			return nil, SecretError(err)
		}
		if _, dup := spec.Env[k]; dup {
			return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s is both in env and in secrets", k))
		}
		refs[k] = ref
	}
	if err := d.cfg.Secrets.ValidateRefs(ctx, p.ID, refs); err != nil {
		return nil, SecretRefError(err)
	}
	if len(spec.SecretSets) > 16 {
		return nil, abierrors.New(abierrors.ValidationFailed, "a service attaches at most 16 secret sets")
	}
	from := map[string]string{}
	for _, name := range spec.SecretSets {
		if !secrets.ValidName(name) {
			return nil, abierrors.New(abierrors.InvalidName, fmt.Sprintf("secret set name %q must be a DNS label: 1 to 63 characters of a-z, 0-9 and '-', not starting or ending with '-'", name))
		}
		if _, dup := from["set:"+name]; dup {
			return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("secret set %s is attached twice", name))
		}
		from["set:"+name] = name
		set, err := d.cfg.Secrets.GetSet(ctx, p.ID, name)
		if err != nil {
			return nil, SecretRefError(err)
		}
		for k := range set.Secrets {
			_, inEnv := spec.Env[k]
			_, direct := refs[k]
			if other, again := from[k]; inEnv || direct || again {
				where := "env or secrets"
				if again {
					where = "secret set " + other
				}
				return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s of secret set %s is also given by %s", k, name, where))
			}
			from[k] = name
		}
	}
	return refs, nil
}

// resolveSecrets returns every secret a service with refs and sets receives, keyed by variable,
// each with a concrete version (the current one where refs leave it unpinned). Errors: a
// secret, version or set gone (422 secret_unknown), store failures.
func (d *Deployer) resolveSecrets(ctx context.Context, projectID string, refs map[string]secrets.Ref, sets []string) (map[string]secrets.Ref, error) {
	if len(refs) == 0 && len(sets) == 0 {
		return nil, nil
	}
	if d.cfg.Secrets == nil {
		return nil, abierrors.New(abierrors.Unavailable, "this berthd serves no secrets")
	}
	all := maps.Clone(refs)
	if all == nil {
		all = map[string]secrets.Ref{}
	}
	for _, name := range sets {
		set, err := d.cfg.Secrets.GetSet(ctx, projectID, name)
		if err != nil {
			return nil, SecretRefError(err)
		}
		for k, r := range set.Secrets {
			if _, dup := all[k]; !dup {
				all[k] = r
			}
		}
	}
	out := make(map[string]secrets.Ref, len(all))
	for k, r := range all {
		_, v, err := d.cfg.Secrets.Resolve(ctx, projectID, r.Secret, r.Version)
		if err != nil {
			return nil, SecretRefError(fmt.Errorf("%s: %w", k, err))
		}
		r.Version = v.Version
		out[k] = r
	}
	return out, nil
}

// CheckEnvValues refuses (422 validation_failed naming the key) a reference delivered as an
// environment variable to a secret version whose value an environment variable cannot carry (a
// NUL byte, or bytes that are not UTF-8: [node.EnvSafe]); a file carries any bytes. refs'
// versions may be 0 (the current one). A secret or version that does not exist is 422
// secret_unknown.
func (d *Deployer) CheckEnvValues(ctx context.Context, projectID string, refs map[string]secrets.Ref) error {
	for _, k := range slices.Sorted(maps.Keys(refs)) {
		r := refs[k]
		if r.As != "" && r.As != secrets.AsEnv {
			continue
		}
		sec, v, err := d.cfg.Secrets.Resolve(ctx, projectID, r.Secret, r.Version)
		if err != nil {
			return SecretRefError(fmt.Errorf("%s: %w", k, err))
		}
		ok, err := d.cfg.Secrets.EnvSafe(sec, v)
		if err != nil {
			return SecretError(err)
		}
		if !ok {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: version %d of secret %s holds a NUL byte or bytes that are not UTF-8, which an environment variable cannot carry; deliver it as a file (as: file)", k, v.Version, r.Secret))
		}
	}
	return nil
}

// bindingSpecs checks a spec's bindings (422 binding_kind_unknown or binding_name_clash) and
// converts them.
func (d *Deployer) bindingSpecs(spec *client.ServiceSpec) ([]bindings.Spec, error) {
	if len(spec.Bindings) == 0 {
		return nil, nil
	}
	if d.cfg.Bindings == nil {
		return nil, abierrors.New(abierrors.BindingKindUnknown, "this berthd runs no corestore provider: no binding kind is served (docs/bindings.md section 5)")
	}
	out := make([]bindings.Spec, 0, len(spec.Bindings))
	for _, b := range spec.Bindings {
		out = append(out, bindings.Spec{Name: b.Name, Kind: b.Kind})
	}
	if err := bindings.Validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

// withBindingSecrets adds the secret references of the service's ready bindings to refs (a
// reference the spec states itself wins), so an apply keeps the credentials the bindings sealed.
func (d *Deployer) withBindingSecrets(ctx context.Context, projectID, service string, specs []bindings.Spec, refs map[string]secrets.Ref) (map[string]secrets.Ref, error) {
	if len(specs) == 0 {
		return refs, nil
	}
	have, err := d.cfg.Bindings.List(ctx, projectID, service)
	if err != nil {
		return nil, err
	}
	declared := map[string]bool{}
	for _, sp := range specs {
		declared[sp.Name] = true
	}
	out := maps.Clone(refs)
	if out == nil {
		out = map[string]secrets.Ref{}
	}
	for _, b := range have {
		if !declared[b.Name] || b.State == bindings.StateReleased || b.State == bindings.StatePurged {
			continue
		}
		for env, r := range b.Secrets {
			if _, set := out[env]; !set {
				out[env] = r
			}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// SecretError maps the errors of core/secrets to problems: a missing secret or version is
// secret_not_found, a missing set secret_set_not_found, and so on; none carries a value. An
// error it does not know is returned as is.
func SecretError(err error) error {
	switch {
	case errors.Is(err, secrets.ErrNotFound), errors.Is(err, secrets.ErrVersionNotFound):
		return abierrors.Wrap(abierrors.SecretNotFound, TrimSentinel(err), nil)
	case errors.Is(err, secrets.ErrSetNotFound):
		return abierrors.Wrap(abierrors.SecretSetNotFound, TrimSentinel(err), nil)
	case errors.Is(err, secrets.ErrConflict):
		return abierrors.Wrap(abierrors.RevisionConflict, TrimSentinel(err), nil)
	case errors.Is(err, secrets.ErrTooManyVersions):
		return abierrors.Wrap(abierrors.SecretVersionsFull, TrimSentinel(err), nil)
	case errors.Is(err, secrets.ErrInvalid):
		return abierrors.Wrap(abierrors.ValidationFailed, TrimSentinel(err), nil)
	case errors.Is(err, secrets.ErrRotationRunning):
		return abierrors.Wrap(abierrors.KeyringRotationRunning, TrimSentinel(err), nil)
	case errors.Is(err, changelog.ErrEntryTooLarge):
		return abierrors.Wrap(abierrors.ChangeTooLarge, TrimSentinel(err), nil)
	}
	return err
}

// SecretRefError answers a service or set reference to a missing secret, version or set: 422
// secret_unknown naming it. Any other error is mapped as [SecretError] maps it.
func SecretRefError(err error) error {
	if errors.Is(err, secrets.ErrNotFound) || errors.Is(err, secrets.ErrVersionNotFound) || errors.Is(err, secrets.ErrSetNotFound) {
		return abierrors.Wrap(abierrors.SecretUnknown, TrimSentinel(err), nil)
	}
	return SecretError(err)
}

// TrimSentinel returns err's message without the "berth: ..." sentinel text before the first
// ": ", the part a problem's detail shows; a message without that prefix is returned whole.
func TrimSentinel(err error) string {
	msg := err.Error()
	for i := 0; i+1 < len(msg); i++ {
		if msg[i] == ':' && msg[i+1] == ' ' && i > 6 && msg[:6] == "berth:" {
			return msg[i+2:]
		}
	}
	return msg
}
