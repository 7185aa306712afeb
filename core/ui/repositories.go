package ui

import (
	"context"
	"net/http"

	"github.com/berthhq/berth/sdk/client"
)

// The registry page (docs/ui.md section 1): the repositories of Berth's registry that the API
// lists, which are the services' own (PROJECT/SERVICE, GET .../services/NAME/releases), each
// with its tags, the digest each names now and the digests it named before.

// repositoryReads is how many services the registry page reads the repository of per render;
// the rest are counted.
const repositoryReads = 100

// repository is one service's repository with its releases, newest first.
type repository struct {
	Service  client.Service
	Releases []client.ImageRelease
}

// registryData is what the registry page shows: the repositories that hold a release, and
// how many services were not read (beyond repositoryReads).
type registryData struct {
	Repositories []repository
	Unread       int
}

// loadRegistry reads the repository of every service the viewer may read through the API,
// keeping those with a release.
func loadRegistry(ctx context.Context, c *client.Client) (*registryData, error) {
	svcs, err := allServices(ctx, c)
	if err != nil {
		return nil, err
	}
	d := &registryData{}
	for i, s := range svcs {
		if i >= repositoryReads {
			d.Unread = len(svcs) - i
			break
		}
		rels, err := c.ListImageReleases(ctx, s.Project, s.Name)
		if apiStatus(err) == http.StatusNotFound {
			continue // no release store, or the service went away
		}
		if err != nil {
			return nil, err
		}
		if len(rels) > 0 {
			d.Repositories = append(d.Repositories, repository{Service: s, Releases: rels})
		}
	}
	return d, nil
}

func (h *Handler) registryPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "registry", "Registry", nil)
}
