package server

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// openSecrets opens the secret store over the keyring cfg.Keyring, or the data directory's
// (secrets.OpenStore says when it is generated and what stops berthd).
func openSecrets(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) (*secrets.Store, error) {
	path := cfg.Keyring
	if path == "" {
		path = filepath.Join(cfg.DataDir, secrets.KeyringFile)
	}
	return secrets.OpenStore(ctx, st, path, log)
}
