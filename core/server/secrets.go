package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// openSecrets loads the keyring (cfg.Keyring, or the data directory's) and returns the secret
// store over it. The keyring is generated only while the store holds no secret document: a
// keyring missing once secrets exist stops berthd (there is no keyless mode), as does an unsafe
// or malformed one, and one that does not hold a KEK some stored version is wrapped by.
func openSecrets(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) (*secrets.Store, error) {
	path := cfg.Keyring
	if path == "" {
		path = filepath.Join(cfg.DataDir, secrets.KeyringFile)
	}
	exist, err := secrets.Any(ctx, st)
	if err != nil {
		return nil, err
	}
	kr, created, err := secrets.LoadOrCreateKeyring(path, !exist)
	if errors.Is(err, secrets.ErrKeyringMissing) {
		return nil, fmt.Errorf("berthd: the store holds secrets but the keyring %s is missing; restore it (or pass --keyring): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("berthd: %w", err)
	}
	if created {
		log.Info("secrets keyring created", "path", path, "kek_id", kr.ActiveKEK())
	}
	s := secrets.NewStore(st, kr, nil)
	counts, err := s.WrappedBy(ctx)
	if err != nil {
		return nil, err
	}
	for id, n := range counts {
		if !kr.Has(id) {
			return nil, fmt.Errorf("berthd: %d secret versions are wrapped by %s, which the keyring %s does not hold: %w", n, id, path, secrets.ErrKeyringInvalid)
		}
	}
	return s, nil
}
