package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/securefile"
)

// registryKeyFile holds the key that signs registry bearers and upload
// state (32 random bytes, 0600); replicas share it like the other keys.
const registryKeyFile = "registry-key"

func loadOrCreateRegistryKey(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, registryKeyFile)
	k, err := securefile.ReadFile(p)
	if err == nil && len(k) >= 32 {
		return k, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("registry key: %w", err)
	}
	k = make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	if err := securefile.WriteFile(p, k); err != nil {
		return nil, fmt.Errorf("registry key: %w", err)
	}
	return k, nil
}

// newRegistry builds /v2 over the blob store's configuration: the
// filesystem under DataDir/blobs/registry, or the S3 bucket.
// Pushes are recorded as releases in rel (reserved tags checked first).
func newRegistry(ctx context.Context, cfg Config, store blobs.Store, rel *registry.Releases, tokens *identity.Tokens, reg *nodes.Registry, log *slog.Logger, follow registry.FollowFunc) (*registry.Registry, error) {
	key, err := loadOrCreateRegistryKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	return registry.New(ctx, registry.Config{
		Authorize: rel.CheckPush,
		OnPush:    rel.RecordAndFollow(follow),
		TagDigest: rel.TagDigest,
		RootDir:   filepath.Join(cfg.DataDir, "blobs", "registry"),
		S3:        cfg.S3,
		Referrers: store,
		Key:       key,
		Tokens:    tokens,
		Logger:    log,
		Nodes: func(ctx context.Context, cred string) (string, error) {
			n, err := reg.Authenticate(ctx, cred)
			if err != nil {
				return "", err
			}
			return n.ID, nil
		},
		NodeCurrent: reg.CredentialCurrent,
		NodeImages: func(ctx context.Context, nodeID string) ([]string, error) {
			n, err := reg.Get(ctx, nodeID)
			if err != nil {
				return nil, err
			}
			if n.DesiredSpec == "" {
				return nil, nil
			}
			var spec node.Spec
			if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
				return nil, fmt.Errorf("decode desired state of %s: %w", nodeID, err)
			}
			var out []string
			for _, w := range spec.Workloads {
				if w.Image != "" {
					out = append(out, w.Image)
				}
			}
			return out, nil
		},
	})
}

// deployOnPush rolls the services that follow a pushed tag (deploy_on_push, docs/registry.md
// section 8) to "<registry host>/<repo>@<digest>", the write attributed to the pusher in the
// change log; each write carries its reconcile request, which wakes the reconciler.
func deployOnPush(cfg Config, cat *services.Catalog, log *slog.Logger) registry.FollowFunc {
	host := ""
	if u, err := url.Parse(cfg.PublicURL); err == nil {
		host = u.Host
	}
	return registry.DeployOnPush(host, func(ctx context.Context, repoTag, image string) error {
		out, err := cat.FollowTag(ctx, repoTag, image)
		for _, s := range out {
			log.Info("service follows pushed tag", "project", s.Project, "service", s.Name, "tag", repoTag, "image", s.Image, "revision", s.Revision)
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
