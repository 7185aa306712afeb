package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/securefile"
)

// bindingWorkInterval is how often berthd's binding worker looks for due binding operations.
const bindingWorkInterval = time.Second

// corestoreStateDir is the corestore plugin's state directory under DataDir/plugins.
const corestoreStateDir = "corestore"

// startBindings launches the corestore plugin with the configuration file cfg.CorestoreConfig
// (JSON, 0600: it holds the servers' admin credentials, docs/bindings.md section 5) and returns
// the binding manager, whose worker the caller runs, and the plugin handle the caller closes.
// With no configuration file it returns nil: services with bindings are then refused.
func startBindings(ctx context.Context, cfg Config, st *store.Store, sec *secrets.Store, cat *services.Catalog, exec executorAccess,
	log *slog.Logger) (*bindings.Manager, *plugin.Provider, error) {
	if cfg.CorestoreConfig == "" {
		return nil, nil, nil
	}
	conf, err := securefile.ReadFile(cfg.CorestoreConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("corestore configuration: %w", err)
	}
	if conf, err = resolveConfigSecrets(ctx, conf, sec, cat); err != nil {
		return nil, nil, fmt.Errorf("corestore configuration %s: %w", cfg.CorestoreConfig, err)
	}
	if conf, err = exec.configure(ctx, conf); err != nil {
		return nil, nil, fmt.Errorf("corestore executor: %w", err)
	}
	entry, err := plugin.ResolveProvider(cfg.PluginDir, "corestore")
	if err != nil {
		return nil, nil, fmt.Errorf("corestore plugin: %w", err)
	}
	pdir := filepath.Join(cfg.DataDir, "plugins")
	pc := entry.Apply(plugin.Config{
		Args:   []string{"--state-dir", filepath.Join(pdir, corestoreStateDir)},
		PidDir: pdir,
		Logger: log,
	})
	pc.PluginConfig = conf // the file, not the catalog entry: it holds the admin credentials
	h, err := plugin.LaunchProvider(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("start corestore plugin: %w", err)
	}
	m := bindings.New(bindings.Config{
		Store: st, Queue: operations.NewQueue(st, operations.Config{}), Secrets: sec, Provider: h, Logger: log,
		OnReady: func(ctx context.Context, b *bindings.Binding) error { return publishBinding(ctx, cat, b) },
	})
	return m, h, nil
}

// corestoreExecutorNode is the runner node id of the corestore plugin's backup executor;
// berthd queues every backup, restore and drill operation for it (docs/backups.md section 2.1).
const corestoreExecutorNode = "corestore"

// executorAccess is how the corestore plugin's backup executor reaches this berthd: the
// runner registry that enrolls it, the API URL on loopback and the certificate pin.
type executorAccess struct {
	runners     *runners.Registry
	url         string
	fingerprint string
}

// configure adds the "executor" object to the plugin configuration raw (a JSON object),
// replacing any the operator's file had: a fresh one-time runner enrollment of
// [corestoreExecutorNode], valid for an hour, used only when the plugin holds no valid
// credential yet. The token travels only in this configuration (never argv or a log).
func (e executorAccess) configure(ctx context.Context, raw []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	token, _, err := e.runners.CreateEnrollment(ctx, corestoreExecutorNode, "local", time.Hour)
	if err != nil {
		return nil, err
	}
	doc["executor"] = map[string]any{"url": e.url, "fingerprint": e.fingerprint, "node_id": corestoreExecutorNode, "registration_token": token}
	return json.Marshal(doc)
}

// secretPrefix marks a configuration value taken from berthd's secrets: "secret:PROJECT/NAME"
// is the current version of secret NAME of project PROJECT (docs/bindings.md section 5).
const secretPrefix = "secret:"

// resolveConfigSecrets replaces every string value "secret:PROJECT/NAME" of the JSON object raw
// with the secret's current value, so admin credentials need not sit in the file. A missing
// project or secret is an error naming it; values are never logged.
func resolveConfigSecrets(ctx context.Context, raw []byte, sec *secrets.Store, cat *services.Catalog) ([]byte, error) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var walk func(v any) (any, error)
	walk = func(v any) (any, error) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[k] = r
			}
		case []any:
			for i, e := range x {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[i] = r
			}
		case string:
			ref, ok := strings.CutPrefix(x, secretPrefix)
			if !ok {
				return x, nil
			}
			project, name, ok := strings.Cut(ref, "/")
			if !ok {
				return nil, fmt.Errorf("%q: want secret:PROJECT/NAME", x)
			}
			p, err := cat.GetProject(ctx, project)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			s, v, err := sec.Resolve(ctx, p.ID, name, 0)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			val, err := sec.Open(s, v)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			return string(val), nil
		}
		return v, nil
	}
	doc, err := walk(doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// publishBinding adds the secret references of ready binding b to its service, with one
// compare-and-set carrying its change-log entry (retried on a concurrent write), so the next
// rollout delivers the credentials (the write carries its reconcile request). A service that is
// gone or no longer declares b is left alone.
func publishBinding(ctx context.Context, cat *services.Catalog, b *bindings.Binding) error {
	p, err := cat.GetProject(ctx, b.Project)
	if err != nil {
		return err
	}
	ctx = changelog.WithActor(ctx, changelog.Actor{Type: "system", ID: "corestore"})
	for range 5 {
		cur, err := cat.GetService(ctx, p, b.Service)
		if errors.Is(err, services.ErrServiceNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		declared := false
		for _, s := range cur.Bindings {
			declared = declared || s.Name == b.Name
		}
		if !declared || cur.Deleting {
			return nil
		}
		next := *cur
		next.Secrets, next.ResolvedSecrets = maps.Clone(cur.Secrets), maps.Clone(cur.ResolvedSecrets)
		if next.Secrets == nil {
			next.Secrets = map[string]secrets.Ref{}
		}
		if next.ResolvedSecrets == nil {
			next.ResolvedSecrets = map[string]secrets.Ref{}
		}
		maps.Copy(next.Secrets, b.Secrets)
		maps.Copy(next.ResolvedSecrets, b.Secrets)
		rev := cur.Revision
		_, _, err = cat.ApplyService(ctx, p, &next, &rev)
		if errors.Is(err, services.ErrRevisionConflict) {
			continue
		}
		return err
	}
	return fmt.Errorf("publish binding %s: %w", b.ID, services.ErrRevisionConflict)
}
