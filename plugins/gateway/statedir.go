package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthhq/berth/internal/securefile"
)

// ownerFile names the gateway process that owns a state directory: a random
// token written by [WatchStateDir].
const ownerFile = "owner"

// WatchStateDir marks the state directory dir as this process's (a random
// token in dir/owner, 0600) and calls gone once, and returns, when the mark
// disappears or changes: dir was removed or replaced (a restore of berthd's
// data directory), or another gateway took it over. It checks every interval
// until ctx ends. A gateway outlives berthd but belongs to one data
// directory; without it no berthd will reattach to it, and it would hold the
// listen address against the gateway the next berthd launches
// (docs/plugins.md section 5.3). It fails at once when the mark cannot be
// written.
func WatchStateDir(ctx context.Context, dir string, interval time.Duration, gone func(reason string)) error {
	token := make([]byte, 16)
	_, _ = rand.Read(token) // never fails (crypto/rand)
	mark := []byte(hex.EncodeToString(token))
	path := filepath.Join(dir, ownerFile)
	if err := securefile.WriteFile(path, mark); err != nil {
		return fmt.Errorf("mark the state directory: %w", err)
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			raw, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(raw, mark) {
				gone("the state directory " + dir + " was removed, replaced or taken over by another gateway")
				return
			}
		}
	}()
	return nil
}
