package policy

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// newTestDeps opens what an Engine under test stands on: the embedded store, a blob store under
// the test's directory and a wazero runtime with the shared compilation cache, closed at cleanup.
func newTestDeps(t *testing.T) (*store.Store, *bundles.Store, *hostwasm.Runtime) {
	t.Helper()
	st := storetest.Open(t)
	blobs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(context.Background(), hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return st, blobs, rt
}
