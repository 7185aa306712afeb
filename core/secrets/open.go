package secrets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/berthhq/berth/core/store"
)

// OpenStore loads the keyring file at path and returns the secret store of st over it. The keyring
// is generated (and logged) only while st holds no secret document: a keyring missing once
// secrets exist is an error wrapping [ErrKeyringMissing] (there is no keyless mode), as is an
// unsafe or malformed one, and one that does not hold a KEK some stored version is wrapped by
// ([ErrKeyringInvalid]).
func OpenStore(ctx context.Context, st *store.Store, path string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	exist, err := Any(ctx, st)
	if err != nil {
		return nil, err
	}
	kr, created, err := LoadOrCreateKeyring(path, !exist)
	if errors.Is(err, ErrKeyringMissing) {
		return nil, fmt.Errorf("berthd: the store holds secrets but the keyring %s is missing; restore it (or pass --keyring): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("berthd: %w", err)
	}
	if created {
		log.Info("secrets keyring created", "path", path, "kek_id", kr.ActiveKEK())
	}
	s := NewStore(st, kr, nil)
	counts, err := s.WrappedBy(ctx)
	if err != nil {
		return nil, err
	}
	for id, n := range counts {
		if !kr.Has(id) {
			return nil, fmt.Errorf("berthd: %d secret versions are wrapped by %s, which the keyring %s does not hold: %w", n, id, path, ErrKeyringInvalid)
		}
	}
	return s, nil
}
