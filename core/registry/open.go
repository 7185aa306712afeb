package registry

import (
	"time"

	"github.com/berthhq/berth/core/store"
)

// OpenReleases is [NewReleases] over collection [ReleasesCollection] of st.
func OpenReleases(st *store.Store, now func() time.Time) *Releases {
	return NewReleases(st.Collection(ReleasesCollection), now)
}
