package storetest

import (
	"context"
	"os"
	"testing"

	"github.com/berthhq/berth/core/store"
)

// Open returns a store for a test: a database of its own on the MongoDB at
// BERTH_TEST_MONGO_URI when that is set (dropped at cleanup), otherwise the
// embedded store in a temporary directory (locked, closed at cleanup).
func Open(t testing.TB) *store.Store {
	t.Helper()
	ctx := context.Background()
	cfg := store.Config{}
	if uri := os.Getenv("BERTH_TEST_MONGO_URI"); uri != "" {
		cfg.URI = uri
		cfg.Database = "berth_test_" + sanitize(t.Name())
	} else {
		cfg.DataDir = t.TempDir()
		unlock, err := store.LockDir(cfg.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unlock() })
	}
	s, err := store.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if cfg.URI != "" {
			_ = s.DB().Drop(context.Background())
		}
		_ = s.Close(context.Background())
	})
	return s
}

func sanitize(name string) string {
	out := make([]byte, 0, len(name))
	for i := 0; i < len(name) && len(out) < 40; i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			out = append(out, c)
		} else {
			out = append(out, '_')
		}
	}
	return string(out)
}
