package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
)

// newRegistry builds /v2 over the blob store's configuration: the
// filesystem under DataDir/blobs/registry, or the S3 bucket.
// Pushes are recorded as releases in rel (reserved tags checked first), each with the
// deploy-on-push follow it owes, which follows settles after the push is answered.
func newRegistry(ctx context.Context, cfg Config, store blobs.Store, rel *registry.Releases, follows *registry.FollowWorker, tokens *identity.Tokens, reg *nodes.Registry, log *slog.Logger) (*registry.Registry, error) {
	key, err := registry.LoadOrCreateKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	return registry.New(ctx, registry.Config{
		Authorize:   rel.CheckPush,
		OnPush:      follows.OnPush,
		TagDigest:   rel.TagDigest,
		RootDir:     filepath.Join(cfg.DataDir, "blobs", "registry"),
		S3:          cfg.S3,
		Referrers:   store,
		Key:         key,
		Tokens:      tokens,
		Logger:      log,
		Nodes:       reg.AuthenticateID,
		NodeCurrent: reg.CredentialCurrent,
		NodeImages:  reg.DesiredImages,
	})
}

// tagFollower is deploy on push's [registry.Follower]: it rolls the services that follow a
// pushed tag to "<registry host>/<repo>@<digest>" through the deployer (cause registry.push,
// admitted like any change; each write attributed to the pusher in the change log and carrying
// its reconcile request).
type tagFollower struct {
	host     string
	cat      *services.Catalog
	deployer func() *deploy.Deployer
	log      *slog.Logger
}

func newTagFollower(cfg Config, cat *services.Catalog, deployer func() *deploy.Deployer, log *slog.Logger) tagFollower {
	return tagFollower{host: publicHost(cfg.PublicURL), cat: cat, deployer: deployer, log: log}
}

// Follow implements [registry.Follower].
func (f tagFollower) Follow(ctx context.Context, req registry.FollowRequest) (registry.FollowResult, error) {
	repoTag, image := req.Repository+":"+req.Tag, f.host+"/"+req.Repository+"@"+req.Digest
	out, err := f.deployer().FollowTag(changelog.WithActor(ctx, req.Actor), repoTag, image)
	for _, s := range out {
		f.log.Info("service follows pushed tag", "project", s.Project, "service", s.Name, "tag", repoTag, "image", s.Image, "revision", s.Revision)
	}
	if err != nil {
		return registry.FollowResult{}, err
	}
	n, err := f.followers(ctx, repoTag)
	return registry.FollowResult{Followers: n}, err
}

// followers counts the services of the tag's project that follow it.
func (f tagFollower) followers(ctx context.Context, repoTag string) (int, error) {
	project, _, _ := strings.Cut(repoTag, "/")
	p, err := f.cat.GetProject(ctx, project)
	if errors.Is(err, services.ErrProjectNotFound) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	svcs, err := f.cat.Followers(ctx, p, repoTag)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range svcs {
		if !s.Deleting {
			n++
		}
	}
	return n, nil
}

// publicHost is the host (and port) of publicURL, "" when it has none.
func publicHost(publicURL string) string {
	if u, err := url.Parse(publicURL); err == nil {
		return u.Host
	}
	return ""
}

// withRegistry serves /v2/ (the OCI registry and its token endpoint) beside
// the API on one listener.
func withRegistry(api http.Handler, reg http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2" || strings.HasPrefix(r.URL.Path, "/v2/") {
			reg.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}
