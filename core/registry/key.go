package registry

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/berthhq/berth/internal/securefile"
)

// KeyFile holds the key that signs registry bearers and upload state (32 random bytes, 0600,
// in the data directory); replicas share it like the other keys.
const KeyFile = "registry-key"

// LoadOrCreateKey returns the registry key of dataDir, creating it at first start. A key file
// shorter than 32 bytes is replaced.
func LoadOrCreateKey(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, KeyFile)
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
