package api

import (
	"context"
	"errors"

	"github.com/labstack/echo/v4"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// newDeployer builds the deployer of an API configured without one, from the API's own parts.
func (s *Server) newDeployer() *deploy.Deployer {
	cfg := deploy.Config{Catalog: s.cfg.Catalog, Runtime: s.runtime, Bundles: s.cfg.Bundles, Bindings: s.cfg.Bindings,
		Policy: s.cfg.Policy, Releases: s.cfg.ImageReleases, RegistryHost: s.registryHost(), Events: s.cfg.Events,
		Metrics: s.cfg.Metrics, Logger: s.cfg.Logger, Now: s.cfg.Now}
	if s.cfg.Secrets != nil {
		cfg.Secrets = s.cfg.Secrets.Store
	}
	cfg.Manifests = configManifests{s}
	if s.cfg.ACME != nil {
		cfg.ACME = s.cfg.ACME
	}
	return deploy.New(cfg)
}

// configManifests asks the Server's Config.Manifests at each call (nil trusts the release
// record), so a Manifests set after New is asked too.
type configManifests struct{ s *Server }

func (m configManifests) ManifestExists(ctx context.Context, repo, digest string) (bool, error) {
	if m.s.cfg.Manifests == nil {
		return true, nil
	}
	return m.s.cfg.Manifests.ManifestExists(ctx, repo, digest)
}

// change returns the change the request c asks of service name of p, with its cause, expected
// revision and who asked: the policies see the request's principal, and secret:use on the
// service lets it take new secrets. The change log's actor comes with the write's context
// (changeCtx). The caller adds what to change (Spec or Next).
func (s *Server) change(c echo.Context, cause deploy.Cause, p *services.Project, name string, expected *int64) deploy.Change {
	ch := deploy.Change{Cause: cause, Project: p, Service: name, ExpectedRevision: expected}
	if who := principal(c); who != nil {
		ch.PolicyActor = abiwasm.Actor{Kind: "token", ID: who.ID}
		if who.Kind == identity.KindNode {
			ch.PolicyActor.Kind = "node"
		}
		ch.MayTakeSecrets = who.Allows(identity.ScopeSecretUse, p.Name, name, false)
	}
	return ch
}

// policyWarnings puts the admission policies' warnings into Berth-Policy-Warning headers.
func (s *Server) policyWarnings(c echo.Context, warnings []string) {
	for _, w := range warnings {
		c.Response().Header().Add("Berth-Policy-Warning", w)
	}
}

// deployError maps an error of deploy.Apply onto the API's problems: the service errors of the
// catalog and the named refusals of the runtime spec; problems pass through.
func deployError(err error) error {
	var r *slots.Refusal
	if errors.As(err, &r) {
		return refusalError(err)
	}
	return serviceError(err)
}
