package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
)

// newRegistry builds /v2 over the blob store's configuration: the
// filesystem under DataDir/blobs/registry, or the S3 bucket.
// Pushes are recorded as releases in rel (reserved tags checked first).
func newRegistry(ctx context.Context, cfg Config, store blobs.Store, rel *registry.Releases, tokens *identity.Tokens, reg *nodes.Registry, log *slog.Logger, follow registry.FollowFunc) (*registry.Registry, error) {
	key, err := registry.LoadOrCreateKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	return registry.New(ctx, registry.Config{
		Authorize:   rel.CheckPush,
		OnPush:      rel.RecordAndFollow(follow),
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

// deployOnPush rolls the services that follow a pushed tag (deploy_on_push, docs/registry.md
// section 8) to "<registry host>/<repo>@<digest>", the write attributed to the pusher in the
// change log, and wakes the reconciler for each service written.
func deployOnPush(cfg Config, cat *services.Catalog, rec *reconciler.Reconciler, log *slog.Logger) registry.FollowFunc {
	host := ""
	if u, err := url.Parse(cfg.PublicURL); err == nil {
		host = u.Host
	}
	return registry.DeployOnPush(host, func(ctx context.Context, repoTag, image string) error {
		out, err := cat.FollowTag(ctx, repoTag, image)
		for _, s := range out {
			log.Info("service follows pushed tag", "project", s.Project, "service", s.Name, "tag", repoTag, "image", s.Image, "revision", s.Revision)
			rec.HintService("release.pushed", s.ID)
		}
		return err
	})
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
