package bundles

import (
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/store"
)

// Collection holds the bundle catalog: one document per bundle.
const Collection = "bundles"

// Open is [NewWithBlobs] over the bundle catalog in collection [Collection] of st.
func Open(st *store.Store, blobStore blobs.Store, spoolDir string, maxBytes int64) (*Store, error) {
	return NewWithBlobs(blobStore, spoolDir, st.Collection(Collection), maxBytes)
}
